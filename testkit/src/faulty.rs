//! A `MemoryStore` whose operations can be made to fail: an unreachable store, failed writes,
//! a lost lease. For the idempotency guard's and the HTTP layer's tests.

use jobguard::store::{KeyInfo, StepKey, StepRecord, StoreFuture};
use jobguard::{ClaimOptions, Claimed, Error, MemoryStore, Store, StoreKey};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// A `MemoryStore` whose operations can be made to fail.
#[derive(Clone, Default)]
pub struct Faulty {
    /// The store the operations go to when they do not fail.
    pub inner: MemoryStore,
    /// Claims, forgiving and counting attempts fail with `Error::Store`, as an unreachable
    /// store's do.
    pub down: Arc<AtomicBool>,
    /// The next this many completions fail with `Error::Store`.
    pub complete_fails: Arc<AtomicU32>,
    /// Renewals, completions and recorded steps find the lease lost.
    pub lose_lease: Arc<AtomicBool>,
    /// Releases take a second (on tokio's clock), as a store across a slow network's would.
    pub slow_release: Arc<AtomicBool>,
    /// Notified as each completion is written, so that a test can wait for a result stored by a
    /// task it cannot await. (A completion before the test waits leaves a permit: no race.)
    pub completed: Arc<Notify>,
}

impl Store for Faulty {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Error::Store("connection refused".into())) });
        }
        self.inner.claim(key, token, options)
    }
    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        if self.lose_lease.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Error::LeaseLost) });
        }
        if self.complete_fails.load(Ordering::SeqCst) > 0 {
            self.complete_fails.fetch_sub(1, Ordering::SeqCst);
            return Box::pin(async { Err(Error::Store("write failed".into())) });
        }
        let completed = self.completed.clone();
        let write = self.inner.complete(key, token, record, ttl);
        Box::pin(async move {
            let written = write.await;
            if written.is_ok() {
                completed.notify_one();
            }
            written
        })
    }
    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        let slow = self.slow_release.load(Ordering::SeqCst);
        Box::pin(async move {
            if slow {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            self.inner.release(key, token).await
        })
    }
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Error::Store("connection refused".into())) });
        }
        self.inner.forgive(key)
    }
    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        if self.lose_lease.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Error::LeaseLost) });
        }
        self.inner.renew(key, token, lease)
    }
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.inner.lookup(key)
    }
    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
        self.inner.lettered(key)
    }
    fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
        self.inner.inspect(key)
    }
    fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        self.inner.forget(key)
    }
    fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Error::Store("connection refused".into())) });
        }
        self.inner.attempted(key, token)
    }
    fn record_step<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        step: StepKey<'a>,
        value: &'a [u8],
    ) -> StoreFuture<'a, ()> {
        if self.lose_lease.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Error::LeaseLost) });
        }
        self.inner.record_step(key, token, step, value)
    }
    fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
        self.inner.steps(key)
    }
}
