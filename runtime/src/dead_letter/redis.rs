//! Dead letters in a Redis Stream (feature `redis`): they outlive the process, every worker
//! writes to one stream, and an operator lists, inspects, removes and redrives them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), jobguard::Error> {
//! use jobguard::dead_letter::redis::RedisDeadLetters;
//!
//! let letters = RedisDeadLetters::connect("redis://127.0.0.1:6379/", "jobguard:dead_letters").await?;
//! let runtime = jobguard::Runtime::builder().dead_letters(letters.clone()).build();
//! # drop(runtime);
//!
//! // Later, an operator:
//! for (id, letter) in letters.list().await? {
//!     match letter {
//!         Ok(letter) => println!(
//!             "{id}: {} key {:?} gave up ({}): {}",
//!             letter.job, letter.key, letter.reason, letter.error
//!         ),
//!         // Not a letter this build reads: say why, and remove it once it is dealt with.
//!         Err(why) => println!("{id}: {why}"),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Records
//!
//! Each letter is one stream entry, written with `XADD <stream> * letter <json>`: a single field
//! `letter` whose value is the letter's record ([`encode`]): the [`DeadLetter`] as a JSON object
//! with one more member, `"v"`, the format version ([`FORMAT_VERSION`]). In the same round trip,
//! `XTRIM <stream> MAXLEN ~ <max_len>` trims the oldest entries once the stream is well past
//! [`max_len`](RedisDeadLetters::max_len) (Redis trims whole nodes, so the stream may hold
//! somewhat more); the entries it gives up are logged with their count and counted as dropped. A letter its sink could not take is logged as that same record (see
//! [Lost letters](super#lost-letters)), so it can be `XADD`ed back as it is.
//!
//! An entry that is not such a record (no `letter` field, not JSON, not a letter, another format
//! version) is *corrupt*. [`list`](RedisDeadLetters::list) still lists it, in its place, as an
//! [`Error::Corrupt`] naming its id, the stream and why, beside the letters it reads; no entry
//! is skipped. [`get`](RedisDeadLetters::get) and [`redrive`](RedisDeadLetters::redrive) of it
//! fail with that error (the redrive without running the job), [`len`](RedisDeadLetters::len)
//! counts it, and [`remove`](RedisDeadLetters::remove) removes it. A server that cannot be
//! reached is [`Error::Store`].
//!
//! # Redis Cluster
//!
//! [`connect_cluster`](RedisDeadLetters::connect_cluster) takes seed nodes, as
//! [`RedisStore::connect_cluster`] does. A stream is one key, so it lives in one slot, on one
//! master (and its replica): every letter of a stream goes there, whatever the cluster's size.
//! Use one stream per job or per queue to spread them.
//!
//! # Redrive
//!
//! [`redrive`](RedisDeadLetters::redrive) reads a letter, hands it to a closure that runs the job
//! again (usually from its [`payload`](DeadLetter::payload) and [`key`](DeadLetter::key)), and
//! removes the letter only when the closure succeeds. A redriven job keeps its idempotency key,
//! so if two operators redrive one letter at once, or the removal fails after the job ran, the
//! second run is a replay, not a second charge. A poison job's key (a `crashed` letter) is
//! refused for its TTL; the redrive forgives it once, so the job runs (see
//! [`idempotency`](crate::idempotency#forgiving-a-key)).

use super::{Browse, BrowseFuture, DeadLetter, DeadLetterSink, Filter, Page, SinkFuture};
use crate::Error;
use crate::store::redis::{RedisConnection, RedisStore};
use ::redis::Value;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

pub use super::{FORMAT_VERSION, decode, encode};

/// The stream field that holds a letter's JSON.
pub const FIELD: &str = "letter";

/// Entries read per `XRANGE` when listing.
const PAGE: usize = 500;

/// Raw stream entries: the id, and the `letter` field's bytes when the entry has one.
type Entries = Vec<(String, Option<Vec<u8>>)>;

/// Dead letters in a Redis Stream. `Clone` shares the connection.
#[derive(Clone)]
pub struct RedisDeadLetters {
    connection: RedisConnection,
    stream: Arc<str>,
    max_len: usize,
}

impl fmt::Debug for RedisDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLetters")
            .field("stream", &self.stream)
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

pub use super::RedriveError;

impl RedisDeadLetters {
    /// The stream length [`new`](Self::new) and [`connect`](Self::connect) trim to.
    pub const DEFAULT_MAX_LEN: usize = 10_000;

    /// Connects to the server at `url` (`redis://[user:password@]host[:port][/db]`, or
    /// `rediss://` for TLS) with the timeouts of [`RedisStore::default_config`], and keeps
    /// letters in the stream `stream_key`.
    ///
    /// A malformed URL or an unreachable server is [`Error::Store`].
    pub async fn connect(url: &str, stream_key: impl Into<String>) -> Result<Self, Error> {
        let connection = RedisConnection::connect(url, RedisStore::default_config()).await?;
        Ok(Self::new(connection, stream_key))
    }

    /// Connects to a Redis Cluster through its seed `nodes` with the settings of
    /// [`RedisStore::cluster_builder`], and keeps letters in the stream `stream_key`.
    ///
    /// A stream is one key, so it lives in one slot on one master: every letter goes to that
    /// node, and while it is down (until its replica is promoted) [`add`](Self::add) and the
    /// others fail with [`Error::Store`]. Spread letters over the masters with one stream per
    /// job or per queue, if need be.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), jobguard::Error> {
    /// use jobguard::RedisDeadLetters;
    ///
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let letters = RedisDeadLetters::connect_cluster(&nodes, "jobguard:dead_letters").await?;
    /// # drop(letters);
    /// # Ok(()) }
    /// ```
    ///
    /// No seed node, a malformed URL, or no reachable node is [`Error::Store`].
    pub async fn connect_cluster<I>(nodes: I, stream_key: impl Into<String>) -> Result<Self, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let connection =
            RedisConnection::connect_cluster(RedisStore::cluster_builder(nodes)).await?;
        Ok(Self::new(connection, stream_key))
    }

    /// Letters in the stream `stream_key`, on a connection the caller built: a connection
    /// manager, a cluster connection, or a store's
    /// [`RedisStore::connection`] to share one connection with the idempotency store.
    pub fn new(connection: impl Into<RedisConnection>, stream_key: impl Into<String>) -> Self {
        RedisDeadLetters {
            connection: connection.into(),
            stream: stream_key.into().into(),
            max_len: Self::DEFAULT_MAX_LEN,
        }
    }

    /// Trims the stream to about `max_len` letters (at least 1) as new ones arrive. The oldest
    /// letters go first, and each trim is said: a warning with how many went, and
    /// `jobguard_dead_letters_dropped_total{sink="redis"}` (feature `metrics`).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len.max(1);
        self
    }

    /// The stream's key.
    pub fn stream_key(&self) -> &str {
        &self.stream
    }

    /// Appends one letter and returns its entry id.
    pub async fn add(&self, letter: &DeadLetter) -> Result<String, Error> {
        // The trim is its own command in the same round trip, so that the letters it gives up
        // are counted and said (`XADD ... MAXLEN` trims without telling how many). Each reply is
        // read on its own: a letter the stream took is never reported lost because the trim
        // after it failed (an ACL without `xtrim`, say).
        let replies: Vec<::redis::RedisResult<Value>> = ::redis::pipe()
            .ignore_errors()
            .cmd("XADD")
            .arg(&*self.stream)
            .arg("*")
            .arg(FIELD)
            .arg(encode(letter))
            .cmd("XTRIM")
            .arg(&*self.stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.max_len)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.store_error("XADD", &e))?;
        let mut replies = replies.into_iter();
        let reply = match replies.next() {
            Some(reply) => reply.map_err(|e| self.store_error("XADD", &e))?,
            None => {
                return Err(Error::Store(format!(
                    "dead-letter stream {}: no reply to XADD",
                    self.stream
                )));
            }
        };
        match replies.next() {
            Some(Ok(Value::Int(trimmed))) if trimmed > 0 => self.trimmed(trimmed.unsigned_abs()),
            Some(Ok(_)) => {}
            Some(Err(e)) => self.untrimmed(&e),
            None => self.untrimmed(&"no reply"),
        }
        text(&reply).ok_or_else(|| Error::Store(format!("unexpected reply to XADD: {reply:?}")))
    }

    /// Says that the stream took a letter but could not be trimmed to its bound, so it grows.
    #[cold]
    fn untrimmed(&self, error: &dyn std::fmt::Display) {
        crate::observe::log_warn(format_args!(
            "jobguard: dead-letter stream {} took the letter, but XTRIM failed: {error}; the \
             stream grows past its bound of {} until it can be trimmed (the connection's user \
             needs the xtrim command)",
            self.stream, self.max_len
        ));
    }

    /// Says that the stream gave up its `count` oldest letters to stay near its bound: a warning
    /// and `jobguard_dead_letters_dropped_total{sink="redis"}`. Their contents are gone, so the
    /// warning says how to keep more.
    #[cold]
    fn trimmed(&self, count: u64) {
        crate::observe::log_warn(format_args!(
            "jobguard: dead-letter stream {} gave up its {count} oldest letter(s) to stay near its \
             bound of {} (MAXLEN ~): raise RedisDeadLetters::max_len, or redrive and remove \
             letters sooner",
            self.stream, self.max_len
        ));
        #[cfg(feature = "metrics")]
        crate::observe::metrics::dead_letters_dropped("redis", count);
    }

    /// Every entry, oldest first: its id, and its letter, or for an entry that is not a letter
    /// (a corrupt one: see [Records](self#records)) [`Error::Corrupt`] naming the id, the
    /// stream and why. A corrupt entry neither hides the letters after it nor is skipped: it is
    /// listed in its place, for the caller to report and [`remove`](Self::remove) by its id.
    /// `Err` as a whole only when the stream cannot be read ([`Error::Store`]).
    ///
    /// ```no_run
    /// # async fn demo(letters: jobguard::RedisDeadLetters) -> Result<(), jobguard::Error> {
    /// for (id, letter) in letters.list().await? {
    ///     let letter = match letter {
    ///         Ok(letter) => letter,
    ///         Err(corrupt) => {
    ///             eprintln!("{corrupt}"); // e.g. kept aside, then `letters.remove(&id)`
    ///             continue;
    ///         }
    ///     };
    ///     println!("{id}: {} gave up ({})", letter.job, letter.reason);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list(&self) -> Result<Vec<(String, Result<DeadLetter, Error>)>, Error> {
        let mut letters = Vec::new();
        let mut start = "-".to_owned();
        loop {
            let page = self.range(&start, "+", PAGE).await?;
            let full = page.len() == PAGE;
            let Some(after) = page.last().map(|(id, _)| next_id(id)) else {
                break;
            };
            for (id, record) in page {
                let letter = self.decode_entry(&id, record);
                letters.push((id, letter));
            }
            match after {
                Some(after) if full => start = after,
                _ => break,
            }
        }
        Ok(letters)
    }

    /// How many entries the stream holds: its letters, and any corrupt entry
    /// ([`list`](Self::list) lists both).
    pub async fn len(&self) -> Result<usize, Error> {
        ::redis::cmd("XLEN")
            .arg(&*self.stream)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.store_error("XLEN", &e))
    }

    /// `true` when the stream holds no letter.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The letter with entry id `id`, or `None` when there is none. A corrupt entry is
    /// [`Error::Corrupt`] naming the id, the stream and why.
    pub async fn get(&self, id: &str) -> Result<Option<DeadLetter>, Error> {
        let mut page = self.range(id, id, 1).await?;
        match page.pop() {
            Some((found, record)) => self.decode_entry(&found, record).map(Some),
            None => Ok(None),
        }
    }

    /// Removes the entry `id`, letter or not: `true` when there was one.
    pub async fn remove(&self, id: &str) -> Result<bool, Error> {
        let removed: u64 = ::redis::cmd("XDEL")
            .arg(&*self.stream)
            .arg(id)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.store_error("XDEL", &e))?;
        Ok(removed > 0)
    }

    /// Runs `job` on the letter `id` and removes the letter only when `job` succeeds.
    ///
    /// `Ok(true)`: redriven and removed. `Ok(false)`: there is no letter `id`, and `job` did not
    /// run. `Err(RedriveError::Job(e))`: `job` failed and the letter is kept for another try.
    /// The letter's job giving up again inside `job` (its name and key) writes no letter of its
    /// own (and raises no `DeadLetter` event): the redriven letter still stands for it, so each
    /// failed redrive leaves the stream as it was. Other jobs `job` runs write theirs as ever,
    /// and so does the letter's job when `job` spawns it on a task of its own.
    ///
    /// The letter's job finding its key poisoned inside `job` (a `crashed` letter: the key is
    /// refused for its TTL) forgives the key once ([`Store::forgive`](crate::Store::forgive))
    /// and claims it again, so that the redrive runs it; see
    /// [`idempotency`](crate::idempotency#forgiving-a-key).
    ///
    /// ```no_run
    /// # async fn demo(letters: jobguard::dead_letter::redis::RedisDeadLetters, id: &str) {
    /// async fn charge(order_id: &str, key: &str) -> Result<(), std::io::Error> {
    ///     # let _ = (order_id, key);
    ///     Ok(())
    /// }
    ///
    /// let redriven = letters
    ///     .redrive(id, |letter| async move {
    ///         let (order_id,): (String,) = letter.payload_as().expect("payload")?;
    ///         charge(&order_id, letter.key.as_deref().unwrap_or_default()).await
    ///     })
    ///     .await;
    /// # drop(redriven);
    /// # }
    /// ```
    pub async fn redrive<F, Fut, T, E>(&self, id: &str, job: F) -> Result<bool, RedriveError<E>>
    where
        F: FnOnce(DeadLetter) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let Some(letter) = self.get(id).await.map_err(RedriveError::Store)? else {
            return Ok(false);
        };
        let (job_name, key) = (letter.job.clone(), letter.key.clone());
        let reason = letter.reason;
        crate::dead_letter::redriving(job_name, key, reason, job(letter))
            .await
            .map_err(RedriveError::Job)?;
        self.remove(id).await.map_err(RedriveError::Store)?;
        Ok(true)
    }

    /// Up to `count` raw entries with ids in `[start, end]`: `(id, letter field or None)`.
    async fn range(&self, start: &str, end: &str, count: usize) -> Result<Entries, Error> {
        let reply: Value = ::redis::cmd("XRANGE")
            .arg(&*self.stream)
            .arg(start)
            .arg(end)
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.store_error("XRANGE", &e))?;
        parse_range(reply).map_err(|why| Error::Store(format!("unexpected reply to XRANGE: {why}")))
    }

    fn decode_entry(&self, id: &str, record: Option<Vec<u8>>) -> Result<DeadLetter, Error> {
        let corrupt = |why: String| {
            Error::Corrupt(format!("dead letter {id} in stream {}: {why}", self.stream))
        };
        let record = record.ok_or_else(|| corrupt(format!("no `{FIELD}` field")))?;
        decode(&record).map_err(|e| match e {
            Error::Corrupt(why) => corrupt(why),
            other => other,
        })
    }

    fn store_error(&self, command: &str, e: &::redis::RedisError) -> Error {
        Error::Store(format!(
            "dead-letter stream {}: {command} failed: {e}",
            self.stream
        ))
    }
}

/// Entries read per `XREVRANGE` while a filter looks for matches, and per `XRANGE` while it
/// counts them.
const SCAN: usize = 1000;

/// A stream has no index but its ids: a filtered page reads the stream newest first, 1,000
/// entries at a time, and decodes and tests each, until the page is full (a filter that matches
/// rarely reads far); a filtered count reads it all. The empty filter reads only the page
/// (`XREVRANGE ... COUNT limit + 1`) and counts with `XLEN`.
impl Browse for RedisDeadLetters {
    fn page<'a>(
        &'a self,
        filter: &'a Filter,
        before: Option<&'a str>,
        limit: usize,
    ) -> BrowseFuture<'a, Page> {
        Box::pin(async move {
            let mut end = match before {
                None => "+".to_owned(),
                Some(id) => match prev_id(id) {
                    Some(end) => end,
                    None => {
                        return Ok(Page {
                            entries: Vec::new(),
                            next: None,
                        });
                    }
                },
            };
            let batch = if filter.is_empty() {
                limit + 1
            } else {
                SCAN.max(limit + 1)
            };
            let mut entries = Vec::new();
            loop {
                let raw = self.rev_range(&end, batch).await?;
                let exhausted = raw.len() < batch;
                let last = raw.last().map(|(id, _)| id.clone());
                for (id, record) in raw {
                    let entry = self.decode_entry(&id, record);
                    if filter.matches_entry(&entry) {
                        entries.push((id, entry));
                        if entries.len() > limit {
                            entries.truncate(limit);
                            let next = entries.last().map(|(id, _)| id.clone());
                            return Ok(Page { entries, next });
                        }
                    }
                }
                match last.as_deref().and_then(prev_id) {
                    Some(before_last) if !exhausted => end = before_last,
                    _ => {
                        return Ok(Page {
                            entries,
                            next: None,
                        });
                    }
                }
            }
        })
    }

    fn count<'a>(&'a self, filter: &'a Filter) -> BrowseFuture<'a, u64> {
        Box::pin(async move {
            if filter.is_empty() {
                return Ok(self.len().await? as u64);
            }
            let (mut start, mut n) = ("-".to_owned(), 0u64);
            loop {
                let raw = self.range(&start, "+", SCAN).await?;
                let full = raw.len() == SCAN;
                let after = raw.last().and_then(|(id, _)| next_id(id));
                for (id, record) in raw {
                    if filter.matches_entry(&self.decode_entry(&id, record)) {
                        n += 1;
                    }
                }
                match after {
                    Some(after) if full => start = after,
                    _ => return Ok(n),
                }
            }
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, Option<Result<DeadLetter, Error>>> {
        Box::pin(async move {
            if !is_stream_id(id) {
                return Ok(None);
            }
            let mut page = self.range(id, id, 1).await?;
            Ok(page
                .pop()
                .map(|(found, record)| self.decode_entry(&found, record)))
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, bool> {
        Box::pin(async move {
            if !is_stream_id(id) {
                return Ok(false);
            }
            RedisDeadLetters::remove(self, id).await
        })
    }

    fn is_id(&self, id: &str) -> bool {
        is_stream_id(id)
    }
}

impl RedisDeadLetters {
    /// Up to `count` raw entries with ids at most `end`, newest first.
    async fn rev_range(&self, end: &str, count: usize) -> Result<Entries, Error> {
        let reply: Value = ::redis::cmd("XREVRANGE")
            .arg(&*self.stream)
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.store_error("XREVRANGE", &e))?;
        parse_range(reply)
            .map_err(|why| Error::Store(format!("unexpected reply to XREVRANGE: {why}")))
    }
}

/// `ms-seq`, two decimal numbers of at most 64 bits: a stream entry id.
fn is_stream_id(id: &str) -> bool {
    let number = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u64>().is_ok()
    };
    id.split_once('-')
        .is_some_and(|(ms, seq)| number(ms) && number(seq))
}

/// The id right before `id`; `None` when `id` is not an entry id or is `0-0`.
fn prev_id(id: &str) -> Option<String> {
    if !is_stream_id(id) {
        return None;
    }
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    match seq.checked_sub(1) {
        Some(seq) => Some(format!("{ms}-{seq}")),
        None => Some(format!("{}-{}", ms.checked_sub(1)?, u64::MAX)),
    }
}

impl DeadLetterSink for RedisDeadLetters {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        Box::pin(async move { self.add(&letter).await.map(drop) })
    }
}

/// The id right after `id` (`ms-seq` → `ms-(seq+1)`), to page through `XRANGE` on any Redis
/// version; `None` when `id` is not an entry id or is the last possible one.
fn next_id(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    match seq.checked_add(1) {
        Some(seq) => Some(format!("{ms}-{seq}")),
        None => Some(format!("{}-0", ms.checked_add(1)?)),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `XRANGE`'s reply: `[[id, [field, value, ...]], ...]` (RESP2) or the same with a map of
/// fields (RESP3).
fn parse_range(reply: Value) -> Result<Entries, String> {
    let Value::Array(entries) = reply else {
        return Err(format!("{reply:?}"));
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(parts) = entry else {
                return Err(format!("entry {entry:?}"));
            };
            let mut parts = parts.into_iter();
            let id = parts
                .next()
                .as_ref()
                .and_then(text)
                .ok_or("entry without an id")?;
            let pairs: Vec<(Value, Value)> = match parts.next() {
                Some(Value::Array(flat)) => {
                    let mut flat = flat.into_iter();
                    let mut pairs = Vec::new();
                    while let (Some(k), Some(v)) = (flat.next(), flat.next()) {
                        pairs.push((k, v));
                    }
                    pairs
                }
                Some(Value::Map(pairs)) => pairs,
                Some(Value::Nil) | None => Vec::new(),
                Some(other) => return Err(format!("fields {other:?}")),
            };
            let letter = pairs.into_iter().find_map(|(k, v)| match (text(&k), v) {
                (Some(k), Value::BulkString(bytes)) if k == FIELD => Some(bytes),
                (Some(k), Value::SimpleString(s)) if k == FIELD => Some(s.into_bytes()),
                _ => None,
            });
            Ok((id, letter))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_go_back_within_and_across_milliseconds() {
        assert_eq!(prev_id("5-1").as_deref(), Some("5-0"));
        assert_eq!(prev_id("5-0"), Some(format!("4-{}", u64::MAX)));
        assert_eq!(prev_id("0-0"), None);
        assert_eq!(prev_id("5"), None);
        assert!(!is_stream_id("5-"));
        assert!(!is_stream_id("a-1"));
    }

    #[test]
    fn ids_advance_within_and_across_milliseconds() {
        assert_eq!(next_id("5-0").as_deref(), Some("5-1"));
        assert_eq!(next_id(&format!("5-{}", u64::MAX)).as_deref(), Some("6-0"));
        assert_eq!(next_id("nope"), None);
    }

    #[test]
    fn replies_parse_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![bulk("other"), bulk("x"), bulk(FIELD), bulk("{}")]),
        ])]);
        assert_eq!(
            parse_range(resp2).unwrap(),
            [("1-0".into(), Some(b"{}".to_vec()))]
        );
        let resp3 = Value::Array(vec![Value::Array(vec![
            bulk("2-0"),
            Value::Map(vec![(bulk("other"), bulk("x"))]),
        ])]);
        assert_eq!(parse_range(resp3).unwrap(), [("2-0".into(), None)]);
        assert!(parse_range(Value::Int(3)).is_err());
    }
}
