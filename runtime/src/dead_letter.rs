//! Dead letters: the record of a job that gave up, and the sinks that keep them.
//!
//! | sink | keeps letters | notes |
//! |---|---|---|
//! | [`LogDeadLetters`] | in memory, bounded | the default: logs each letter at error level (`tracing` with that feature, else stderr) |
//! | [`MemoryDeadLetters`] | in memory, bounded | drops the oldest at capacity, counts and reports the drop |
//! | [`from_fn`] | wherever the closure puts them | a queue, a table, a channel |
//! | [`redis::RedisDeadLetters`] (feature `redis`) | a Redis Stream | outlives the process; `list`, `get`, `remove`, `redrive` |

use std::collections::VecDeque;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

pub use crate::record::{DeadLetter, GiveUp};

/// The boxed future a sink returns.
pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = Result<(), crate::Error>> + Send + 'a>>;

/// Where give-ups go. Implemented by [`MemoryDeadLetters`], [`LogDeadLetters`], and your own.
///
/// A sink that fails returns the error; the loop logs it and still returns the job's own error to
/// the caller, so a broken sink never masks the job's failure.
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
/// ([`dropped`](Self::dropped)), logged at error level, and counted in
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
    letters: Mutex<VecDeque<DeadLetter>>,
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
                capacity,
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Every letter kept, oldest first.
    pub fn letters(&self) -> Vec<DeadLetter> {
        self.lock().iter().cloned().collect()
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
        self.lock().drain(..).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<DeadLetter>> {
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
            letters.push_back(letter);
            evicted
        };
        if let Some(old) = evicted {
            self.report_drop(&old);
        }
    }

    #[cold]
    fn report_drop(&self, old: &DeadLetter) {
        let total = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        crate::observe::log_error(format_args!(
            "jobguard: in-memory dead letters full ({} kept): dropped the oldest, job {} key {} \
             ({}, {} attempt(s)): {}; {total} dropped so far",
            self.inner.capacity,
            old.job,
            old.key.as_deref().unwrap_or("-"),
            old.reason,
            old.attempts,
            old.error,
        ));
        #[cfg(feature = "metrics")]
        crate::observe::metrics::dead_letter_dropped("memory");
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
/// error as fields); otherwise it is a line on stderr.
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
                "dead letter",
            );
        }
        #[cfg(not(feature = "tracing"))]
        let logged = false;
        if !logged {
            crate::observe::log_error(format_args!(
                "jobguard: dead letter: job {} key {} gave up ({}) after {} attempt(s): {}",
                letter.job,
                letter.key.as_deref().unwrap_or("-"),
                letter.reason,
                letter.attempts,
                letter.error
            ));
        }
        self.kept.push(letter);
        Box::pin(std::future::ready(Ok(())))
    }
}

tokio::task_local! {
    /// The job and key of the letter being redriven (see [`redriving`]).
    static REDRIVING: (String, Option<String>);
}

/// Runs `fut`, the job of a redriven letter of `job` under `key`: a give-up of that job and key
/// inside it writes no letter of its own, since the letter being redriven stays where it is
/// when the job fails again (one job, one letter), and a poisoned key of that job and key is
/// forgiven once so that the job runs (see `Idempotent`'s claim). Any other job's letters are
/// written, and its keys refused, as ever.
#[cfg(feature = "redis")]
pub(crate) fn redriving<F: Future>(
    job: String,
    key: Option<String>,
    fut: F,
) -> impl Future<Output = F::Output> {
    REDRIVING.scope((job, key), fut)
}

/// Whether a give-up of `job` under `key` is the redriven letter's job giving up again, whose
/// letter stands for it.
pub(crate) fn redriven(job: &str, key: Option<&str>) -> bool {
    REDRIVING
        .try_with(|(redriven, its_key)| redriven == job && its_key.as_deref() == key)
        .unwrap_or(false)
}

/// Sends `letter` to `sink`, and logs a letter the sink refuses whole ([`letter_lost`]):
/// `true` when the sink took it. How the retry engine and the idempotency guard send theirs.
pub(crate) async fn deliver(sink: &dyn DeadLetterSink, letter: DeadLetter) -> bool {
    // A copy for the log, should the sink fail: the letter is not lost with it.
    let kept = letter.clone();
    match sink.send(letter).await {
        Ok(()) => true,
        Err(e) => {
            letter_lost(&kept, &e);
            false
        }
    }
}

/// Logs that `letter` did not reach its sink, with the letter itself as JSON (its payload too),
/// so that an operator can still redrive the job from the log: the one line the retry engine and
/// the idempotency guard write for a lost letter.
#[cold]
fn letter_lost(letter: &DeadLetter, error: &dyn Display) {
    let json =
        serde_json::to_string(letter).unwrap_or_else(|e| format!("(not JSON: {e}) {letter:?}"));
    crate::observe::log_error(format_args!(
        "jobguard: job {} gave up ({}) but its dead letter was lost: {error}; the letter: {json}",
        letter.job, letter.reason
    ));
}
