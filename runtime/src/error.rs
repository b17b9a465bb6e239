//! The errors the runtime raises on its own.

use std::fmt;
use std::time::Duration;

/// An error jobguard itself produced: a store that could not be reached, an open breaker, a cut
/// attempt, a spent budget, a key reused with other arguments.
///
/// A job whose configuration lets the runtime fail on its own (a `timeout`, a `budget`, a
/// `breaker`, or any `#[idempotent]`) needs `E: From<jobguard::Error>` so these errors can reach
/// the caller in the job's own error type.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Another worker holds a live claim on this idempotency key. Transient: a redelivery after
    /// the other worker finishes replays its result.
    InProgress,
    /// The key was used before with a different fingerprint (other arguments): never a silent
    /// replay of someone else's result.
    KeyReused,
    /// The circuit breaker in front of the dependency is open, or half-open with all its probes
    /// under way.
    CircuitOpen {
        /// Time until the breaker lets a probe through: zero when it is half-open and its probe
        /// slots are taken (it admits again as soon as a probe ends, at a time it cannot know;
        /// a caller that waits on this should wait at least its own base delay).
        retry_in: Duration,
    },
    /// One attempt ran longer than the policy's `timeout`.
    Timeout,
    /// The job's total `budget` ran out.
    Budget,
    /// The claim's lease lapsed before the result was stored; another worker may have run the job.
    LeaseLost,
    /// A store (the idempotency store, or a durable dead-letter sink) could not be reached or
    /// answered with an error. The message names the store and the command.
    Store(String),
    /// A stored record (an idempotency record, a dead letter or its payload) could not be
    /// decoded. The message says which.
    Corrupt(String),
    /// The job's claims were abandoned `crashes` times (each lease lapsed without a result or a
    /// release: the worker running it died), which reached the job's crash limit
    /// (`#[idempotent(crashes = N)]`, 3 by default). The job is refused from now on: it is not run
    /// again, so a job that kills its worker cannot take the worker pool down in a loop.
    /// Permanent.
    Poisoned {
        /// The abandoned claims counted.
        crashes: u32,
    },
    /// A job's result cannot be kept to replay: it does not serialize (a map with non-string
    /// keys, say), holds a float JSON keeps as `null` (a `NaN` or an infinity, which would read
    /// back as no `f64`, or as `None` in an `Option`), or does not read back as the job's type. With a store, the call that ran returns its value and the key is recorded as
    /// completed without it, so a redelivery gets this error for the record's TTL instead of
    /// running the job again; in a Postgres transaction (`transaction = tx`) the call fails with
    /// it and the transaction is to be rolled back. The message says which. Permanent: change
    /// the result type.
    Unreplayable(String),
    /// jobguard is used in a way it cannot keep its promise in, found at run time: for example
    /// two `#[idempotent]` functions whose default scopes are the same name (nested functions,
    /// or methods of two types in one module), whose keys would collide. The message says what
    /// and how to fix it. Permanent; the job is not run.
    Config(String),
}

impl Error {
    /// `self`, a [`Error::Corrupt`] naming the key whose record it is about, as the guard and
    /// `PgStore`'s transactional forms hand it to the job (a store's own message does not know
    /// the key); any other error as it is.
    pub(crate) fn at_key(self, scope: &str, key: &str) -> Error {
        match self {
            Error::Corrupt(why) => Error::Corrupt(format!("{why} (key {key:?} of {scope:?})")),
            other => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InProgress => {
                f.write_str("another worker is running this job (idempotency key in progress)")
            }
            Error::KeyReused => f.write_str("idempotency key reused with different arguments"),
            Error::CircuitOpen { retry_in } => {
                write!(f, "circuit breaker open; next probe in {retry_in:?}")
            }
            Error::Timeout => f.write_str("attempt timed out"),
            Error::Budget => f.write_str("retry budget spent"),
            Error::LeaseLost => f.write_str("idempotency lease lost before the result was stored"),
            Error::Store(msg) => write!(f, "store unavailable: {msg}"),
            Error::Corrupt(msg) => write!(f, "corrupt record: {msg}"),
            Error::Poisoned { crashes } => write!(
                f,
                "job refused: its worker died {crashes} times while running it (poison job)"
            ),
            Error::Unreplayable(why) => write!(f, "result not replayable: {why}"),
            Error::Config(msg) => write!(f, "jobguard misconfigured: {msg}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    /// Lets `std::io::Error` jobs use `timeout`, `budget`, `breaker` and `#[idempotent]`: the
    /// kind keeps the transient ones transient (`TimedOut`, `WouldBlock` for in-progress,
    /// `ConnectionRefused` for an unreachable store).
    fn from(error: Error) -> Self {
        use std::io::ErrorKind;
        let kind = match &error {
            Error::Timeout => ErrorKind::TimedOut,
            Error::InProgress => ErrorKind::WouldBlock,
            Error::Store(_) => ErrorKind::ConnectionRefused,
            Error::KeyReused => ErrorKind::AlreadyExists,
            Error::Corrupt(_) => ErrorKind::InvalidData,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, error)
    }
}
