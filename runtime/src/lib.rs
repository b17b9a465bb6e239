//! # jobguard
//!
//! Retry and idempotency for async Rust jobs. Every queue delivers at least once, so a job will
//! run twice; `#[retry]` re-runs only failures that can succeed on a second try, with capped,
//! jittered exponential backoff, and hands the job to a dead-letter sink when it gives up.
//!
#![cfg_attr(feature = "macros", doc = "```")]
#![cfg_attr(not(feature = "macros"), doc = "```ignore")]
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

#[cfg(feature = "apalis")]
pub mod apalis;
pub mod breaker;
pub mod classify;
pub mod dead_letter;
mod error;
pub mod idempotent;
pub mod jitter;
pub mod observe;
pub mod policy;
mod retry;
pub mod runtime;
pub mod store;

pub use breaker::{BreakerState, CircuitBreaker};
pub use classify::{Transient, Verdict, http_verdict};
#[cfg(feature = "redis")]
pub use dead_letter::redis::{RedisDeadLetters, RedriveError};
pub use dead_letter::{DeadLetter, DeadLetterSink, GiveUp, LogDeadLetters, MemoryDeadLetters};
pub use dead_letter::{FnDeadLetters, from_fn};
pub use error::Error;
pub use jitter::Jitter;
pub use observe::{Event, Observer};
pub use policy::Policy;
pub use runtime::{Runtime, RuntimeBuilder};
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PgStore;
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;
pub use store::{Claim, Store, StoreKey};

#[cfg(feature = "macros")]
#[doc(inline)]
pub use jobguard_macros::Transient;

/// Retries an `async fn` returning `Result` on failures that can succeed on a second try.
///
/// ```
/// use jobguard::Transient;
///
/// #[derive(Debug, Transient)]
/// enum GatewayError {
///     #[transient]
///     Timeout,
///     Declined,
/// }
/// # impl std::fmt::Display for GatewayError {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
/// # }
///
/// #[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = full, on = transient)]
/// async fn capture(order_id: &str) -> Result<u64, GatewayError> {
///     # let _ = order_id;
///     Ok(100)
/// }
/// ```
///
/// Arguments (all optional, any order): `attempts`, `base`, `cap`, `jitter`
/// (`none | full | equal | decorrelated`), `on` (`transient | all | path::to::classifier`),
/// `budget`, `timeout`, `breaker`, `dead_letter`, `payload` (the arguments a dead letter carries
/// for a redrive: `payload = (order_id, amount)`), `crate`. The README's table gives each one.
///
/// `return` and `?` in the body end one attempt, not the whole call; the body runs again on a
/// retry, so it must not move a parameter it needs next time (clone it inside). The future is
/// `Send` whenever the body's is.
///
/// # Equivalent code without the attribute
///
/// ```
/// # use jobguard::{Jitter, Policy};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// const POLICY: Policy = Policy::new().attempts(5).jitter(Jitter::Full);
/// let receipt: Result<u64, std::io::Error> = POLICY
///     .run("payments::capture", async |_attempt| Ok(100))
///     .await;
/// # assert_eq!(receipt.unwrap(), 100);
/// # }
/// ```
///
/// The expansion itself is one inline loop over the runtime's `Retry` state: see the README.
#[cfg(feature = "macros")]
#[doc(inline)]
pub use jobguard_macros::retry;

/// Makes an `async fn` safe to run twice: the key is claimed once, the result stored, and every
/// redelivery replays it without running the body.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Receipt {
///     order_id: String,
/// }
///
/// #[jobguard::idempotent(key = order_id, scope = "payments.charge", ttl = "24h", lease = "30s")]
/// async fn charge(order_id: &str, amount: u64) -> Result<Receipt, jobguard::Error> {
///     # let _ = amount;
///     Ok(Receipt { order_id: order_id.to_owned() })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let first = charge("order-A", 100).await.unwrap();
/// let again = charge("order-A", 100).await.unwrap(); // replayed: the body did not run
/// assert_eq!(first.order_id, again.order_id);
/// # }
/// ```
///
/// `key` is any expression over the parameters (`order_id`, `order.id`,
/// `format!("{tenant}:{id}")`, `self.id`); its `Display` form is the stored key.
///
/// Arguments: `key` (required), `scope`, `ttl`, `lease`, `fingerprint`, `store`,
/// `in_progress = fail | wait("10s")`, `transaction` (feature `postgres`), `crate`. Written with `#[retry]`, in either order, the key
/// is checked once and the retry loop runs inside the claim.
///
/// `transaction = tx` names a parameter of type `&mut sqlx::PgConnection` or
/// `&mut sqlx::Transaction<'_, Postgres>`: the key is claimed in that transaction with
/// [`PgStore::in_transaction`](crate::store::postgres::PgStore::in_transaction), the body's writes
/// and the result go in it, and the caller commits. Inside the body `tx` is the transaction's
/// `&mut PgConnection`; with `#[retry]` each attempt runs in a savepoint.
///
/// The default `scope` is the function's module path and name: moving or renaming the function
/// changes it, and with it every stored key. Jobs whose keys must outlive a refactor pin
/// `scope = "..."`.
///
/// # Equivalent code without the attribute
///
/// ```
/// # use jobguard::idempotent::Idempotent;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let order_id = "order-A";
/// let receipt: Result<String, jobguard::Error> = Idempotent::new("payments.charge", order_id)
///     .run(async { Ok(format!("receipt for {order_id}")) })
///     .await;
/// # assert!(receipt.is_ok());
/// # }
/// ```
#[cfg(feature = "macros")]
#[doc(inline)]
pub use jobguard_macros::idempotent;

/// What expanded attributes call. Not public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::idempotent::Idempotent;
    pub use crate::observe::Job;
    pub use crate::retry::Retry;
    #[cfg(feature = "postgres")]
    pub use crate::store::postgres::{PgStore, savepoint};
    pub use core::ops::ControlFlow;
    pub use core::time::Duration;
    #[cfg(feature = "postgres")]
    pub use sqlx::PgConnection;

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
    pub fn key<K: Key + ?Sized>(key: &K) -> String {
        key.to_string()
    }

    /// Names the bound that `#[idempotent(key = ...)]` needs of the key, in words.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be an idempotency key",
        label = "`key` is stored in its `Display` form, and `{Self}` does not implement `Display`",
        note = "key by a field or a string built from the parameters (`key = order.id`, `key = format!(\"{{tenant}}:{{id}}\")`), or implement `std::fmt::Display` for `{Self}`"
    )]
    pub trait Key: core::fmt::Display {}
    #[diagnostic::do_not_recommend]
    impl<K: core::fmt::Display + ?Sized> Key for K {}

    /// Names the bound that `#[idempotent(fingerprint = ...)]` needs, in words.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be fingerprinted",
        label = "`fingerprint` is hashed from its serde JSON form, so it needs `serde::Serialize`",
        note = "fingerprint the parameters that define the request, such as `fingerprint = (amount, currency)`, and derive `serde::Serialize` for their types"
    )]
    pub trait Fingerprint: serde::Serialize {}
    #[diagnostic::do_not_recommend]
    impl<T: serde::Serialize + ?Sized> Fingerprint for T {}

    /// `fingerprint = EXPR`: a SHA-256 digest of the value's JSON form, stable across processes
    /// and builds.
    pub fn fingerprint<T: Fingerprint + ?Sized>(value: &T) -> String {
        use sha2::{Digest, Sha256};
        let bytes = serde_json::to_vec(value)
            .unwrap_or_else(|e| format!("unserializable: {e}").into_bytes());
        let digest = Sha256::digest(&bytes);
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// Names the bound that `#[retry(payload = ...)]` needs of the arguments, in words.
    #[diagnostic::on_unimplemented(
        message = "`#[retry(payload = ...)]` cannot carry `{Self}` in a dead letter",
        label = "the payload is serialized with serde into the letter, so it needs `serde::Serialize + Sync`",
        note = "derive `serde::Serialize` for the arguments' types, or leave out the ones that cannot be serialized"
    )]
    pub trait Payload: serde::Serialize + Sync {}
    #[diagnostic::do_not_recommend]
    impl<P: serde::Serialize + Sync + ?Sized> Payload for P {}

    /// Names the bound that `#[idempotent]` needs of the `Ok` type, in words.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be stored for replay",
        label = "`#[idempotent]` stores the `Ok` value, so it needs `serde::Serialize + serde::de::DeserializeOwned`",
        note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
    )]
    pub trait Replayable: serde::Serialize + serde::de::DeserializeOwned {}
    // `do_not_recommend`: a missing serde derive is one error in the words above, not one per
    // serde trait in rustc's.
    #[diagnostic::do_not_recommend]
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
