//! Dead letters: the record of a job that gave up, and the sinks that keep them.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Why a job gave up and was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GiveUp {
    /// Every attempt failed transiently.
    Exhausted,
    /// A failure said retrying cannot help.
    Permanent,
    /// The total budget ran out.
    Budget,
    /// The circuit breaker in front of the dependency was open.
    CircuitOpen,
}

impl GiveUp {
    /// The reason as a short lowercase label (`exhausted`, `permanent`, `budget`, `circuit_open`),
    /// as used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            GiveUp::Exhausted => "exhausted",
            GiveUp::Permanent => "permanent",
            GiveUp::Budget => "budget",
            GiveUp::CircuitOpen => "circuit_open",
        }
    }
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The record of one give-up. Every give-up sends exactly one to the job's sink; the error is
/// still returned to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The job's name: its module path and function name, or the name given to
    /// [`Policy::run`](crate::Policy::run).
    pub job: String,
    /// The idempotency key, when the job has one.
    pub key: Option<String>,
    /// Why it gave up.
    pub reason: GiveUp,
    /// Attempts made.
    pub attempts: u32,
    /// The last error's `Display`.
    pub error: String,
    /// When the first attempt started.
    pub first_attempt: SystemTime,
    /// When the last attempt started.
    pub last_attempt: SystemTime,
}

impl DeadLetter {
    /// A record with the given fields.
    pub fn new(
        job: impl Into<String>,
        key: Option<String>,
        reason: GiveUp,
        attempts: u32,
        error: impl Into<String>,
        first_attempt: SystemTime,
        last_attempt: SystemTime,
    ) -> Self {
        DeadLetter {
            job: job.into(),
            key,
            reason,
            attempts,
            error: error.into(),
            first_attempt,
            last_attempt,
        }
    }
}

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

/// Dead letters kept in memory. `Clone` shares one list.
///
/// ```
/// let letters = jobguard::MemoryDeadLetters::new();
/// assert!(letters.letters().is_empty());
/// ```
#[derive(Clone, Default)]
pub struct MemoryDeadLetters {
    inner: Arc<Mutex<VecDeque<DeadLetter>>>,
}

impl std::fmt::Debug for MemoryDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryDeadLetters").field("len", &self.len()).finish()
    }
}

impl MemoryDeadLetters {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
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

    /// Removes and returns every letter.
    pub fn drain(&self) -> Vec<DeadLetter> {
        self.lock().drain(..).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<DeadLetter>> {
        // A poisoned list is still a list: a panic elsewhere must not lose letters.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, letter: DeadLetter) {
        self.lock().push_back(letter);
    }
}

impl DeadLetterSink for MemoryDeadLetters {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        self.push(letter);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The embedded default sink: each letter is written to the log (stderr, or `tracing` at error
/// level with the `tracing` feature) and kept in memory.
#[derive(Clone, Debug, Default)]
pub struct LogDeadLetters {
    kept: MemoryDeadLetters,
}

impl LogDeadLetters {
    /// A sink that logs and keeps letters.
    pub fn new() -> Self {
        Self::default()
    }

    /// The letters kept so far.
    pub fn kept(&self) -> &MemoryDeadLetters {
        &self.kept
    }
}

impl DeadLetterSink for LogDeadLetters {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        crate::observe::log_error(format_args!(
            "jobguard: dead letter: job {} key {} gave up ({}) after {} attempt(s): {}",
            letter.job,
            letter.key.as_deref().unwrap_or("-"),
            letter.reason,
            letter.attempts,
            letter.error
        ));
        self.kept.push(letter);
        Box::pin(std::future::ready(Ok(())))
    }
}
