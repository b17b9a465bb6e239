//! # jobguard
//!
//! Background jobs that are safe to run twice. Every queue delivers at least once, so a job will
//! run twice: a payment capture that times out, is retried and charges the customer twice is the
//! bug this crate exists to prevent. `#[idempotent]` claims the job's key once, stores its result
//! and replays it to every redelivery without running the body again; `#[retry]` re-runs only
//! the failures that can succeed on a second try, with capped, jittered exponential backoff, and
//! hands the job to a dead-letter sink when it gives up. Written together, idempotency wraps
//! retry: the key is claimed once, and the retry loop runs inside the claim.
//!
#![cfg_attr(feature = "macros", doc = "```")]
#![cfg_attr(not(feature = "macros"), doc = "```ignore")]
//! use jobguard::Transient;
//! use serde::{Deserialize, Serialize};
//!
//! /// What the job returns: stored, and replayed to every redelivery.
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Receipt {
//!     order_id: String,
//!     amount: u64,
//! }
//!
//! /// Each variant says whether trying again can help.
//! #[derive(Debug, Transient)]
//! enum GatewayError {
//!     #[transient] // retried on the backoff curve
//!     Timeout,
//!     #[transient(after = wait)] // retried after exactly this long
//!     RateLimited { wait: std::time::Duration },
//!     Declined, // unmarked: permanent, never retried
//!     #[transient(from)] // jobguard's own errors (a store out of reach), with their own verdict
//!     Jobguard(jobguard::Error),
//! }
//!
//! impl std::fmt::Display for GatewayError {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         write!(f, "{self:?}") // the text a dead letter keeps
//!     }
//! }
//!
//! impl From<jobguard::Error> for GatewayError {
//!     fn from(e: jobguard::Error) -> Self {
//!         GatewayError::Jobguard(e)
//!     }
//! }
//!
//! #[jobguard::idempotent(key = order_id)]
//! #[jobguard::retry(attempts = 5, base = "500ms", cap = "8s")]
//! async fn charge(order_id: &str, amount: u64) -> Result<Receipt, GatewayError> {
//!     // the payment gateway's call goes here
//!     Ok(Receipt { order_id: order_id.to_owned(), amount })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), GatewayError> {
//! let first = charge("order-A", 100).await?;
//! let again = charge("order-A", 100).await?; // a redelivery: replayed, the body did not run
//! assert_eq!(first.order_id, again.order_id);
//! # Ok(())
//! # }
//! ```
//!
//! With no store named, jobs use the embedded default, a process-wide [`MemoryStore`]; name one
//! in a [`Runtime`] for many processes. The README walks through the rest, from the `Cargo.toml`
//! lines to running workers for real.
//!
//! # Entry points
//!
//! - **The attributes** (feature `macros`, on by default): `#[retry]` and `#[idempotent]` on an
//!   `async fn` returning `Result`, and `#[derive(Transient)]` for the error's [`Verdict`]s
//!   ([`Transient`], [`http_verdict`] for HTTP statuses). Their own docs list every argument.
//! - **Durable steps**: `#[step]` (or [`step()`]) on each effect of a job with several: inside an
//!   `#[idempotent]` job its `Ok` value is recorded under the job's key, and every later run of
//!   the job (a retry, a redelivery, a redrive) replays it and resumes at the first step not yet
//!   recorded; see the [`step`](mod@step) module.
//! - **Without a macro**: [`Policy::run`] is the retry loop over an `async` closure, and
//!   [`Idempotent`] the claim around a future.
//! - **Stores**, where claims and results live: [`MemoryStore`] (the embedded default),
//!   `RedisStore` (feature `redis`, one server or a Redis Cluster), `PgStore` (feature `postgres`,
//!   also in the caller's own transaction); the [`Store`] trait for one of your own, and
//!   `testing::check_store` (feature `testing`), the conformance suite it should pass.
//! - **HTTP**: `http::IdempotencyLayer` (feature `http`), the `Idempotency-Key` header as a tower
//!   layer for axum and hyper.
//! - **Job runners**: `apalis::GuardLayer` (feature `apalis`) for apalis workers; on another
//!   runner, [`Delivery::scope`] puts the broker's delivery in scope.
//! - **Dead letters**: the [`DeadLetterSink`] trait, [`LogDeadLetters`] (the default),
//!   [`MemoryDeadLetters`], [`from_fn`], `RedisDeadLetters` (feature `redis`),
//!   `dead_letter::postgres::PgDeadLetters` (feature `postgres`); each give-up is one
//!   [`DeadLetter`] with its [`GiveUp`] reason, and [`dead_letter::Browse`] pages through the
//!   sinks that keep them.
//! - **An operator console**: `console::Console` (feature `console`), an axum `Router` of pages
//!   and a JSON API over the dead letters, a store's keys and breakers, for a human to see and
//!   act on (redrive, delete, forgive, forget, reset).
//! - **Configuration**: a [`Runtime`] names the store, the dead-letter sink, the [`Observer`]
//!   and the jitter's seed; [`Runtime::install`] makes it the process default, and
//!   [`Runtime::scope`] uses it for one future.
//! - **Observing**: an [`Observer`] sees every [`Event`] (attempts, retries, replays, claims,
//!   dead letters, breaker transitions); `observe::metrics` (feature `metrics`) and
//!   `observe::tracing` (feature `tracing`) are built-in views.
//! - **Inside a guarded body**: [`attempt()`] tells which attempt (and delivery) is running, and
//!   [`fence()`] the claim's generation, for a downstream that refuses a stalled worker's write.
//! - **Around a dependency**: a [`CircuitBreaker`] in a `static`, named by `#[retry(breaker =
//!   ..)]`, and a [`RetryBudget`] (`#[retry(retry_budget = ..)]`) that keeps retries to a share
//!   of the calls. With the `redis` feature, `share` makes either one for every process of a
//!   fleet (`jobguard::fleet`).
//! - **Errors**: jobguard's own failures are one [`Error`].
//!
//! Maintainers: the workspace, the module graph and where each protocol lives are in the
//! repository's `ARCHITECTURE.md`.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "apalis")]
pub mod apalis;
mod attempt;
mod bounds;
pub mod breaker;
pub mod budget;
mod claim;
pub mod classify;
#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
pub mod console;
pub mod dead_letter;
mod error;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod fleet;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod idempotency;
pub mod jitter;
#[cfg(feature = "lapin")]
#[cfg_attr(docsrs, doc(cfg(feature = "lapin")))]
pub mod lapin;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
pub mod observe;
pub mod policy;
mod record;
mod retry;
pub mod runtime;
pub mod step;
pub mod store;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use attempt::{Attempt, Delivery, attempt, fence};
pub use breaker::{BreakerState, CircuitBreaker};
pub use budget::RetryBudget;
pub use classify::{Transient, Verdict, http_verdict};
#[cfg(feature = "redis")]
pub use dead_letter::redis::{RedisDeadLetters, RedriveError};
pub use dead_letter::{DeadLetter, DeadLetterSink, GiveUp, LogDeadLetters, MemoryDeadLetters};
pub use dead_letter::{FnDeadLetters, from_fn};
pub use error::Error;
pub use idempotency::Idempotent;
pub use jitter::Jitter;
pub use observe::{Event, Observer};
pub use policy::Policy;
pub use runtime::{Runtime, RuntimeBuilder};
pub use step::step;
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PgStore;
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;
pub use store::{ClaimOptions, Claimed, Letter, StepKey, StepRecord, Store, StoreKey};

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
/// `on_ok` (a path to `fn(&T) -> Verdict` or `-> bool`: an `Ok` value it flags is retried, and
/// the last one returned when the attempts run out), `budget`, `timeout`, `breaker`,
/// `retry_budget` (a [`RetryBudget`]: each call deposits, each retry withdraws),
/// `dead_letter`, `payload` (the arguments a dead letter carries for a redrive:
/// `payload = (order_id, amount)`), `name` (the job's one name in metrics, tracing, events and
/// dead letters; default: the function's module path and name), `crate`. The README's table
/// gives each one. Inside the body, [`attempt()`] tells which attempt is running.
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
/// The expansion itself is one inline loop over the runtime's retry engine (one `Round` future
/// per attempt): see the README, whose copy is generated from the expansion snapshots.
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
/// Arguments: `key` (required), `scope`, `ttl`, `lease`, `crashes`, `fingerprint`, `store`,
/// `in_progress = fail | wait("10s")`, `transaction` (feature `postgres`), `crate`. Written
/// with `#[retry]`, in either order, the key is checked once and the retry loop runs inside the claim.
///
/// `crashes = N` (default 3; `0` never poisons): a claim whose lease lapsed without a result or
/// a release was held by a worker that died running the job; the next claim takes it over and
/// counts it. The claim that finds `N` counted is refused with [`Error::Poisoned`]: the job is
/// dead-lettered once with [`GiveUp::Crashed`] and never runs again (for its `ttl`), so a job
/// that kills its worker cannot take the worker pool down in a loop. Inside the body,
/// [`fence()`] gives the claim's generation, for a downstream that refuses writes from a worker
/// whose lease lapsed.
///
/// `transaction = tx` names a parameter of type `&mut sqlx::PgConnection` or
/// `&mut sqlx::Transaction<'_, Postgres>`: the key is claimed in that transaction with
/// [`PgStore::in_transaction`](crate::store::postgres::PgStore::in_transaction), the body's writes
/// and the result go in it, and the caller commits. Inside the body `tx` is the transaction's
/// `&mut PgConnection`; with `#[retry]` the attempts share one
/// [`Savepoint`](crate::store::postgres::Savepoint), which each later attempt rolls back to, so
/// a failed attempt, one cut by `timeout` and one whose `Ok` was retried leave no writes.
/// A job whose error type is written `sqlx::Error` is a compile error in words: it cannot
/// carry jobguard's own errors. Called with a
/// `&mut PgConnection` outside any transaction (a pool connection), the function gets a
/// transaction of its own, begun with the claim in the same round trip and committed after the
/// result ([`PgStore::begin`](crate::store::postgres::PgStore::begin)): one round trip beyond
/// the body's statements, where joining the caller's transaction costs two. Without the
/// `postgres` feature, `transaction` is a compile error that says so.
///
/// The default `scope` is the function's module path and name: moving or renaming the function
/// changes it, and with it every stored key. Jobs whose keys must outlive a refactor pin
/// `scope = "..."`.
///
/// # Equivalent code without the attribute
///
/// ```
/// # use jobguard::idempotency::Idempotent;
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

/// Makes an `async fn` a durable step of the job it runs in: its `Ok` value is recorded under
/// the job's key, and every later run of that job (a retry, a redelivery, a redrive) returns
/// the recorded value without running it.
///
/// ```
/// # use std::sync::atomic::{AtomicU32, Ordering};
/// # static CAPTURES: AtomicU32 = AtomicU32::new(0);
/// #[jobguard::step(name = "capture.v1")]
/// async fn capture(order_id: &str, amount: u64) -> Result<String, jobguard::Error> {
///     CAPTURES.fetch_add(1, Ordering::Relaxed); // the gateway's call
///     Ok(format!("payment {order_id}/{amount}"))
/// }
///
/// #[jobguard::idempotent(key = order_id)]
/// async fn checkout(order_id: &str, fail: bool) -> Result<String, jobguard::Error> {
///     let payment = capture(order_id, 100).await?;
///     if fail {
///         return Err(jobguard::Error::Timeout); // released: a redelivery runs the job again
///     }
///     Ok(payment)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// assert!(checkout("order-A", true).await.is_err());
/// assert_eq!(checkout("order-A", false).await.unwrap(), "payment order-A/100");
/// assert_eq!(CAPTURES.load(Ordering::Relaxed), 1); // the redelivery replayed the capture
/// # }
/// ```
///
/// Arguments: `name` (a string literal: the step's stored name, default the function's name;
/// version it, `"capture.v2"`, when a change makes an old value wrong to replay) and `crate`.
/// The function is an `async fn` returning `Result<T, E>`, `T: Serialize + DeserializeOwned`,
/// `E: From<jobguard::Error>` (a step can fail on its own: a lost lease, a record that does not
/// decode). `#[retry]` on the same function retries the step alone, inside it, in either
/// order. The [`step`](mod@step) module holds the rules: occurrences, fencing, what ends a
/// step's record. Outside a job a step just runs.
///
/// # Equivalent code without the attribute
///
/// ```
/// # async fn gateway(_: &str) -> Result<String, jobguard::Error> { Ok(String::new()) }
/// async fn capture(order_id: &str) -> Result<String, jobguard::Error> {
///     jobguard::step("capture.v1", async { gateway(order_id).await }).await
/// }
/// ```
#[cfg(feature = "macros")]
#[doc(inline)]
pub use jobguard_macros::step;

/// The statements of `#[idempotent(transaction = ..)]`'s expansion, passed through: the
/// `postgres` feature is on. Not public API; expansions call it as `__private::transaction!`.
#[cfg(feature = "postgres")]
#[doc(hidden)]
#[macro_export]
macro_rules! __jobguard_transaction {
    ($($statements:tt)*) => { $($statements)* };
}

/// The statements of `#[idempotent(transaction = ..)]`'s expansion, replaced by one error in
/// words: the `postgres` feature is off, so there is no `PgStore` to expand to. Not public API.
#[cfg(not(feature = "postgres"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __jobguard_transaction {
    ($($statements:tt)*) => {
        ::core::compile_error!(
            "`transaction = ...` needs jobguard's `postgres` feature: \
             jobguard = { version = \"...\", features = [\"postgres\"] }"
        )
    };
}

/// What expanded attributes call. Not public API: it changes without notice. Nothing in this
/// crate calls it; every item lives in its own module.
#[doc(hidden)]
pub mod __private {
    pub use crate::__jobguard_transaction as transaction;
    pub use crate::bounds::*;
    pub use crate::idempotency::Idempotent;
    pub use crate::observe::Job;
    pub use crate::retry::{
        Guard, IsRetryBudget, Payload, Retry, Spec, accept, breaker, retry_budget, sink,
    };
    pub use crate::step::step;
    pub use crate::store::DefaultScope;
    #[cfg(feature = "postgres")]
    pub use crate::store::postgres::{PgStore, Savepoint};
    pub use core::ops::ControlFlow;
    pub use core::time::Duration;
    #[cfg(feature = "postgres")]
    pub use sqlx::PgConnection;
}
