//! Idempotency stores: where claims and completed results live.
//!
//! A [`Store`] keeps, for each `(scope, key)`, either a live **claim** (a lease held by one
//! worker, identified by a random token) or a **completed** record (the serialized result, kept
//! for the TTL). Every change after the claim is a compare-and-set on the token, so a worker whose
//! lease lapsed can never overwrite or delete its successor's record.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
pub(crate) mod record;
#[cfg(feature = "redis")]
pub mod redis;

/// The boxed future a store returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, crate::Error>> + Send + 'a>>;

/// One idempotency key in its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreKey<'a> {
    /// The namespace: `#[idempotent(scope = ...)]`, by default the function's module path and
    /// name with `::` written `.`. Never contains `:`.
    pub scope: &'a str,
    /// The key's value, as the job computed it.
    pub key: &'a str,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller now holds the key for the lease and must run the job.
    Acquired,
    /// The job already completed: its stored result, to replay.
    Completed(Vec<u8>),
    /// Another worker holds a live claim, which lapses in `retry_in` at most.
    InProgress {
        /// The time left on the other worker's lease.
        retry_in: Duration,
    },
    /// The key is claimed or completed with a different fingerprint.
    KeyReused,
}

/// An idempotency store. Implemented by [`MemoryStore`](memory::MemoryStore) and
/// [`RedisStore`](redis::RedisStore) (feature `redis`).
///
/// Implementations must make [`claim`](Store::claim) atomic (two concurrent claims of one free
/// key: exactly one is `Acquired`), and [`complete`](Store::complete), [`release`](Store::release)
/// and [`renew`](Store::renew) conditional on `token` still holding the claim.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "`store = ...` takes a `jobguard::Store`",
    note = "use `jobguard::MemoryStore`, `jobguard::RedisStore` (feature `redis`), or implement `jobguard::Store` for your own"
)]
pub trait Store: Send + Sync {
    /// Claims `key` for `lease` under `token`, unless it is claimed or completed. `fingerprint`,
    /// when given, is kept with the claim and the record; a claim with a different one finds
    /// [`Claim::KeyReused`].
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, Claim>;

    /// Replaces `token`'s claim with the completed `record`, kept for `ttl`.
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) when `token` no longer holds the claim.
    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()>;

    /// Deletes `token`'s claim so a redelivery can run the job; nothing when `token` no longer
    /// holds it.
    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()>;

    /// Extends `token`'s claim to `lease` from now. [`Error::LeaseLost`](crate::Error::LeaseLost)
    /// when `token` no longer holds it.
    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()>;
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        (**self).claim(key, token, fingerprint, lease)
    }
    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        (**self).complete(key, token, record, ttl)
    }
    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        (**self).release(key, token)
    }
    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        (**self).renew(key, token, lease)
    }
}

impl<S: Store + ?Sized> Store for &S {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        (**self).claim(key, token, fingerprint, lease)
    }
    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        (**self).complete(key, token, record, ttl)
    }
    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        (**self).release(key, token)
    }
    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        (**self).renew(key, token, lease)
    }
}
