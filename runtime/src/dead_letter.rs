//! Dead letters: the record of a job that gave up, and the sinks that keep them.
//!
//! | sink | keeps letters | notes |
//! |---|---|---|
//! | [`LogDeadLetters`] | in memory, bounded | the default: logs each letter whole, as its record, at error level (`tracing` with that feature, else stderr) |
//! | [`MemoryDeadLetters`] | in memory, bounded | drops the oldest at capacity, counts and reports the drop |
//! | [`from_fn`] | wherever the closure puts them | a queue, a table, a channel |
//! | [`redis::RedisDeadLetters`] (feature `redis`) | a Redis Stream | outlives the process; `list`, `get`, `remove`, `redrive` |
//!
//! # Records
//!
//! A letter written anywhere outside the process (a Redis stream entry, the log line of a lost
//! letter, of a letter dropped at capacity, or of [`LogDeadLetters`]) is a *record*: the [`DeadLetter`] as a JSON object with
//! one more member, `"v"`, the format version ([`FORMAT_VERSION`]). [`encode`] writes one,
//! [`decode`] reads one back (as [`RedisDeadLetters::list`](redis::RedisDeadLetters::list) and
//! `get` do), and [`from_log`] finds one at the end of a log line.
//!
//! # Lost letters
//!
//! A letter its sink refuses (the sink's `send` returns an error: Redis down, a closure's error)
//! is not dropped in silence. The retry engine and the idempotency guard write it to the log at
//! error level, whole, as its record at the end of the line:
//!
//! ```text
//! jobguard: job payments::charge gave up (exhausted) but its dead letter was lost: store unavailable: ...; the letter: {"v":1,"job":"payments::charge",...}
//! ```
//!
//! and raise [`Event::DeadLetterLost`] for it (when someone watches the call: an observer, the
//! `metrics` recorder, a `tracing` subscriber), counted in `jobguard_dead_letters_lost_total{job}`
//! with the `metrics` feature. To put such a letter back
//! once the sink works again, read it with [`from_log`] and send it, or `XADD` the record as it
//! is (see the README's "Dead letters and redrive").
//!
//! ```
//! use jobguard::dead_letter::{decode, encode, from_log};
//! use jobguard::{DeadLetter, GiveUp};
//! use std::time::SystemTime;
//!
//! let now = SystemTime::now();
//! let letter = DeadLetter::new("payments::charge", Some("idem-2".into()), GiveUp::Exhausted, 5, "timeout", now, now);
//! let record = encode(&letter);
//! assert!(record.starts_with(r#"{"v":1,"#));
//! assert_eq!(decode(record.as_bytes()), Ok(letter.clone()));
//! let line = format!("jobguard: job payments::charge gave up (exhausted) but its dead letter was lost: down; the letter: {record}");
//! assert_eq!(from_log(&line), Ok(letter));
//! ```

use crate::Error;
use crate::observe::Event;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt::{self, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod browse;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

pub use browse::{Browse, BrowseFuture, Filter, Page};

pub use crate::record::{DeadLetter, GiveUp};

/// The version written in every record's `"v"`; records of another version are
/// [`Error::Corrupt`].
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize)]
struct RecordOut<'a> {
    v: u32,
    #[serde(flatten)]
    letter: &'a DeadLetter,
}

#[derive(Deserialize)]
struct Version {
    v: Option<u32>,
}

/// A letter as a record: its JSON with the format version `"v"`, on one line. The format of a
/// Redis stream entry's `letter` field, and of the letter a log line carries.
pub fn encode(letter: &DeadLetter) -> String {
    let record = RecordOut {
        v: FORMAT_VERSION,
        letter,
    };
    // A DeadLetter is plain data (strings, numbers, times after the epoch, JSON): it serializes.
    serde_json::to_string(&record).unwrap_or_else(|e| {
        format!(
            r#"{{"v":{FORMAT_VERSION},"unserializable":{:?}}}"#,
            e.to_string()
        )
    })
}

/// A record as a letter (surrounding whitespace allowed); anything else is [`Error::Corrupt`]
/// saying why: not JSON, no format version, another format version, not a letter.
pub fn decode(record: &[u8]) -> Result<DeadLetter, Error> {
    let version: Version = serde_json::from_slice(record)
        .map_err(|e| Error::Corrupt(format!("not a JSON record: {e}")))?;
    match version.v {
        Some(FORMAT_VERSION) => {}
        Some(v) => {
            return Err(Error::Corrupt(format!(
                "record format version {v} (this build reads {FORMAT_VERSION})"
            )));
        }
        None => return Err(Error::Corrupt("record without a format version".into())),
    }
    serde_json::from_slice(record).map_err(|e| Error::Corrupt(format!("not a dead letter: {e}")))
}

/// What precedes the record in the log lines of a lost, dropped or logged letter.
const IN_LOG: &str = "the letter: ";

/// The letter a log line of jobguard's carries: a letter its sink did not take (`... its dead
/// letter was lost: ...; the letter: {record}`), one a bounded sink dropped at capacity, or one
/// [`LogDeadLetters`] logged. The
/// record is the end of the line, as [`encode`] wrote it; give the line's message (with a JSON
/// log format, the `message` field's value, unescaped). A line without a record that
/// [`decode`] reads is [`Error::Corrupt`].
pub fn from_log(line: &str) -> Result<DeadLetter, Error> {
    let mut why = None;
    // The first `the letter: ` whose remainder is a whole record: the marker may also occur in
    // an error message before it (or inside it), where the remainder is not one JSON value.
    for (at, _) in line.match_indices(IN_LOG) {
        let rest = line.as_bytes().get(at + IN_LOG.len()..).unwrap_or_default();
        match decode(rest) {
            Ok(letter) => return Ok(letter),
            Err(e) => {
                why.get_or_insert(e);
            }
        }
    }
    Err(match why {
        Some(Error::Corrupt(why)) => Error::Corrupt(format!("the letter in the log line: {why}")),
        Some(other) => other,
        None => Error::Corrupt(format!("no `{IN_LOG}` in the log line")),
    })
}

/// The boxed future a sink returns.
pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = Result<(), crate::Error>> + Send + 'a>>;

/// Where give-ups go. Implemented by [`MemoryDeadLetters`], [`LogDeadLetters`], and your own.
///
/// A sink that fails returns the error; the loop logs the letter whole (see
/// [Lost letters](self#lost-letters)), raises [`Event::DeadLetterLost`],
/// and still returns the job's own error to the caller, so a broken sink never masks the job's
/// failure.
pub trait DeadLetterSink: Send + Sync {
    /// Keeps one letter.
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_>;
}

impl<S: DeadLetterSink + ?Sized> DeadLetterSink for Arc<S> {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        (**self).send(letter)
    }
}

impl<S: DeadLetterSink + ?Sized> DeadLetterSink for &S {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        (**self).send(letter)
    }
}

/// Dead letters kept in memory, at most [`capacity`](Self::capacity) of them. `Clone` shares one
/// list.
///
/// At capacity the oldest letter is dropped to make room. A drop is never silent: it is counted
/// ([`dropped`](Self::dropped)), logged at error level with the letter whole as its record (read
/// it back with [`from_log`]), and counted in
/// `jobguard_dead_letters_dropped_total{sink="memory"}` with the `metrics` feature.
///
/// ```
/// use jobguard::MemoryDeadLetters;
///
/// let letters = MemoryDeadLetters::with_capacity(100);
/// assert!(letters.letters().is_empty());
/// assert_eq!(letters.capacity(), 100);
/// assert_eq!(letters.dropped(), 0);
/// ```
#[derive(Clone)]
pub struct MemoryDeadLetters {
    inner: Arc<MemoryInner>,
}

struct MemoryInner {
    /// Each letter with its id, a number counted from 1 in the order they came.
    letters: Mutex<VecDeque<(u64, DeadLetter)>>,
    next_id: AtomicU64,
    capacity: usize,
    dropped: AtomicU64,
}

impl std::fmt::Debug for MemoryDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryDeadLetters")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl Default for MemoryDeadLetters {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryDeadLetters {
    /// The capacity of [`new`](Self::new).
    pub const DEFAULT_CAPACITY: usize = 10_000;

    /// An empty list that keeps at most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) letters.
    pub fn new() -> Self {
        Self::with_capacity(Self::DEFAULT_CAPACITY)
    }

    /// An empty list that keeps at most `capacity` letters (at least 1).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        MemoryDeadLetters {
            inner: Arc::new(MemoryInner {
                letters: Mutex::new(VecDeque::new()),
                next_id: AtomicU64::new(1),
                capacity,
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Every letter kept, oldest first.
    pub fn letters(&self) -> Vec<DeadLetter> {
        self.lock().iter().map(|(_, l)| l.clone()).collect()
    }

    /// How many letters are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` when no letter is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most letters kept at once.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// How many letters were dropped at capacity since the list was made.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Removes and returns every letter, oldest first.
    pub fn drain(&self) -> Vec<DeadLetter> {
        self.lock().drain(..).map(|(_, l)| l).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, DeadLetter)>> {
        // A poisoned list is still a list: a panic elsewhere must not lose letters.
        self.inner.letters.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, letter: DeadLetter) {
        let evicted = {
            let mut letters = self.lock();
            let evicted = if letters.len() >= self.inner.capacity {
                letters.pop_front()
            } else {
                None
            };
            let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
            letters.push_back((id, letter));
            evicted.map(|(_, old)| old)
        };
        if let Some(old) = evicted {
            self.report_drop(&old);
        }
    }

    #[cold]
    fn report_drop(&self, old: &DeadLetter) {
        let total = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        log_with_record(
            format_args!(
                "jobguard: in-memory dead letters full ({} kept): dropped the oldest, job {} key \
                 {} ({}, {} attempt(s)): {}; {total} dropped so far",
                self.inner.capacity,
                old.job,
                old.key.as_deref().unwrap_or("-"),
                old.reason,
                old.attempts,
                old.error,
            ),
            &encode(old),
        );
        #[cfg(feature = "metrics")]
        crate::observe::metrics::dead_letters_dropped("memory", 1);
    }
}

impl DeadLetterSink for MemoryDeadLetters {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        self.push(letter);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A sink made from a closure; see [`from_fn`].
#[derive(Clone)]
pub struct FnDeadLetters<F> {
    f: F,
}

impl<F> std::fmt::Debug for FnDeadLetters<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnDeadLetters").finish_non_exhaustive()
    }
}

/// A sink that hands each letter to `f`: a queue producer, a database insert, a channel.
///
/// The closure's error is the sink's: the retry loop logs it at error level and still returns
/// the job's own error to the caller.
///
/// ```
/// use jobguard::{DeadLetter, Runtime};
/// use tokio::sync::mpsc;
///
/// let (tx, mut rx) = mpsc::unbounded_channel::<DeadLetter>();
/// let sink = jobguard::dead_letter::from_fn(move |letter| {
///     let tx = tx.clone();
///     async move {
///         tx.send(letter)
///             .map_err(|_| jobguard::Error::Store("dead-letter channel closed".into()))
///     }
/// });
/// let runtime = Runtime::builder().dead_letters(sink).build();
/// # drop((runtime, rx.try_recv()));
/// ```
pub fn from_fn<F, Fut>(f: F) -> FnDeadLetters<F>
where
    F: Fn(DeadLetter) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), crate::Error>> + Send + 'static,
{
    FnDeadLetters { f }
}

impl<F, Fut> DeadLetterSink for FnDeadLetters<F>
where
    F: Fn(DeadLetter) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), crate::Error>> + Send + 'static,
{
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        Box::pin((self.f)(letter))
    }
}

/// The embedded default sink: each letter is written to the log at error level and kept in a
/// bounded [`MemoryDeadLetters`]. With the `tracing` feature and a subscriber set, the log is a
/// `tracing` event (target `jobguard`, message `dead letter`, the job, key, reason, attempts and
/// error as fields, and `letter`, the letter whole as its record: read it back with [`decode`]);
/// otherwise it is a line on stderr that ends with `; the letter: ` and the record (read it back
/// with [`from_log`]). Either way the log alone is enough to redrive the job, payload included.
#[derive(Clone, Debug, Default)]
pub struct LogDeadLetters {
    kept: MemoryDeadLetters,
}

impl LogDeadLetters {
    /// A sink that logs and keeps letters.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sink that logs letters and keeps the last `capacity` of them.
    pub fn with_capacity(capacity: usize) -> Self {
        LogDeadLetters {
            kept: MemoryDeadLetters::with_capacity(capacity),
        }
    }

    /// The letters kept so far.
    pub fn kept(&self) -> &MemoryDeadLetters {
        &self.kept
    }
}

impl DeadLetterSink for LogDeadLetters {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        let record = encode(&letter);
        #[cfg(feature = "tracing")]
        let logged = crate::observe::tracing::has_subscriber();
        #[cfg(feature = "tracing")]
        if logged {
            ::tracing::error!(
                target: "jobguard",
                job = %letter.job,
                key = letter.key.as_deref(),
                reason = letter.reason.as_str(),
                attempts = letter.attempts,
                error = %letter.error,
                letter = %record,
                "dead letter",
            );
        }
        #[cfg(not(feature = "tracing"))]
        let logged = false;
        if !logged {
            log_with_record(
                format_args!(
                    "jobguard: dead letter: job {} key {} gave up ({}) after {} attempt(s): {}",
                    letter.job,
                    letter.key.as_deref().unwrap_or("-"),
                    letter.reason,
                    letter.attempts,
                    letter.error
                ),
                &record,
            );
        }
        self.kept.push(letter);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A failed redrive: `RedisDeadLetters::redrive` or `PgDeadLetters::redrive`.
#[derive(Debug)]
pub enum RedriveError<E> {
    /// The closure failed: the letter is kept.
    Job(E),
    /// The letter could not be read ([`Error::Store`], [`Error::Corrupt`]), or the closure
    /// succeeded and the letter could not be removed afterwards ([`Error::Store`]).
    Store(Error),
}

impl<E: fmt::Display> fmt::Display for RedriveError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedriveError::Job(e) => write!(f, "redriven job failed, letter kept: {e}"),
            RedriveError::Store(e) => write!(f, "dead letters: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RedriveError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedriveError::Job(e) => Some(e),
            RedriveError::Store(e) => Some(e),
        }
    }
}

tokio::task_local! {
    /// The job, key and reason of the letter being redriven (see [`redriving`]).
    static REDRIVING: (String, Option<String>, GiveUp);
}

/// Runs `fut`, the job of a redriven letter of `job` under `key`, which gave up for `reason`: a
/// give-up of that job and key inside it writes no letter of its own, since the letter being
/// redriven stays where it is when the job fails again (one job, one letter), and, when the
/// letter is a poison job's (`crashed`), that job and key's poisoned key is forgiven once so
/// that the job runs (see `Idempotent`'s claim). Any other job's letters are written, and its
/// keys refused, as ever.
#[cfg(any(feature = "redis", feature = "postgres", feature = "console"))]
pub(crate) fn redriving<F: Future>(
    job: String,
    key: Option<String>,
    reason: GiveUp,
    fut: F,
) -> impl Future<Output = F::Output> {
    REDRIVING.scope((job, key, reason), fut)
}

/// The reason of the letter being redriven on this task, when it is a letter of `job` under
/// `key`: `None` outside a redrive, or in the redrive of another job's letter.
fn redriven_letter(job: &str, key: Option<&str>) -> Option<GiveUp> {
    REDRIVING
        .try_with(|(redriven, its_key, reason)| {
            (redriven == job && its_key.as_deref() == key).then_some(*reason)
        })
        .ok()
        .flatten()
}

/// Whether a give-up of `job` under `key` is the redriven letter's job giving up again, whose
/// letter stands for it.
pub(crate) fn redriven(job: &str, key: Option<&str>) -> bool {
    redriven_letter(job, key).is_some()
}

/// Whether `job` under `key` runs in the redrive of its own `crashed` letter: the operator's
/// word that the poison job is to run again, so its poisoned key may be forgiven. A redrive of
/// a letter of another reason forgives nothing.
pub(crate) fn redriven_crashed(job: &str, key: &str) -> bool {
    redriven_letter(job, Some(key)) == Some(GiveUp::Crashed)
}

/// Sends `letter` to `sink`, and reports a letter the sink refuses ([`letter_lost`]), with
/// `raise` given its [`Event::DeadLetterLost`] (once, and never when the sink took the letter):
/// `true` when the sink took it. The retry engine raises the event only when the call's
/// observation, decided when it started, says someone watches; the idempotency guard through
/// the runtime its other events go to.
pub(crate) async fn deliver_observed(
    sink: &dyn DeadLetterSink,
    letter: DeadLetter,
    raise: impl FnOnce(&Event<'_>),
) -> bool {
    // A copy for the log, should the sink fail: the letter is not lost with it.
    let kept = letter.clone();
    match sink.send(letter).await {
        Ok(()) => true,
        Err(e) => {
            letter_lost(&kept, &e);
            raise(&Event::DeadLetterLost {
                letter: &kept,
                error: &e,
            });
            false
        }
    }
}

/// Logs that `letter` did not reach its sink, with the letter itself as its record (the format
/// a Redis stream keeps, payload included), so that an operator can put it back or redrive the
/// job from the log: the one line the retry engine and the idempotency guard write for a lost
/// letter. [`from_log`] reads the letter back from it.
#[cold]
fn letter_lost(letter: &DeadLetter, error: &dyn Display) {
    log_with_record(
        format_args!(
            "jobguard: job {} gave up ({}) but its dead letter was lost: {error}",
            letter.job, letter.reason,
        ),
        &encode(letter),
    );
}

/// Logs `summary` at error level, the letter's `record` ([`encode`]) ending the line after
/// [`IN_LOG`]: the one shape of the lines [`from_log`] reads back.
#[cold]
fn log_with_record(summary: fmt::Arguments<'_>, record: &str) {
    crate::observe::log_error(format_args!("{summary}; {IN_LOG}{record}"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn letter() -> DeadLetter {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        DeadLetter::new(
            "payments::charge",
            Some("idem-2".into()),
            GiveUp::Exhausted,
            5,
            "the letter: {\"v\":1} é",
            t,
            t,
        )
        .with_history(vec!["timeout".into(); 2])
        .with_payload(Some(serde_json::json!(["order-B", 100])))
    }

    #[test]
    fn records_round_trip_with_their_version() {
        let record = encode(&letter());
        assert!(record.starts_with(r#"{"v":1,"#), "{record}");
        assert_eq!(decode(record.as_bytes()).unwrap(), letter());
    }

    #[test]
    fn other_versions_and_garbage_are_corrupt() {
        let v2 = encode(&letter()).replacen(r#""v":1"#, r#""v":2"#, 1);
        for bad in [v2.as_str(), "", "{}", "[1]", r#"{"v":1,"job":7}"#, "\u{0}"] {
            assert!(
                matches!(decode(bad.as_bytes()), Err(Error::Corrupt(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn from_log_reads_the_record_that_ends_the_line_whatever_precedes_it() {
        let record = encode(&letter());
        let lines = [
            format!(
                "jobguard: job x gave up (exhausted) but its dead letter was lost: e; {IN_LOG}{record}"
            ),
            // The marker in the sink's error before the record, and in the letter's own error.
            format!("lost: {IN_LOG}{{\"v\":1,\"oops\"; {IN_LOG}{record}\n"),
            format!("2026-01-01T00:00:00Z ERROR jobguard: {IN_LOG}{record}  "),
        ];
        for line in lines {
            assert_eq!(from_log(&line), Ok(letter()), "{line}");
        }
    }

    #[test]
    fn a_line_without_a_readable_record_is_corrupt_never_a_panic() {
        let record = encode(&letter());
        let v2 = record.replacen(r#""v":1"#, r#""v":2"#, 1);
        for line in [
            String::new(),
            "no marker here".to_owned(),
            IN_LOG.to_owned(),
            format!("{IN_LOG}{}", &record[..record.len() - 1]),
            format!("{IN_LOG}{v2}"),
            format!("{IN_LOG}{record} and more"),
            format!("é{IN_LOG}é"),
        ] {
            assert!(matches!(from_log(&line), Err(Error::Corrupt(_))), "{line}");
        }
    }
}
