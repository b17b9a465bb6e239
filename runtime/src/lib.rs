//! # jobguard
//!
//! Retry and idempotency for async Rust jobs. Every queue delivers at least once, so a job will
//! run twice; `#[retry]` re-runs only failures that can succeed on a second try, with capped,
//! jittered exponential backoff, and hands the job to a dead-letter sink when it gives up.
//!
//! ```
//! use jobguard::Transient;
//!
//! #[derive(Debug, Transient)]
//! enum GatewayError {
//!     #[transient]
//!     Timeout,
//!     Declined,
//! }
//! # impl std::fmt::Display for GatewayError {
//! #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
//! # }
//!
//! #[jobguard::retry(attempts = 5, base = "500ms", cap = "8s")]
//! async fn charge(order_id: &str, amount: u64) -> Result<u64, GatewayError> {
//!     # let _ = order_id;
//!     Ok(amount)
//! }
//! ```
//!
//! The attributes expand into a few calls on this crate; all logic lives here, where it is
//! tested. See the README for the "equivalent code without the attribute".
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod breaker;
pub mod classify;
pub mod dead_letter;
pub mod idempotent;
mod error;
pub mod jitter;
pub mod observe;
pub mod policy;
mod retry;
pub mod runtime;
pub mod store;

pub use breaker::{BreakerState, CircuitBreaker};
pub use classify::{Transient, Verdict, http_verdict};
pub use dead_letter::{DeadLetter, DeadLetterSink, GiveUp, LogDeadLetters, MemoryDeadLetters};
pub use error::Error;
pub use jitter::Jitter;
pub use observe::{Event, Observer};
pub use policy::Policy;
pub use runtime::{Runtime, RuntimeBuilder};
pub use store::memory::MemoryStore;
pub use store::{Claim, Store, StoreKey};

#[cfg(feature = "macros")]
#[doc(inline)]
pub use jobguard_macros::{Transient, idempotent, retry};

/// What expanded attributes call. Not public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::idempotent::Idempotent;
    pub use crate::retry::Retry;
    pub use core::ops::ControlFlow;
    pub use core::time::Duration;

    use crate::{Transient, Verdict};

    /// `on = transient`: the error's own verdict.
    #[inline]
    pub fn transient<E: Transient>(error: &E) -> Verdict {
        error.verdict()
    }

    /// `#[transient(after = field)]`: the field's `Duration`, or the curve when it is `None`.
    #[inline]
    pub fn after<D: RetryAfter + ?Sized>(field: &D) -> Verdict {
        match field.retry_after() {
            Some(d) => Verdict::RetryAfter(d),
            None => Verdict::Retry,
        }
    }

    /// A field that `#[transient(after = field)]` can read.
    #[diagnostic::on_unimplemented(
        message = "`#[transient(after = ...)]` needs a `Duration` or `Option<Duration>` field, not `{Self}`"
    )]
    pub trait RetryAfter {
        /// The wait the field asks for.
        fn retry_after(&self) -> Option<Duration>;
    }
    impl RetryAfter for Duration {
        fn retry_after(&self) -> Option<Duration> {
            Some(*self)
        }
    }
    impl RetryAfter for Option<Duration> {
        fn retry_after(&self) -> Option<Duration> {
            *self
        }
    }

    /// `on = all`: every failure is retried.
    #[inline]
    pub fn all<E>(_: &E) -> Verdict {
        Verdict::Retry
    }

    /// The stored form of an idempotency key: its `Display`.
    #[inline]
    pub fn key<K: core::fmt::Display + ?Sized>(key: &K) -> String {
        key.to_string()
    }

    /// `fingerprint = EXPR`: a SHA-256 digest of the value's JSON form, stable across processes
    /// and builds.
    pub fn fingerprint<T: serde::Serialize + ?Sized>(value: &T) -> String {
        use sha2::{Digest, Sha256};
        let bytes = serde_json::to_vec(value).unwrap_or_else(|e| format!("unserializable: {e}").into_bytes());
        let digest = Sha256::digest(&bytes);
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// Names the bound that `#[idempotent]` needs of the `Ok` type, in words.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be stored for replay",
        label = "`#[idempotent]` stores the `Ok` value, so it needs `serde::Serialize + serde::de::DeserializeOwned`",
        note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
    )]
    pub trait Replayable: serde::Serialize + serde::de::DeserializeOwned {}
    impl<T: serde::Serialize + serde::de::DeserializeOwned> Replayable for T {}

    /// Names the bound that `timeout`, `budget` and `breaker` need, in words.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot carry jobguard's own errors",
        label = "this error type needs `From<jobguard::Error>`",
        note = "`timeout`, `budget`, `breaker` and `#[idempotent]` can fail on their own (a cut attempt, a spent budget, an open breaker, an unreachable store); add `impl From<jobguard::Error> for {Self}`, or a variant `#[transient(from)] Jobguard(#[from] jobguard::Error)`"
    )]
    pub trait FromJobguard: From<crate::Error> {}
    impl<E: From<crate::Error>> FromJobguard for E {}
}
