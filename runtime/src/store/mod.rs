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

/// How a counted claim ([`Store::claim_with`]) is made.
///
/// ```
/// use jobguard::store::ClaimOptions;
/// use std::time::Duration;
///
/// let options = ClaimOptions::new(Duration::from_secs(30))
///     .fingerprint(Some("3f2a"))
///     .crashes(5);
/// assert_eq!(options.lease, Duration::from_secs(30));
/// assert_eq!(options.crashes, 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimOptions<'a> {
    /// A digest of the arguments, kept with the claim and the record; a claim with another one
    /// finds [`Claimed::KeyReused`].
    pub fingerprint: Option<&'a str>,
    /// How long the claim holds the key unless renewed.
    pub lease: Duration,
    /// How long the key's history (its generation and crash count) is kept, counted from the
    /// claim (or the lease's end, if later), and how long a poisoned key stays refused, counted
    /// from the claim that poisoned it: the job's TTL.
    pub ttl: Duration,
    /// Abandoned claims after which the key is poisoned: the claim that finds this many is
    /// refused with [`Claimed::Poisoned`]. `0` never poisons.
    pub crashes: u32,
}

/// The crash limit of a claim unless set: a job whose worker died running it three times is not
/// run a fourth time.
pub const DEFAULT_CRASHES: u32 = 3;

impl<'a> ClaimOptions<'a> {
    /// A claim for `lease`, without a fingerprint, with the default TTL
    /// ([`DEFAULT_TTL`](crate::idempotency::DEFAULT_TTL)) and crash limit ([`DEFAULT_CRASHES`]).
    pub fn new(lease: Duration) -> Self {
        ClaimOptions {
            fingerprint: None,
            lease,
            ttl: record::DEFAULT_TTL,
            crashes: DEFAULT_CRASHES,
        }
    }

    /// The arguments' digest.
    pub fn fingerprint(mut self, fingerprint: Option<&'a str>) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// How long the key's history and a poisoned key are kept.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The crash limit; `0` never poisons.
    pub fn crashes(mut self, crashes: u32) -> Self {
        self.crashes = crashes;
        self
    }
}

/// What a counted claim ([`Store::claim_with`]) found.
///
/// Beyond [`Claim`], it numbers the claims of a key and counts the abandoned ones: a claim whose
/// lease lapsed without [`complete`](Store::complete) or [`release`](Store::release) was held by
/// a worker that died (or stalled past its lease). The next claim takes it over and counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The caller now holds the key and must run the job.
    Acquired {
        /// This claim's number among the key's claims: 1 for the first, and larger for each
        /// claim after it (a takeover of an abandoned claim, a claim after a release). A
        /// downstream that remembers the largest generation it saw can refuse writes from an
        /// older one (`jobguard::fence()` gives it to the body). `0` from a store that does not
        /// number claims.
        generation: u64,
        /// Abandoned claims counted so far, this takeover included.
        crashes: u32,
    },
    /// The job already completed: its stored result, to replay.
    Completed(Vec<u8>),
    /// Another worker holds a live claim, which lapses in `retry_in` at most.
    InProgress {
        /// The time left on the other worker's lease.
        retry_in: Duration,
    },
    /// The key is claimed or completed with a different fingerprint.
    KeyReused,
    /// The key's abandoned claims reached the crash limit: the job is not run again.
    Poisoned {
        /// The abandoned claims counted.
        crashes: u32,
        /// `true` for the one claim that found the limit reached (and poisoned the key): that
        /// caller reports the job, once; every later claim finds `false`.
        first: bool,
    },
}

/// An idempotency store. Implemented by [`MemoryStore`](memory::MemoryStore),
/// [`RedisStore`](redis::RedisStore) (feature `redis`) and `PgStore` (feature `postgres`).
///
/// Implementations must make [`claim`](Store::claim) atomic (two concurrent claims of one free
/// key: exactly one is `Acquired`), and [`complete`](Store::complete), [`release`](Store::release)
/// and [`renew`](Store::renew) conditional on `token` still holding the claim.
///
/// The stores of this crate also implement [`claim_with`](Store::claim_with), which numbers a
/// key's claims (the fence) and counts abandoned ones (poison jobs). A store that implements only
/// `claim` still works: its claims have generation `0` and no crash is counted.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "`store = ...` takes a `jobguard::Store`",
    note = "use `jobguard::MemoryStore`, `jobguard::RedisStore` (feature `redis`), `jobguard::PgStore` (feature `postgres`), or implement `jobguard::Store` for your own"
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

    /// Claims `key` like [`claim`](Store::claim), numbering the claim and counting abandoned
    /// claims: a claim whose lease lapsed is taken over and counted, and once `options.crashes`
    /// are counted the key is poisoned ([`Claimed::Poisoned`], `first` for the claim that
    /// poisoned it) and refused for `options.ttl`. A release keeps the key's generation and crash
    /// count until the claim's `options.ttl` runs out, so generations only grow while the key's
    /// history is kept.
    ///
    /// Once the history has expired (the TTL, counted from the claim, or a completed record's
    /// TTL), the crash count starts again at 0, and the generation may start again at 1: it
    /// does in [`RedisStore`](crate::RedisStore) and in a [`MemoryStore`](memory::MemoryStore)
    /// whose sweep has dropped the record; `PgStore` and a record not yet swept go on from the
    /// last one. A `MemoryStore` short of room also drops a released key's history first, and a
    /// lapsed claim when nothing else can go; a poisoned key is kept for its TTL, like a live
    /// claim, so that a job is poisoned and lettered once. A downstream that keeps the largest
    /// fence it saw should therefore forget it after the job's TTL.
    ///
    /// The default implementation calls [`claim`](Store::claim): generation `0`, no crash
    /// counted.
    fn claim_with<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        let claim = self.claim(key, token, options.fingerprint, options.lease);
        Box::pin(async move {
            Ok(match claim.await? {
                Claim::Acquired => Claimed::Acquired {
                    generation: 0,
                    crashes: 0,
                },
                Claim::Completed(bytes) => Claimed::Completed(bytes),
                Claim::InProgress { retry_in } => Claimed::InProgress { retry_in },
                Claim::KeyReused => Claimed::KeyReused,
            })
        })
    }

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

    /// The record `key`'s job completed with (what a replay would return), read without claiming,
    /// renewing or releasing anything: `None` when the key is free, claimed, released or
    /// poisoned, or its record expired. For a dashboard or a status endpoint, which must not
    /// hold a key a delivery may be claiming at the same moment.
    ///
    /// The stores of this crate implement it; a store of your own that does not fails with
    /// [`Error::Store`](crate::Error::Store) saying so. The guard also asks it whether a key
    /// refused as [`KeyReused`](Claimed::KeyReused) was completed (which settles a runner's
    /// delivery): with a store that cannot tell, such a delivery is not settled, and the runner
    /// delivers it again until its own limit, refused each time.
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        let _ = key;
        Box::pin(std::future::ready(Err(crate::Error::Store(
            "this store cannot read a key without claiming it (Store::lookup is not implemented)"
                .into(),
        ))))
    }

    /// Forgives `key`'s crashes: a poisoned key becomes free, and the key's crash count starts
    /// again at 0, so that its job runs again and takes [`ClaimOptions::crashes`] more
    /// abandoned claims to be poisoned again. `true` when there was something to forgive: the
    /// key was poisoned, had crashes counted, or held a claim whose lease lapsed (which the
    /// next claim would have counted, and which is forgiven with them).
    ///
    /// Left exactly as they are, and `false`: a completed record (it still replays), a live
    /// claim (its lease has not ended: its worker may be running the job; forgive again once
    /// it ends, if it crashed), a free key without crashes, and a key the store does not hold.
    /// The key's generation is kept, so the fence only grows while its history is kept: the
    /// next claim is numbered one more than the last. (The history of a forgiven key is kept
    /// as a released key's is, until the TTL of the claim that made it, or that poisoned it; a
    /// [`MemoryStore`](memory::MemoryStore) short of room drops it first, as it does a released
    /// key's: see [`claim_with`](Store::claim_with).)
    ///
    /// One atomic operation against concurrent claims, for an operator (a job refused by
    /// mistake, such as one that only ran beside a poison job in a worker process that died)
    /// and for a redrive of the job's `crashed` dead letter, which forgives the key itself (see
    /// [`idempotency`](crate::idempotency#forgiving-a-key)).
    /// [`idempotency::forgive`](crate::idempotency::forgive) takes the job's name and key
    /// instead of a [`StoreKey`].
    ///
    /// The stores of this crate implement it; a store of your own that does not fails with
    /// [`Error::Store`](crate::Error::Store) saying so.
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        let _ = key;
        Box::pin(std::future::ready(Err(crate::Error::Store(
            "this store cannot forgive a key's crashes (Store::forgive is not implemented)".into(),
        ))))
    }
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
    fn claim_with<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        (**self).claim_with(key, token, options)
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
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        (**self).lookup(key)
    }
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        (**self).forgive(key)
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
    fn claim_with<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        (**self).claim_with(key, token, options)
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
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        (**self).lookup(key)
    }
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        (**self).forgive(key)
    }
}

impl Claimed {
    /// The answer of [`Store::claim`] for this outcome: a claim that does not count crashes.
    /// [`Error::Poisoned`](crate::Error::Poisoned) for a poisoned key.
    pub fn into_claim(self) -> Result<Claim, crate::Error> {
        Ok(match self {
            Claimed::Acquired { .. } => Claim::Acquired,
            Claimed::Completed(bytes) => Claim::Completed(bytes),
            Claimed::InProgress { retry_in } => Claim::InProgress { retry_in },
            Claimed::KeyReused => Claim::KeyReused,
            Claimed::Poisoned { crashes, .. } => return Err(crate::Error::Poisoned { crashes }),
        })
    }
}

/// The default scope of one `#[idempotent]` function (its module path and name), in a `static`
/// per function: the first call of each registers it, so that two functions that end up with
/// one default scope are found. Nested functions of one name in one module, or methods of one
/// name in two `impl` blocks of one module, get the same default, and their keys would collide:
/// a call of one would replay the other's result. Once a second function registers a name,
/// calls of both fail with [`Error::Config`](crate::Error::Config) (and the log says so once)
/// until each pins a `scope`. Only functions that run in this process are compared; a pinned
/// `scope` is never checked, as two functions may share one on purpose.
#[doc(hidden)]
pub struct DefaultScope {
    name: &'static str,
    /// [`DefaultScope::UNCHECKED`], [`DefaultScope::OWN`] or [`DefaultScope::SHARED`].
    state: std::sync::atomic::AtomicU8,
}

impl DefaultScope {
    const UNCHECKED: u8 = 0;
    const OWN: u8 = 1;
    const SHARED: u8 = 2;

    /// The default scope `name` of the function whose `static` this is.
    pub const fn new(name: &'static str) -> Self {
        DefaultScope {
            name,
            state: std::sync::atomic::AtomicU8::new(Self::UNCHECKED),
        }
    }

    /// The scope's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// `Ok` while no other function has this default scope; one atomic load once registered.
    pub fn check(&'static self) -> Result<(), crate::Error> {
        use std::collections::hash_map::Entry;
        use std::sync::atomic::Ordering;
        match self.state.load(Ordering::Acquire) {
            Self::OWN => return Ok(()),
            Self::SHARED => return Err(self.shared()),
            _ => {}
        }
        static NAMES: std::sync::Mutex<
            Option<std::collections::HashMap<&'static str, &'static DefaultScope>>,
        > = std::sync::Mutex::new(None);
        let mut names = NAMES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match names
            .get_or_insert_with(std::collections::HashMap::new)
            .entry(self.name)
        {
            Entry::Vacant(vacant) => {
                vacant.insert(self);
                self.state.store(Self::OWN, Ordering::Release);
                Ok(())
            }
            // Registered by another call of this function; another function may have found
            // the name shared since this call read the state.
            Entry::Occupied(own) if std::ptr::eq(*own.get(), self) => {
                match self.state.load(Ordering::Acquire) {
                    Self::SHARED => Err(self.shared()),
                    _ => Ok(()),
                }
            }
            Entry::Occupied(other) => {
                if other.get().state.swap(Self::SHARED, Ordering::AcqRel) != Self::SHARED {
                    crate::observe::log_error(format_args!("jobguard: {}", self.shared()));
                }
                self.state.store(Self::SHARED, Ordering::Release);
                Err(self.shared())
            }
        }
    }

    fn shared(&self) -> crate::Error {
        crate::Error::Config(format!(
            "two #[idempotent] functions have the default scope `{}` (nested functions of one \
             name, or methods of one name in two impl blocks of one module), so their keys \
             would collide; give each its own with `#[idempotent(scope = \"...\")]`",
            self.name
        ))
    }
}
