//! Idempotency stores: where claims and completed results live.
//!
//! A [`Store`] keeps one record per `(scope, key)`. Every guarded entry point (`#[idempotent]`,
//! the HTTP layer, a job runner's) goes through the same claim session on it,
//! so a store is the whole contract between jobguard and a database: implement the seven
//! methods of [`Store`] and pass [`testing::check_store`](crate::testing) (feature `testing`).
//!
//! # The states of a key
//!
//! ```text
//!                 claim                      complete(token)
//!   free ───────────────────────▶ claimed ─────────────────────▶ completed ──┐
//!    ▲  ▲        (generation n+1)  │  │  │                          (replayed  │
//!    │  │                          │  │  │ renew(token): lease     for ttl)   │ ttl ends
//!    │  └──── release(token) ──────┘  │  │ extended                           │
//!    │        (history kept)          │  │                                    │
//!    │                                │  └─ lease lapses, next claim takes ───┘
//!    │                                │     it over: crash counted, generation n+1
//!    │     forgive                    │
//!    └──────────── poisoned ◀─────────┘  the takeover that finds `crashes` counted
//!                  (refused for ttl;     poisons the key instead
//!                   its letter handed
//!                   out until `lettered`)
//! ```
//!
//! * **free**: no record, an expired one, or a released one. A released key keeps its
//!   *history* (its generation and crash count) until the TTL of the claim that made it, so
//!   that generations only grow and crashes add up across deliveries.
//! * **claimed**: a live lease held by one token. Only that token may
//!   [`complete`](Store::complete), [`release`](Store::release) or [`renew`](Store::renew) it
//!   (compare-and-set on the token), so a worker whose lease lapsed can never overwrite or
//!   delete its successor's record. A claim whose lease lapsed was abandoned by a dead worker:
//!   the next claim takes it over and counts a crash.
//! * **completed**: the serialized result, replayed to every later claim until the TTL ends.
//! * **poisoned**: the key's abandoned claims reached the crash limit. Every claim is refused
//!   for the TTL; the job is dead-lettered once. The *letter role* is handed to one claimer at
//!   a time ([`Claimed::Poisoned`] with [`Letter::Yours`], held for the claim's lease), and again
//!   after that lease, until a claimer confirms the letter written
//!   ([`lettered`](Store::lettered)): a sink that fails does not lose the letter.
//!
//! A fingerprint (a digest of the arguments) is kept with a claim and a completed record: a
//! claim with another one finds [`Claimed::KeyReused`].
//!
//! # Durable steps
//!
//! A job's steps ([`crate::step()`]) live in its record: recorded by the claim's holder alone
//! ([`Store::record_step`], a compare-and-set on the token like `complete`), kept through a
//! release and a takeover, returned with the next acquired claim (in
//! [`Claimed::Acquired`], so a resumed job learns them in the claim's round trip; an operator
//! reads them with [`Store::steps`]), and dropped when the job completes, is forgiven or
//! forgotten, or its history expires.
//!
//! # Attempts
//!
//! A key's record also counts the attempts of its job over every claim: the claim that
//! acquires the key counts its first attempt ([`Claimed::Acquired`]'s `attempts`), and the
//! holder counts each further attempt inside its claim with [`Store::attempted`] (a `#[retry]`
//! inside `#[idempotent]` does, before each retry). A dead letter reports that count, whatever
//! the broker counted: a delivery cut short by a crash is in it too.

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

/// How a claim ([`Store::claim`]) is made.
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

/// What a claim ([`Store::claim`]) found.
///
/// A store numbers the claims of a key and counts the abandoned ones: a claim whose lease lapsed
/// without [`complete`](Store::complete) or [`release`](Store::release) was held by a worker
/// that died (or stalled past its lease). The next claim takes it over and counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The caller now holds the key and must run the job.
    Acquired {
        /// This claim's number among the key's claims: 1 for the first, and larger for each
        /// claim after it (a takeover of an abandoned claim, a claim after a release). A
        /// downstream that remembers the largest generation it saw can refuse writes from an
        /// older one (`jobguard::fence()` gives it to the body).
        generation: u64,
        /// Abandoned claims counted so far, this takeover included.
        crashes: u32,
        /// The job's attempts counted so far over every claim of the key, this claim's first
        /// included (1 for a key without history); 0 when the store keeps no count for this
        /// key. See [`Store::attempted`].
        attempts: u32,
        /// The job's durable steps recorded by earlier claims ([`Store::record_step`]), in any
        /// order: a resumed job replays them without running them. Empty for a fresh key;
        /// `None` when the store keeps no steps for this key (a step of its job then fails
        /// with [`Error::Config`](crate::Error::Config) before it runs).
        steps: Option<Vec<StepRecord>>,
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
        /// The job's attempts counted over every claim ([`Store::attempted`]), for its
        /// `crashed` dead letter; 0 when the store keeps no count for this key.
        attempts: u32,
        /// Who dead-letters the job: see [`Letter`].
        letter: Letter,
    },
}

/// Who writes a poisoned job's one dead letter ([`Claimed::Poisoned`]).
///
/// The store hands the *letter role* to the claim that poisoned the key, and again, after that
/// claim's lease, to the next claimer while no letter is confirmed
/// ([`Store::lettered`]): a letter whose sink failed is written by a later delivery, never lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Letter {
    /// This claimer holds the role: it writes the letter, then confirms it with
    /// [`Store::lettered`].
    Yours,
    /// Another claimer holds the role, for its lease; no letter is confirmed yet.
    Held,
    /// The letter is confirmed: the job is settled.
    Written,
}

/// What a key's record says, read without changing it ([`Store::inspect`]): for an operator's
/// console or a status page.
///
/// ```
/// use jobguard::store::{KeyInfo, KeyState};
///
/// let free = KeyInfo::free();
/// assert_eq!(free.state, KeyState::Free);
/// assert_eq!(free.state.as_str(), "free");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyInfo {
    /// Which of [the states of a key](self#the-states-of-a-key) it is in.
    pub state: KeyState,
    /// The last claim's number, when the store keeps it (a completed record of the Redis
    /// store does not).
    pub generation: Option<u64>,
    /// Abandoned claims counted.
    pub crashes: u32,
    /// For a claim, the time left on its lease: zero when the lease has ended (the claim was
    /// abandoned, and the next claim takes it over and counts a crash).
    pub lease_left: Option<Duration>,
    /// For a completed key, the stored result (what a replay returns).
    pub result: Option<Vec<u8>>,
}

impl KeyInfo {
    /// A key the store does not hold: free, without history.
    pub fn free() -> Self {
        KeyInfo {
            state: KeyState::Free,
            generation: None,
            crashes: 0,
            lease_left: None,
            result: None,
        }
    }

    /// A key in `state` with this history, no lease and no result.
    pub fn new(state: KeyState, generation: Option<u64>, crashes: u32) -> Self {
        KeyInfo {
            state,
            generation,
            crashes,
            lease_left: None,
            result: None,
        }
    }

    /// The info with the claim's time left on its lease.
    pub fn lease_left(mut self, left: Duration) -> Self {
        self.lease_left = Some(left);
        self
    }

    /// The info with the completed key's stored result.
    pub fn result(mut self, result: Vec<u8>) -> Self {
        self.result = Some(result);
        self
    }
}

/// The state of a key, as [`KeyInfo`] says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyState {
    /// No record, an expired one or a released one: the next claim runs the job.
    Free,
    /// A claim holds the key (its lease may have ended: see [`KeyInfo::lease_left`]).
    Claimed,
    /// The job completed: its result is replayed.
    Completed,
    /// The key's abandoned claims reached the crash limit: refused until forgiven or expired.
    Poisoned,
}

impl KeyState {
    /// `free`, `claimed`, `completed` or `poisoned`.
    pub const fn as_str(self) -> &'static str {
        match self {
            KeyState::Free => "free",
            KeyState::Claimed => "claimed",
            KeyState::Completed => "completed",
            KeyState::Poisoned => "poisoned",
        }
    }
}

/// An idempotency store. Implemented by [`MemoryStore`](memory::MemoryStore),
/// [`RedisStore`](redis::RedisStore) (feature `redis`) and `PgStore` (feature `postgres`); a
/// store of your own implements these twelve methods, following [the states of a
/// key](self#the-states-of-a-key), and passes [`testing::check_store`](crate::testing) (feature
/// `testing`), the suite the built-in stores pass.
///
/// Each method is one atomic step on one key: [`claim`](Store::claim) must be (two concurrent
/// claims of one free key: exactly one is `Acquired`), and [`complete`](Store::complete),
/// [`release`](Store::release) and [`renew`](Store::renew) act only while `token` holds a live
/// claim. Time is the store's own clock (a server's, or `tokio::time` in memory). An error
/// reaching the store is [`Error::Store`](crate::Error::Store); a record it cannot read is
/// [`Error::Corrupt`](crate::Error::Corrupt).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "`store = ...` takes a `jobguard::Store`",
    note = "use `jobguard::MemoryStore`, `jobguard::RedisStore` (feature `redis`), `jobguard::PgStore` (feature `postgres`), or implement `jobguard::Store` for your own"
)]
pub trait Store: Send + Sync {
    /// Claims `key` for `options.lease` under `token`:
    ///
    /// * free: [`Claimed::Acquired`], numbered one more than the key's last claim (1 for a key
    ///   without history), with the crashes counted so far, the attempts counted so far plus
    ///   one (this claim's first), and the job's recorded steps;
    /// * completed: [`Claimed::Completed`] with the record;
    /// * claimed with a live lease: [`Claimed::InProgress`] with the time left on it;
    /// * a fingerprint other than the one kept (both present): [`Claimed::KeyReused`];
    /// * claimed with a lapsed lease: taken over, one crash counted, unless that makes
    ///   `options.crashes` (not `0`): then the key is poisoned for `options.ttl` and this claim
    ///   finds [`Claimed::Poisoned`] with [`Letter::Yours`];
    /// * poisoned: [`Claimed::Poisoned`], with [`Letter::Yours`] if no letter is confirmed and
    ///   no other claimer holds the role (it is held for the lease of the claim that got it),
    ///   else [`Letter::Held`] or [`Letter::Written`].
    ///
    /// A claim keeps the key's history for `options.ttl` (counted from the claim, or the
    /// lease's end if later). Once the history has expired, the count of crashes starts again
    /// at 0, and the generation may start again at 1: a downstream that keeps the largest
    /// fence it saw should forget it after the job's TTL.
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed>;

    /// Replaces `token`'s claim with the completed `record`, kept for `ttl`.
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) when `token` no longer holds the claim.
    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()>;

    /// Frees `token`'s claim so a redelivery can run the job, keeping the key's history;
    /// nothing when `token` no longer holds it.
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
    /// hold a key a delivery may be claiming at the same moment. The guard also asks it whether
    /// a key refused as [`KeyReused`](Claimed::KeyReused) was completed (which settles a
    /// runner's delivery).
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>>;

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
    /// next claim is numbered one more than the last.
    ///
    /// One atomic operation against concurrent claims, for an operator (a job refused by
    /// mistake, such as one that only ran beside a poison job in a worker process that died)
    /// and for a redrive of the job's `crashed` dead letter, which forgives the key itself (see
    /// [`idempotency`](crate::idempotency#forgiving-a-key)).
    /// [`idempotency::forgive`](crate::idempotency::forgive) takes the job's name and key
    /// instead of a [`StoreKey`].
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool>;

    /// Confirms that a poisoned key's dead letter was written: later claims find
    /// [`Claimed::Poisoned`] without the letter role. Nothing for a key that is not poisoned.
    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()>;

    /// What `key`'s record says ([`KeyInfo`]), read without claiming, renewing or releasing
    /// anything, for an operator's console.
    fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo>;

    /// Forgets `key` whole: its claim, its result, its history, crashes, attempts and steps, as
    /// if its record had expired, so that the next claim runs the job again (a completed job
    /// too) with no crash counted (its generation may go on from the forgotten one's, as after
    /// an expiry). `true` when the store held a record of it. For an operator who knows the
    /// job's effect is gone (a refund, a rollback); a worker holding a live claim loses it (its
    /// `complete` fails with [`Error::LeaseLost`](crate::Error::LeaseLost)).
    fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool>;

    /// Counts one more attempt of the job whose claim `token` holds on `key`, and returns the
    /// key's count of attempts over every claim ([`Claimed::Acquired`]'s `attempts` counts the
    /// claim's first). [`Error::LeaseLost`](crate::Error::LeaseLost) when `token` no longer
    /// holds the claim, and nothing is counted. The engine calls it before each retry of a job
    /// inside its claim, so that the count survives a crash mid-job: a dead letter reports it.
    fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32>;

    // Durable steps (`#[jobguard::step]`): the job's steps live with its record.

    /// Records `value` as `step` of the job whose claim `token` holds, replacing a value
    /// recorded for that step before. Only while `token` holds a live claim on `key` (the same
    /// compare-and-set as [`complete`](Store::complete)): otherwise
    /// [`Error::LeaseLost`](crate::Error::LeaseLost), and nothing is recorded, so a worker whose
    /// lease was taken over cannot record a step for its successor.
    ///
    /// The steps of a key live and die with its record: kept through a
    /// [`release`](Store::release) and a takeover (the next claim resumes from them, in
    /// [`Claimed::Acquired`]), dropped by [`complete`](Store::complete),
    /// [`forgive`](Store::forgive) and [`forget`](Store::forget), and when the key's history
    /// expires.
    fn record_step<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        step: StepKey<'a>,
        value: &'a [u8],
    ) -> StoreFuture<'a, ()>;

    /// The steps recorded for `key`'s job ([`record_step`](Store::record_step)) that a claim
    /// would resume from, read without claiming anything, for an operator: those of a claimed
    /// or released key; none for a key that is free without history, completed, poisoned or
    /// expired. In any order.
    fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>>;
}

/// The longest step name a store keeps, in bytes: a longer one is refused with
/// [`Error::Config`](crate::Error::Config) before the step runs (see [`crate::step()`]).
pub const MAX_STEP_NAME: usize = 200;

/// One durable step of a job, as a store files it: the step's name and its occurrence (the
/// n-th call of that name within one run of the job is occurrence n, from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepKey<'a> {
    /// The step's name: `#[step(name = "...")]`, by default the function's name.
    pub name: &'a str,
    /// Which call of that name within one run of the job, from 1.
    pub occurrence: u32,
}

/// A step's recorded value, as [`Claimed::Acquired`] and [`Store::steps`] return it.
///
/// ```
/// use jobguard::store::StepRecord;
///
/// let step = StepRecord::new("capture.v1", 1, br#"{"v":1,"ok":42}"#.to_vec());
/// assert_eq!((step.name.as_str(), step.occurrence), ("capture.v1", 1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepRecord {
    /// The step's name.
    pub name: String,
    /// Which call of that name within one run of the job, from 1.
    pub occurrence: u32,
    /// The bytes [`Store::record_step`] was given, opaque to the store.
    pub value: Vec<u8>,
}

impl StepRecord {
    /// The record of occurrence `occurrence` of the step `name`.
    pub fn new(name: impl Into<String>, occurrence: u32, value: Vec<u8>) -> Self {
        StepRecord {
            name: name.into(),
            occurrence,
            value,
        }
    }
}

/// Forwards every method to the store behind the pointer.
macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        impl<S: Store + ?Sized> Store for $ty {
            fn claim<'a>(
                &'a self,
                key: StoreKey<'a>,
                token: &'a str,
                options: ClaimOptions<'a>,
            ) -> StoreFuture<'a, Claimed> {
                (**self).claim(key, token, options)
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
            fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
                (**self).lettered(key)
            }
            fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
                (**self).inspect(key)
            }
            fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
                (**self).forget(key)
            }
            fn record_step<'a>(
                &'a self,
                key: StoreKey<'a>,
                token: &'a str,
                step: StepKey<'a>,
                value: &'a [u8],
            ) -> StoreFuture<'a, ()> {
                (**self).record_step(key, token, step, value)
            }
            fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
                (**self).steps(key)
            }
            fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32> {
                (**self).attempted(key, token)
            }
        }
    )*};
}

forward_store!(std::sync::Arc<S>, &S);

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
