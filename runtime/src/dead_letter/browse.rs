//! Browsing the letters a sink keeps: one trait over the sinks that keep them where an operator
//! can page through them (memory, a Redis stream, a Postgres table), for the console and for
//! scripts of your own.

use super::{DeadLetter, GiveUp, LogDeadLetters, MemoryDeadLetters};
use crate::Error;
use std::future::Future;
use std::pin::Pin;

/// The boxed future a [`Browse`] method returns.
pub type BrowseFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// Which letters to show: every field given must match. The empty filter (the default)
/// matches every letter, and is the only one that matches an entry that does not decode
/// (a *corrupt* one), which has no job, key or reason to match.
///
/// ```
/// use jobguard::dead_letter::Filter;
/// use jobguard::{DeadLetter, GiveUp};
/// use std::time::SystemTime;
///
/// let now = SystemTime::now();
/// let letter = DeadLetter::new("payments.charge", Some("k-1".into()), GiveUp::Exhausted, 5, "gateway Timeout", now, now);
/// let filter = Filter::new().job("payments.charge").text("timeout");
/// assert!(filter.matches(&letter));
/// assert!(!Filter::new().reason(GiveUp::Crashed).matches(&letter));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filter {
    /// The job's name, exactly.
    pub job: Option<String>,
    /// Why it gave up.
    pub reason: Option<GiveUp>,
    /// The idempotency key, exactly.
    pub key: Option<String>,
    /// Text the error contains, in any case (`timeout` finds `Timeout`).
    pub text: Option<String>,
}

impl Filter {
    /// The empty filter: every letter matches.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only letters of this job.
    pub fn job(mut self, job: impl Into<String>) -> Self {
        self.job = Some(job.into());
        self
    }

    /// Only letters that gave up for this reason.
    pub fn reason(mut self, reason: GiveUp) -> Self {
        self.reason = Some(reason);
        self
    }

    /// Only letters of this idempotency key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only letters whose error contains this text, in any case.
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    /// `true` when no field is given: every letter matches.
    pub fn is_empty(&self) -> bool {
        self.job.is_none() && self.reason.is_none() && self.key.is_none() && self.text.is_none()
    }

    /// Whether `letter` matches every field given.
    pub fn matches(&self, letter: &DeadLetter) -> bool {
        self.job.as_ref().is_none_or(|job| *job == letter.job)
            && self.reason.is_none_or(|reason| reason == letter.reason)
            && self
                .key
                .as_ref()
                .is_none_or(|key| letter.key.as_ref() == Some(key))
            && self
                .text
                .as_ref()
                .is_none_or(|text| contains_ignoring_case(&letter.error, text))
    }

    /// Whether an entry, a letter or a corrupt one, matches.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn matches_entry(&self, entry: &Result<DeadLetter, Error>) -> bool {
        match entry {
            Ok(letter) => self.matches(letter),
            Err(_) => self.is_empty(),
        }
    }
}

/// `haystack` contains `needle`, case folded (Unicode lowercase); the empty needle is in
/// everything.
pub(crate) fn contains_ignoring_case(haystack: &str, needle: &str) -> bool {
    haystack.to_lowercase().contains(&needle.to_lowercase())
}

/// One page of letters, newest first ([`Browse::page`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct Page {
    /// Each entry's id, and its letter, or [`Error::Corrupt`] saying why it is not one.
    pub entries: Vec<(String, Result<DeadLetter, Error>)>,
    /// The cursor of the next page (older letters), or `None` when this page is the last.
    pub next: Option<String>,
}

/// A sink whose letters an operator can page through, inspect and remove: implemented by
/// [`MemoryDeadLetters`], [`LogDeadLetters`] (the letters it keeps), [`RedisDeadLetters`](super::redis::RedisDeadLetters) (feature
/// `redis`) and [`PgDeadLetters`](super::postgres::PgDeadLetters) (feature `postgres`). The
/// console works over any of them.
///
/// Ids are strings the sink makes (a stream entry id, a row number); a cursor is the id of the
/// last entry of the page before. An id the sink could not have made is not one of its ids:
/// [`is_id`](Browse::is_id) tells, and [`get`](Browse::get) and [`remove`](Browse::remove)
/// find nothing for it.
///
/// ```
/// # async fn demo() -> Result<(), jobguard::Error> {
/// use jobguard::dead_letter::{Browse, Filter};
/// use jobguard::MemoryDeadLetters;
///
/// let letters = MemoryDeadLetters::new();
/// let page = letters.page(&Filter::default(), None, 50).await?;
/// assert!(page.entries.is_empty() && page.next.is_none());
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
/// ```
pub trait Browse: Send + Sync {
    /// Up to `limit` entries that match `filter`, newest first, older than the entry
    /// `before` (a cursor: the `next` of the page before), or from the newest when `None`.
    /// A corrupt entry is listed in its place (see [`Filter`]). `before` must be one of this
    /// sink's ids ([`is_id`](Browse::is_id)); it need not still be held.
    fn page<'a>(
        &'a self,
        filter: &'a Filter,
        before: Option<&'a str>,
        limit: usize,
    ) -> BrowseFuture<'a, Page>;

    /// How many entries match `filter` now.
    fn count<'a>(&'a self, filter: &'a Filter) -> BrowseFuture<'a, u64>;

    /// The entry `id`: `None` when there is none, `Some(Err(Error::Corrupt))` when it is not a
    /// letter this build reads.
    fn get<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, Option<Result<DeadLetter, Error>>>;

    /// Removes the entry `id`, letter or not: `true` when there was one.
    fn remove<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, bool>;

    /// Whether `id` has the form of this sink's ids (and may be used as a cursor).
    fn is_id(&self, id: &str) -> bool;
}

impl<B: Browse + ?Sized> Browse for std::sync::Arc<B> {
    fn page<'a>(
        &'a self,
        filter: &'a Filter,
        before: Option<&'a str>,
        limit: usize,
    ) -> BrowseFuture<'a, Page> {
        (**self).page(filter, before, limit)
    }
    fn count<'a>(&'a self, filter: &'a Filter) -> BrowseFuture<'a, u64> {
        (**self).count(filter)
    }
    fn get<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, Option<Result<DeadLetter, Error>>> {
        (**self).get(id)
    }
    fn remove<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, bool> {
        (**self).remove(id)
    }
    fn is_id(&self, id: &str) -> bool {
        (**self).is_id(id)
    }
}

/// A number id of the memory sink or the Postgres table: decimal digits, no sign, no leading
/// zero, within `i64`.
pub(crate) fn number_id(id: &str) -> Option<u64> {
    let ok = !id.is_empty()
        && id.len() <= 19
        && id.bytes().all(|b| b.is_ascii_digit())
        && !(id.len() > 1 && id.starts_with('0'));
    ok.then(|| id.parse::<u64>().ok())
        .flatten()
        .filter(|n| i64::try_from(*n).is_ok())
}

/// Ids are the order letters came in, from 1.
impl Browse for MemoryDeadLetters {
    fn page<'a>(
        &'a self,
        filter: &'a Filter,
        before: Option<&'a str>,
        limit: usize,
    ) -> BrowseFuture<'a, Page> {
        let before = before.and_then(number_id).unwrap_or(u64::MAX);
        let letters = self.lock();
        let mut entries = Vec::new();
        let mut next = None;
        for (id, letter) in letters.iter().rev().filter(|(id, _)| *id < before) {
            if !filter.matches(letter) {
                continue;
            }
            if entries.len() == limit {
                next = entries.last().map(|(id, _): &(String, _)| id.clone());
                break;
            }
            entries.push((id.to_string(), Ok(letter.clone())));
        }
        drop(letters);
        Box::pin(std::future::ready(Ok(Page { entries, next })))
    }

    fn count<'a>(&'a self, filter: &'a Filter) -> BrowseFuture<'a, u64> {
        let n = self
            .lock()
            .iter()
            .filter(|(_, l)| filter.matches(l))
            .count();
        Box::pin(std::future::ready(Ok(n as u64)))
    }

    fn get<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, Option<Result<DeadLetter, Error>>> {
        let found = number_id(id).and_then(|id| {
            let letters = self.lock();
            let at = letters.binary_search_by_key(&id, |(i, _)| *i).ok()?;
            Some(Ok(letters[at].1.clone()))
        });
        Box::pin(std::future::ready(Ok(found)))
    }

    fn remove<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, bool> {
        let removed = number_id(id).is_some_and(|id| {
            let mut letters = self.lock();
            match letters.binary_search_by_key(&id, |(i, _)| *i) {
                Ok(at) => letters.remove(at).is_some(),
                Err(_) => false,
            }
        });
        Box::pin(std::future::ready(Ok(removed)))
    }

    fn is_id(&self, id: &str) -> bool {
        number_id(id).is_some()
    }
}

/// The letters it keeps ([`LogDeadLetters::kept`]); the log has them all.
impl Browse for LogDeadLetters {
    fn page<'a>(
        &'a self,
        filter: &'a Filter,
        before: Option<&'a str>,
        limit: usize,
    ) -> BrowseFuture<'a, Page> {
        self.kept().page(filter, before, limit)
    }
    fn count<'a>(&'a self, filter: &'a Filter) -> BrowseFuture<'a, u64> {
        self.kept().count(filter)
    }
    fn get<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, Option<Result<DeadLetter, Error>>> {
        self.kept().get(id)
    }
    fn remove<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, bool> {
        self.kept().remove(id)
    }
    fn is_id(&self, id: &str) -> bool {
        self.kept().is_id(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn letter(job: &str, error: &str) -> DeadLetter {
        let now = SystemTime::now();
        DeadLetter::new(job, None, GiveUp::Exhausted, 1, error, now, now)
    }

    #[test]
    fn number_ids_are_canonical() {
        assert_eq!(number_id("1"), Some(1));
        for bad in [
            "",
            "01",
            "-1",
            "+1",
            "1a",
            "99999999999999999999",
            "9223372036854775808",
        ] {
            assert_eq!(number_id(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn memory_pages_newest_first_with_a_cursor() {
        let letters = MemoryDeadLetters::new();
        for i in 0..7 {
            let job = if i % 2 == 0 { "even" } else { "odd" };
            letters.push(letter(job, &format!("error {i}")));
        }
        let even = Filter::new().job("even");
        let first = letters.page(&even, None, 2).await.unwrap();
        let ids: Vec<_> = first.entries.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["7", "5"]);
        assert_eq!(first.next.as_deref(), Some("5"));
        let second = letters.page(&even, Some("5"), 2).await.unwrap();
        let ids: Vec<_> = second.entries.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["3", "1"]);
        assert_eq!(second.next, None);
        assert_eq!(letters.count(&even).await.unwrap(), 4);
        assert!(letters.remove("3").await.unwrap());
        assert!(letters.get("3").await.unwrap().is_none());
        assert!(letters.get("2").await.unwrap().unwrap().is_ok());
    }
}
