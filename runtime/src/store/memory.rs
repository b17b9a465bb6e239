//! The in-memory store: the embedded default, for one process.
//!
//! # What it keeps, and for how long
//!
//! A [`MemoryStore`] keeps a claim for its lease and past it until its TTL (so that the next
//! claim can count a lapsed one as a crash), a completed record for its TTL, a released key's
//! history (its generation and crash count) until its claim's TTL, and a poisoned key for its
//! TTL, with who holds its letter role: all within a bound in bytes ([`DEFAULT_MAX_BYTES`], 256 MiB, unless set with
//! [`MemoryStoreBuilder::max_bytes`]). [`MemoryStore::stats`] says what it holds now.
//!
//! When a new record would not fit, the store gives records up, one at a time, in this order:
//!
//! 1. a released key's history, whatever its age: no result is forgotten with it;
//! 2. the **oldest completed record**, once it expired or completed at least
//!    [`min_retention`](MemoryStoreBuilder::min_retention) ago (one hour by default), so that a
//!    redelivery within that window always replays;
//! 3. a claim whose lease lapsed, or that expired: its worker died, and only the crash the next
//!    claim would have counted is forgotten.
//!
//! It never gives up a live claim, a poisoned key (refused for its TTL, so that its job is not run
//! and dead-lettered again) or a record completed less than `min_retention` ago. Each completed
//! record given up before its TTL is counted ([`MemoryStats::evicted`],
//! [`Event::Evicted`](crate::Event::Evicted), the metric `jobguard_store_evictions_total`) and a
//! warning is logged at most once a minute with the age of the records given up, so that an
//! operator sees that the TTL is not honoured, and why. A new claim fails, closed, with
//! [`Error::Store`] only when nothing can be given up. One operation gives up 64 records at most,
//! and passes over 64 entries of an order at most looking for one.
//!
//! Expired records go a few at a time, so that no operation holds a lock for long however many
//! expire at once: an operation that files an entry in one of its shard's orders (below) first
//! looks at two entries at the front of that order, a claim of a new key at the front of every
//! order, and each drops the expired records it finds there.
//!
//! # How it counts bytes
//!
//! A record counts 204 bytes (on a 64-bit target) plus the lengths of its scope, key, fingerprint
//! and payload (the claim's token while claimed, the result once completed, nothing otherwise):
//! a job with a 12-byte scope, a 20-byte key and a 58-byte result counts 294 bytes once
//! completed, and the default bound holds about a million of them. The 204 bytes are:
//!
//! - 104 for the record's fixed part, which the table holds boxed;
//! - 32 for the allocator's header and rounding on the record's two allocations;
//! - 36 for its slot in the table (an 8-byte pointer and a control byte), four times over: a
//!   hash table keeps slots empty, and hashbrown's settles, as records come and go, at between
//!   about 2.3 and 4.6 slots a record;
//! - 32 for its entry in an order (16 bytes), twice over: a `VecDeque` keeps spare room, and an
//!   order may hold a stale entry for a while.
//!
//! A job's durable steps ([`Store::record_step`]) are kept in its record while it is claimed or
//! released, and dropped when it completes: each counts 88 bytes (its place in the record's list,
//! and the allocator's header on its name's and its value's allocations) plus the lengths of its
//! name and value; the list's spare room is not counted.
//!
//! An estimate, checked against the allocator's own figures by `tests/memory_store_bound.rs`: the
//! store's memory may be a few percent over it when a table sits at the top of that range. Not
//! counted: the shards themselves (a few kilobytes), and the room a table or an order took for
//! more records than it holds now (they keep it for the records that follow).
//!
//! # How it is built
//!
//! Sixteen shards behind a `Mutex` each, so that claims of different keys from many threads
//! rarely wait for each other, and a table that grows holds up a sixteenth of the store; each
//! shard holds a sixteenth of the bound. A key's hash, from std's `RandomState` (keyed at random,
//! so that nobody can pick keys that collide), computed once an operation, picks its shard and
//! files its record in the shard's hashbrown `HashTable`; the record keeps its scope and key, to
//! tell its key from another of the same hash.
//!
//! Every record is also in exactly one of its shard's orders, `VecDeque`s of (hash, stamp)
//! entries, by its state: completed records oldest first, one order per TTL (within one TTL, the
//! oldest record is the first to expire); released keys' histories in one ring, claims and
//! poisoned keys in another (a look at a ring's front drops the entry's record, or moves the
//! entry to the back). An entry stands for its record while the record holds its stamp, unique
//! in the shard; a record that moves to another order, or leaves, leaves its entry behind,
//! *stale*, dropped when it comes to the front. Every entry filed pays for two looks at its
//! order's front, so an order holds about as many stale entries as live ones at most.

use super::{
    ClaimOptions, Claimed, KeyInfo, KeyState, Letter, StepKey, StepRecord, Store, StoreFuture,
    StoreKey,
};
use crate::Error;
use hashbrown::HashTable;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

const SHARDS: usize = 16;

/// The default bound on the store's memory, in bytes: 256 MiB.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// The default floor under which a completed record is never given up for room: one hour.
pub const DEFAULT_MIN_RETENTION: Duration = Duration::from_secs(3600);

/// What a record counts beyond the lengths of its scope, key, fingerprint and payload (see the
/// [module docs](self#how-it-counts-bytes)).
const RECORD_OVERHEAD: usize =
    size_of::<Record>() + 2 * 16 + 4 * (size_of::<Box<Record>>() + 1) + 2 * size_of::<Entry>();

/// What a recorded step counts beyond the lengths of its name and value: its place in the
/// record's steps, and the allocator's header and rounding on its two allocations.
const STEP_OVERHEAD: usize = size_of::<StepRecord>() + 2 * 16;

/// What a step named `name` recording `value` counts against the bound.
fn step_bytes(name: &str, value: &[u8]) -> usize {
    STEP_OVERHEAD + name.len() + value.len()
}

/// Entries at the front of each order that an operation filing a record looks at.
const UPKEEP: usize = 2;
/// Records one operation gives up at most to make room.
const MAX_DROPS: usize = 64;
/// Entries of an order one step of making room passes over at most (stale entries, and in a
/// ring, records it may not give up).
const MAX_SKIPS: usize = 64;
/// TTLs a shard keeps an order of completed records for; a record with another TTL joins the
/// order of the longest.
const MAX_TTLS: usize = 8;
/// How often, at most, the store logs that it gives records up.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How often, at most, a store that gives records up reports its size to the `metrics` gauge.
#[cfg(feature = "metrics")]
const GAUGE_EVERY: Duration = Duration::from_secs(1);

/// An idempotency store in this process's memory. `Clone` shares state.
///
/// Sharded (16 locks, each held for a map operation and a bounded amount of upkeep) and bounded
/// in bytes: see the [module docs](self) for what it keeps and for how long. TTLs and leases
/// read `tokio::time`.
///
/// It protects one process. Workers in several processes need a shared store such as
/// `RedisStore`.
///
/// ```
/// use jobguard::store::memory::MemoryStore;
/// use jobguard::{ClaimOptions, Claimed, Store, StoreKey};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), jobguard::Error> {
/// let store = MemoryStore::new();
/// let key = StoreKey { scope: "payments.charge", key: "order-A" };
/// let options = ClaimOptions::new(Duration::from_secs(30));
/// assert!(matches!(
///     store.claim(key, "t1", options).await?,
///     Claimed::Acquired { generation: 1, crashes: 0, attempts: 1, .. }
/// ));
/// assert!(matches!(store.claim(key, "t2", options).await?, Claimed::InProgress { .. }));
/// store.complete(key, "t1", b"{}", Duration::from_secs(60)).await?;
/// assert_eq!(store.claim(key, "t3", options).await?, Claimed::Completed(b"{}".to_vec()));
/// assert_eq!(store.stats().records, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

/// Settings of a [`MemoryStore`], from [`MemoryStore::builder`].
///
/// ```
/// use jobguard::MemoryStore;
/// use std::time::Duration;
///
/// let store = MemoryStore::builder()
///     .max_bytes(64 << 20)
///     .min_retention(Duration::from_secs(10 * 60))
///     .build();
/// assert_eq!(store.stats().max_bytes, 64 << 20);
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_bytes: usize,
    min_retention: Duration,
    max_records: Option<usize>,
}

impl MemoryStoreBuilder {
    /// The bound on the store's memory, in bytes (default [`DEFAULT_MAX_BYTES`]). Each of the 16
    /// shards keeps a sixteenth of it.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// How long a completed record is kept at least, room or not (default
    /// [`DEFAULT_MIN_RETENTION`]; a record's TTL still ends it sooner). A redelivery within it
    /// always replays.
    pub fn min_retention(mut self, floor: Duration) -> Self {
        self.min_retention = floor;
        self
    }

    /// A bound on the number of records as well (at least one per shard). None by default.
    pub fn max_records(mut self, records: usize) -> Self {
        self.max_records = Some(records);
        self
    }

    /// The store.
    pub fn build(self) -> MemoryStore {
        let limits = Limits {
            max_bytes: self.max_bytes.div_ceil(SHARDS),
            max_records: self
                .max_records
                .map_or(usize::MAX, |n| n.div_ceil(SHARDS).max(1)),
            min_retention: nanos(self.min_retention),
        };
        let hasher = RandomState::new();
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS)
                    .map(|_| Mutex::new(Shard::new(hasher.clone())))
                    .collect(),
                hasher,
                epoch: Instant::now(),
                limits,
                max_bytes: self.max_bytes,
                warned_at: AtomicU64::new(NEVER),
                warned_evicted: AtomicU64::new(0),
                #[cfg(feature = "metrics")]
                gauge: AtomicU64::new(0),
                #[cfg(feature = "metrics")]
                gauge_at: AtomicU64::new(0),
            }),
        }
    }
}

/// What a [`MemoryStore`] holds now, and what it dropped since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Records kept: live and lapsed claims, completed records, released keys' histories and
    /// poisoned keys, expired ones not yet dropped included.
    pub records: usize,
    /// Bytes counted against the bound (see the [module docs](self)).
    pub bytes: usize,
    /// The bound, in bytes.
    pub max_bytes: usize,
    /// Completed records given up before their TTL to make room.
    pub evicted: u64,
    /// Records dropped without forgetting a result: their TTL ran out, or, when room was short,
    /// a released key's history or a lapsed claim went first.
    pub expired: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("max_bytes", &self.inner.max_bytes)
            .field(
                "min_retention",
                &Duration::from_nanos(self.inner.limits.min_retention),
            )
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store with the default bound ([`DEFAULT_MAX_BYTES`]) and floor
    /// ([`DEFAULT_MIN_RETENTION`]).
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Settings for a store: its bound in bytes, its floor, a bound on records.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_bytes: DEFAULT_MAX_BYTES,
            min_retention: DEFAULT_MIN_RETENTION,
            max_records: None,
        }
    }

    /// A store with the default bound in bytes that also keeps at most `capacity` records (at
    /// least one per shard).
    pub fn with_capacity(capacity: usize) -> Self {
        Self::builder().max_records(capacity).build()
    }

    /// Records kept now, expired ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| lock(s).records.len())
            .sum()
    }

    /// `true` when no record is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the store holds now, and what it dropped since it was made. With the `metrics`
    /// feature, this also sets the store's share of the `jobguard_store_bytes` gauge (which a
    /// store giving records up sets by itself, once a second at most): call it where the
    /// process's metrics are scraped for a current figure.
    pub fn stats(&self) -> MemoryStats {
        self.inner.stats()
    }

    /// The completed record for `key`, if there is a live one: what a replay would return.
    pub fn completed(&self, key: StoreKey<'_>) -> Option<Vec<u8>> {
        self.with_shard(key, |shard, op| {
            let record = shard.records.find(op.hash, key)?;
            let live = record.state == State::Completed && record.expires > op.now;
            live.then(|| record.payload().to_vec())
        })
    }

    /// Runs `f` on `key`'s shard, with the key's hash and the time read once, then reports what
    /// it gave up.
    fn with_shard<R>(&self, key: StoreKey<'_>, f: impl FnOnce(&mut Shard, &mut Op<'_>) -> R) -> R {
        let hash = hash_key(&self.inner.hasher, key.scope, key.key);
        let mut op = Op {
            key,
            hash,
            now: self.inner.now(),
            limits: self.inner.limits,
            tally: Tally::default(),
        };
        let shard = &self.inner.shards[(hash % SHARDS as u64) as usize];
        let out = {
            let mut shard = lock(shard);
            let out = f(&mut shard, &mut op);
            shard.evicted += op.tally.evicted;
            shard.expired += op.tally.expired;
            out
        };
        if op.tally.evicted > 0 {
            self.inner.report_evictions(&op.tally, op.now);
        }
        out
    }

    fn claim_counted(
        &self,
        key: StoreKey<'_>,
        token: &str,
        options: &ClaimOptions<'_>,
    ) -> Result<Claimed, Error> {
        self.with_shard(key, |shard, op| shard.claim(op, token, options))
    }
}

impl Store for MemoryStore {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        Box::pin(std::future::ready(self.claim_counted(key, token, &options)))
    }

    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        done(self.with_shard(key, |shard, op| shard.complete(op, token, record, ttl)))
    }

    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        self.with_shard(key, |shard, op| shard.release(op, token));
        done(Ok(()))
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        done(self.with_shard(key, |shard, op| shard.renew(op, token, lease)))
    }

    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(std::future::ready(Ok(self.completed(key))))
    }

    /// One operation under the key's shard lock: a poisoned key or a lapsed claim becomes a
    /// released key's history without crashes, a released key's count goes back to 0.
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        let forgiven = self.with_shard(key, |shard, op| shard.forgive(op));
        Box::pin(std::future::ready(Ok(forgiven)))
    }

    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
        self.with_shard(key, |shard, op| shard.lettered(op));
        done(Ok(()))
    }

    /// The key's record under its shard lock, changed in nothing.
    fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
        let info = self.with_shard(key, |shard, op| {
            let Some(record) = shard.records.find(op.hash, key) else {
                return KeyInfo::free();
            };
            if record.expires <= op.now {
                return KeyInfo::free();
            }
            let (generation, crashes) = (Some(record.generation), record.crashes);
            match record.state {
                State::Claimed { lease_end } => {
                    let left = Duration::from_nanos(lease_end.saturating_sub(op.now));
                    KeyInfo::new(KeyState::Claimed, generation, crashes).lease_left(left)
                }
                State::Completed => KeyInfo::new(KeyState::Completed, generation, crashes)
                    .result(record.payload().to_vec()),
                State::Released => KeyInfo::new(KeyState::Free, generation, crashes),
                State::Poisoned { .. } => KeyInfo::new(KeyState::Poisoned, generation, crashes),
            }
        });
        Box::pin(std::future::ready(Ok(info)))
    }

    /// One operation under the key's shard lock, checked against the claim's token.
    fn record_step<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        step: StepKey<'a>,
        value: &'a [u8],
    ) -> StoreFuture<'a, ()> {
        done(self.with_shard(key, |shard, op| shard.record_step(op, token, step, value)))
    }

    fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
        let steps = self.with_shard(key, |shard, op| shard.steps(op));
        Box::pin(std::future::ready(Ok(steps)))
    }

    /// One more attempt on the record, under its shard lock, checked against the claim's token.
    fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32> {
        let counted = self.with_shard(key, |shard, op| {
            let record = (shard.records.find_mut(op.hash, key))
                .filter(|r| r.held_by(token, op.now))
                .ok_or(Error::LeaseLost)?;
            record.attempts = record.attempts.saturating_add(1);
            Ok(record.attempts)
        });
        Box::pin(std::future::ready(counted))
    }

    /// Marks the key's record expired under its shard lock: every later operation finds the
    /// key free, without history, and the record's bytes go with the next sweep of its order.
    fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        let forgotten = self.with_shard(key, |shard, op| {
            match shard.records.find_mut(op.hash, key) {
                Some(record) if record.expires > op.now => {
                    record.expires = op.now;
                    true
                }
                _ => false,
            }
        });
        Box::pin(std::future::ready(Ok(forgotten)))
    }
}

/// `result` as a [`StoreFuture`]. `Ok` is a [`poll_fn`] of a closure that captures nothing: of no
/// size, so that boxing it allocates nothing.
fn done<'a>(result: Result<(), Error>) -> StoreFuture<'a, ()> {
    match result {
        Ok(()) => Box::pin(poll_fn(|_| Poll::Ready(Ok(())))),
        Err(e) => Box::pin(std::future::ready(Err(e))),
    }
}

/// Per-shard bounds, and the floor, in the store's units.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_bytes: usize,
    max_records: usize,
    /// Nanoseconds.
    min_retention: u64,
}

const NEVER: u64 = u64::MAX;

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    /// Hashes each `(scope, key)`: the hash picks the shard and files the record in it.
    hasher: RandomState,
    /// Times are kept as nanoseconds since this instant.
    epoch: Instant,
    limits: Limits,
    max_bytes: usize,
    /// When the last warning about evictions was logged, or [`NEVER`].
    warned_at: AtomicU64,
    /// [`MemoryStats::evicted`] as the last warning reported it.
    warned_evicted: AtomicU64,
    /// The bytes last added to the `metrics` gauge, and when evictions may next report them.
    #[cfg(feature = "metrics")]
    gauge: AtomicU64,
    #[cfg(feature = "metrics")]
    gauge_at: AtomicU64,
}

impl Inner {
    fn stats(&self) -> MemoryStats {
        let (mut records, mut bytes, mut evicted, mut expired) = (0, 0, 0, 0);
        for shard in &self.shards {
            let shard = lock(shard);
            records += shard.records.len();
            bytes += shard.bytes;
            evicted += shard.evicted;
            expired += shard.expired;
        }
        #[cfg(feature = "metrics")]
        {
            let before = self.gauge.swap(bytes as u64, Ordering::Relaxed);
            if before != bytes as u64 {
                let delta = bytes as f64 - before as f64;
                crate::observe::metrics::store_bytes_changed("memory", delta);
            }
        }
        MemoryStats {
            records,
            bytes,
            max_bytes: self.max_bytes,
            evicted,
            expired,
        }
    }

    fn now(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    /// Sets the gauge, once every [`GAUGE_EVERY`] at most.
    #[cfg(feature = "metrics")]
    fn report_size(&self, now: u64) {
        let due = self.gauge_at.load(Ordering::Relaxed);
        if now >= due
            && self
                .gauge_at
                .compare_exchange(
                    due,
                    now.saturating_add(nanos(GAUGE_EVERY)),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.stats();
        }
    }

    /// Raises the event for the records one operation gave up, and logs a warning once every
    /// [`WARN_EVERY`] at most.
    fn report_evictions(&self, tally: &Tally, now: u64) {
        let (youngest, oldest) = (
            Duration::from_nanos(tally.youngest),
            Duration::from_nanos(tally.oldest),
        );
        crate::observe::emit_unowned(&crate::Event::Evicted {
            store: "memory",
            records: tally.evicted,
            youngest,
            oldest,
        });
        #[cfg(feature = "metrics")]
        self.report_size(now);
        let last = self.warned_at.load(Ordering::Relaxed);
        let due = last == NEVER || now >= last.saturating_add(nanos(WARN_EVERY));
        if due
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let total = self.shards.iter().map(|s| lock(s).evicted).sum::<u64>();
            let since = total.saturating_sub(self.warned_evicted.swap(total, Ordering::Relaxed));
            crate::observe::log_warn(format_args!(
                "jobguard: MemoryStore at its bound of {} bytes gave up {since} completed \
                 record(s) before their TTL (the latest {youngest:?} to {oldest:?} old; {total} \
                 in all) to make room: a redelivery of those jobs would run them again. Raise \
                 max_bytes or use a shared store",
                self.max_bytes,
            ));
        }
    }
}

#[cfg(feature = "metrics")]
impl Drop for Inner {
    fn drop(&mut self) {
        let reported = *self.gauge.get_mut();
        if reported > 0 {
            crate::observe::metrics::store_bytes_changed("memory", -(reported as f64));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside a critical section cannot leave a shard inconsistent in a way that matters
    // more than losing it would: its records stay valid records.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One operation on a shard: its key, the key's hash, the time read once for it, the shard's
/// bounds, and what it dropped.
struct Op<'k> {
    key: StoreKey<'k>,
    hash: u64,
    now: u64,
    limits: Limits,
    tally: Tally,
}

/// What one operation dropped, reported once its lock is released.
#[derive(Default)]
struct Tally {
    evicted: u64,
    expired: u64,
    /// The ages of the youngest and the oldest record given up, in nanoseconds.
    youngest: u64,
    oldest: u64,
}

impl Tally {
    fn evicted(&mut self, age: u64) {
        if self.evicted == 0 {
            (self.youngest, self.oldest) = (age, age);
        }
        self.youngest = self.youngest.min(age);
        self.oldest = self.oldest.max(age);
        self.evicted += 1;
    }
}

/// One shard: its records, and the orders that say which to drop first.
struct Shard {
    records: Records,
    /// Completed records, oldest first, one order per TTL.
    completed: Vec<TtlOrder>,
    /// Released keys' histories: the first records given up for room, in no particular order.
    released: VecDeque<Entry>,
    /// Claims, live or lapsed, and poisoned keys.
    claims: VecDeque<Entry>,
    /// Bytes counted against the bound: the sum of the records' [`Record::bytes`].
    bytes: usize,
    /// The last stamp handed out: stamps are unique in the shard, and increase.
    last_stamp: u64,
    /// Records this shard gave up for room, and dropped as expired.
    evicted: u64,
    expired: u64,
}

/// A record's place in one of its shard's orders: the hash it is filed under, and its stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    hash: u64,
    stamp: u64,
}

/// The completed records of one TTL, oldest first: within one TTL, the oldest is also the first
/// to expire. An entry is due at its stamp plus the TTL: when the record expired, or a few
/// nanoseconds after when many records were stamped at one instant (a claim never replays a
/// record past its own expiry, which is exact).
struct TtlOrder {
    /// Nanoseconds.
    ttl: u64,
    entries: VecDeque<Entry>,
}

/// The two rings of a shard.
#[derive(Debug, Clone, Copy)]
enum Ring {
    Released,
    Claims,
}

impl Shard {
    fn new(hasher: RandomState) -> Self {
        Shard {
            records: Records {
                table: HashTable::new(),
                hasher,
            },
            completed: Vec::new(),
            released: VecDeque::new(),
            claims: VecDeque::new(),
            bytes: 0,
            last_stamp: 0,
            evicted: 0,
            expired: 0,
        }
    }

    fn claim(
        &mut self,
        op: &mut Op<'_>,
        token: &str,
        options: &ClaimOptions<'_>,
    ) -> Result<Claimed, Error> {
        let now = op.now;
        let lease_end = now.saturating_add(nanos(options.lease));
        let keep = now.saturating_add(nanos(options.ttl));
        let fresh = || Record::claimed(op.key, token, options.fingerprint, lease_end, keep);
        let Some(record) = self.records.find_mut(op.hash, op.key) else {
            // A key the shard does not hold: its first claim here, which adds a record, so it
            // looks at the front of every order first.
            let mut record = Box::new(fresh()?);
            self.expire_completed(now, &mut op.tally);
            self.look_at_front(Ring::Released, now, &mut op.tally);
            self.look_at_front(Ring::Claims, now, &mut op.tally);
            let need = record.bytes();
            if !self.make_room(need, 1, op.limits, now, &mut op.tally) {
                return Err(self.full_error(&op.limits, now, need));
            }
            record.stamp = stamp(&mut self.last_stamp, now);
            let entry = Entry {
                hash: op.hash,
                stamp: record.stamp,
            };
            self.claims.push_back(entry);
            self.bytes += need;
            self.records.insert(op.hash, record);
            return Ok(Claimed::Acquired {
                generation: 1,
                crashes: 0,
                attempts: 1,
                steps: Some(Vec::new()),
            });
        };
        let mut crashes = 0;
        if record.expires > now {
            let reused = matches!(
                (record.fingerprint(), options.fingerprint),
                (Some(theirs), Some(ours)) if theirs != ours.as_bytes()
            );
            crashes = record.crashes;
            match record.state {
                State::Completed if reused => return Ok(Claimed::KeyReused),
                State::Completed => return Ok(Claimed::Completed(record.payload().to_vec())),
                State::Poisoned { letter_until } => {
                    // The letter role goes to this claim when no letter is confirmed and no
                    // other claim holds it.
                    let letter = match letter_until {
                        LETTERED => Letter::Written,
                        until if until > now => Letter::Held,
                        _ => {
                            record.state = State::Poisoned {
                                letter_until: lease_end,
                            };
                            Letter::Yours
                        }
                    };
                    let attempts = record.attempts;
                    return Ok(Claimed::Poisoned {
                        crashes,
                        attempts,
                        letter,
                    });
                }
                State::Claimed { lease_end } if lease_end > now && reused => {
                    return Ok(Claimed::KeyReused);
                }
                State::Claimed { lease_end } if lease_end > now => {
                    let retry_in = Duration::from_nanos(lease_end - now);
                    return Ok(Claimed::InProgress { retry_in });
                }
                // Abandoned: its worker died (or stalled past its lease). Counted.
                State::Claimed { .. } => crashes = crashes.saturating_add(1),
                State::Released => {}
            }
            if options.crashes > 0 && crashes >= options.crashes {
                let attempts = record.attempts;
                self.refile(op, |r| {
                    r.set_payload(&[]);
                    r.steps = Vec::new();
                    r.state = State::Poisoned {
                        letter_until: lease_end,
                    };
                    (r.crashes, r.expires) = (crashes, keep);
                });
                return Ok(Claimed::Poisoned {
                    crashes,
                    attempts,
                    letter: Letter::Yours,
                });
            }
        } else {
            // Expired, history and all: the key is free again.
            op.tally.expired += 1;
        }
        // The new claim takes the record over, numbered after it, with the steps its job
        // recorded (none once the history expired).
        let generation = record.generation.saturating_add(1);
        let live = record.expires > now;
        let (attempts, steps) = match live {
            true => (record.attempts.saturating_add(1), record.steps.clone()),
            false => (1, Vec::new()),
        };
        let fresh = fresh()?;
        self.refile(op, |r| {
            *r = Record {
                generation,
                crashes,
                attempts,
                steps: if live {
                    std::mem::take(&mut r.steps)
                } else {
                    Vec::new()
                },
                ..fresh
            }
        });
        Ok(Claimed::Acquired {
            generation,
            crashes,
            attempts,
            steps: Some(steps),
        })
    }

    fn complete(
        &mut self,
        op: &mut Op<'_>,
        token: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<(), Error> {
        let held = self.records.find(op.hash, op.key);
        if !held.is_some_and(|r| r.held_by(token, op.now)) {
            return Err(Error::LeaseLost);
        }
        let expires = op.now.saturating_add(nanos(ttl));
        self.refile(op, |r| {
            r.set_payload(result);
            r.steps = Vec::new();
            (r.state, r.expires) = (State::Completed, expires);
        });
        // The result is kept whatever the room; older records make room for it if they can. A
        // floor of at least 1 ns keeps this one, whose age is 0.
        let limits = Limits {
            min_retention: op.limits.min_retention.max(1),
            ..op.limits
        };
        self.make_room(0, 0, limits, op.now, &mut op.tally);
        Ok(())
    }

    fn renew(&mut self, op: &Op<'_>, token: &str, lease: Duration) -> Result<(), Error> {
        let record = (self.records.find_mut(op.hash, op.key))
            .filter(|r| r.held_by(token, op.now))
            .ok_or(Error::LeaseLost)?;
        let lease_end = op.now.saturating_add(nanos(lease));
        record.state = State::Claimed { lease_end };
        record.expires = record.expires.max(lease_end);
        Ok(())
    }

    /// Frees the key, keeping its generation and crash count until the claim's TTL.
    fn release(&mut self, op: &mut Op<'_>, token: &str) {
        let held = self.records.find(op.hash, op.key);
        if held.is_some_and(|r| r.held_by(token, op.now)) {
            self.refile(op, Record::free);
        }
    }

    /// Forgives the key's crashes ([`Store::forgive`]): a poisoned key, or a claim whose lease
    /// lapsed, becomes a released key's history without crashes; a released key's count goes
    /// back to 0. A completed record, a live claim and an expired record are left alone. `true`
    /// when a crash or a poisoned key was cleared.
    fn forgive(&mut self, op: &mut Op<'_>) -> bool {
        let now = op.now;
        let Some(record) = self.records.find_mut(op.hash, op.key) else {
            return false;
        };
        if record.expires <= now {
            // Expired, history and all: the next claim finds the key free and without crashes.
            return false;
        }
        match record.state {
            State::Completed => false,
            State::Claimed { lease_end } if lease_end > now => false,
            State::Released => std::mem::replace(&mut record.crashes, 0) > 0,
            State::Poisoned { .. } | State::Claimed { .. } => {
                self.refile(op, |r| {
                    r.crashes = 0;
                    r.steps = Vec::new();
                    r.free();
                });
                true
            }
        }
    }

    /// Records `value` as `step` of the job whose claim `token` holds ([`Store::record_step`]),
    /// in the key's record: kept whatever the room, as a result is; older records make room
    /// for it if they can.
    fn record_step(
        &mut self,
        op: &mut Op<'_>,
        token: &str,
        step: StepKey<'_>,
        value: &[u8],
    ) -> Result<(), Error> {
        let record = (self.records.find_mut(op.hash, op.key))
            .filter(|r| r.held_by(token, op.now))
            .ok_or(Error::LeaseLost)?;
        // A step recorded again is most often the last one recorded.
        let same = |s: &StepRecord| s.occurrence == step.occurrence && s.name == step.name;
        match record.steps.iter_mut().rev().find(|s| same(s)) {
            Some(kept) => {
                self.bytes = self.bytes - kept.value.len() + value.len();
                kept.value = value.to_vec();
            }
            None => {
                self.bytes += step_bytes(step.name, value);
                let new = StepRecord::new(step.name, step.occurrence, value.to_vec());
                record.steps.push(new);
            }
        }
        let limits = Limits {
            min_retention: op.limits.min_retention.max(1),
            ..op.limits
        };
        self.make_room(0, 0, limits, op.now, &mut op.tally);
        Ok(())
    }

    /// The steps a claim of the key would resume from ([`Store::steps`]): a live claim's or a
    /// released key's.
    fn steps(&self, op: &Op<'_>) -> Vec<StepRecord> {
        match self.records.find(op.hash, op.key) {
            Some(r)
                if r.expires > op.now
                    && matches!(r.state, State::Claimed { .. } | State::Released) =>
            {
                r.steps.clone()
            }
            _ => Vec::new(),
        }
    }

    /// Confirms a poisoned key's dead letter ([`Store::lettered`]): no later claim gets the
    /// letter role.
    fn lettered(&mut self, op: &Op<'_>) {
        if let Some(record) = self.records.find_mut(op.hash, op.key)
            && let State::Poisoned { letter_until } = &mut record.state
            && record.expires > op.now
        {
            *letter_until = LETTERED;
        }
    }

    /// Changes the key's record with `change`, counts its bytes again, and files it under a new
    /// stamp in the order its state now calls for, after two looks at that order's front. Its
    /// old entry is left stale; a claim's, usually the last filed in the ring of claims when
    /// the claim completes or is released, is taken off at once, for the ring not to look up.
    fn refile(&mut self, op: &mut Op<'_>, change: impl FnOnce(&mut Record)) {
        let (now, tally) = (op.now, &mut op.tally);
        let Some(record) = self.records.find_mut(op.hash, op.key) else {
            return;
        };
        let (before, old) = (record.bytes(), record.stamp);
        change(record);
        record.stamp = stamp(&mut self.last_stamp, now);
        self.bytes = self.bytes - before + record.bytes();
        let (state, ttl) = (record.state, record.expires.saturating_sub(now));
        let entry = Entry {
            hash: op.hash,
            stamp: record.stamp,
        };
        if self.claims.back()
            == Some(&Entry {
                stamp: old,
                ..entry
            })
        {
            self.claims.pop_back();
        }
        match state {
            State::Completed => {
                self.expire_completed(now, tally);
                self.file_completed(ttl, entry);
            }
            State::Released => {
                self.look_at_front(Ring::Released, now, tally);
                self.released.push_back(entry);
            }
            State::Claimed { .. } | State::Poisoned { .. } => {
                self.look_at_front(Ring::Claims, now, tally);
                self.claims.push_back(entry);
            }
        }
    }

    /// Appends a completed record's entry to the order of its TTL. A shard keeps [`MAX_TTLS`]
    /// orders (empty ones go first); a record with a TTL beyond those joins the order of the
    /// longest, where it may be dropped later than its TTL says (never replayed after it), or
    /// hold up the records behind it until it expires.
    fn file_completed(&mut self, ttl: u64, entry: Entry) {
        if !self.completed.iter().any(|o| o.ttl == ttl) {
            self.completed.retain(|o| !o.entries.is_empty());
            if self.completed.len() < MAX_TTLS {
                let entries = VecDeque::new();
                self.completed.push(TtlOrder { ttl, entries });
            }
        }
        let order = match self.completed.iter().position(|o| o.ttl == ttl) {
            Some(at) => at,
            None => (0..self.completed.len())
                .max_by_key(|&at| self.completed[at].ttl)
                .unwrap_or_default(),
        };
        self.completed[order].entries.push_back(entry);
    }

    /// Drops the expired records at the front of each order of completed records: [`UPKEEP`]
    /// entries of each looked at, at most.
    fn expire_completed(&mut self, now: u64, tally: &mut Tally) {
        for at in 0..self.completed.len() {
            for _ in 0..UPKEEP {
                let order = &self.completed[at];
                let Some(&entry) = order.entries.front() else {
                    break;
                };
                if entry.stamp.saturating_add(order.ttl) > now {
                    break; // Nothing due in this order yet.
                }
                match self.records.take_if(entry, |r| r.expires <= now) {
                    // A longer TTL than its order's: see `file_completed`.
                    Found::Kept => break,
                    Found::Taken(record) => self.dropped(&record, tally),
                    Found::Stale => {}
                }
                self.completed[at].entries.pop_front();
            }
        }
    }

    /// Looks at [`UPKEEP`] entries at the front of `ring`, dropping the records there that
    /// expired. What every operation that files an entry in a ring does first: so that the ring
    /// holds about as many stale entries as live ones at most.
    fn look_at_front(&mut self, ring: Ring, now: u64, tally: &mut Tally) {
        for _ in 0..UPKEEP {
            self.sweep(ring, 1, now, |_, _| false, tally);
        }
    }

    /// Looks at up to `look` entries at the front of `ring`: passes over stale ones, drops the
    /// first record that expired or that `give_up` picks (counted as expired: no result goes
    /// with it) and returns `true`, and moves the others to the back.
    fn sweep(
        &mut self,
        ring: Ring,
        look: usize,
        now: u64,
        give_up: impl Fn(&Record, u64) -> bool,
        tally: &mut Tally,
    ) -> bool {
        for _ in 0..look {
            let Some(entry) = self.ring(ring).pop_front() else {
                return false;
            };
            match (self.records).take_if(entry, |r| r.expires <= now || give_up(r, now)) {
                Found::Stale => {}
                Found::Kept => self.ring(ring).push_back(entry),
                Found::Taken(record) => {
                    self.dropped(&record, tally);
                    return true;
                }
            }
        }
        false
    }

    fn ring(&mut self, ring: Ring) -> &mut VecDeque<Entry> {
        match ring {
            Ring::Released => &mut self.released,
            Ring::Claims => &mut self.claims,
        }
    }

    /// Takes a record that went without forgetting a result off the shard's bytes.
    fn dropped(&mut self, record: &Record, tally: &mut Tally) {
        self.bytes -= record.bytes();
        tally.expired += 1;
    }

    /// Gives records up, in the policy's order, until `records` more records of `bytes` more
    /// bytes fit, [`MAX_DROPS`] at most. `false` when they do not.
    fn make_room(
        &mut self,
        bytes: usize,
        records: usize,
        limits: Limits,
        now: u64,
        tally: &mut Tally,
    ) -> bool {
        let fits = |shard: &Shard| {
            shard.bytes + bytes <= limits.max_bytes
                && shard.records.len() + records <= limits.max_records
        };
        for _ in 0..MAX_DROPS {
            if fits(self) {
                return true;
            }
            let lapsed = |r: &Record, now| matches!(r.state, State::Claimed { lease_end } if lease_end <= now);
            let made = self.sweep(Ring::Released, MAX_SKIPS, now, |_, _| true, tally)
                || self.give_up_oldest_completed(limits.min_retention, now, tally)
                || self.sweep(Ring::Claims, MAX_SKIPS, now, lapsed, tally);
            if !made {
                return false;
            }
        }
        fits(self)
    }

    /// Gives up a completed record: one that expired at the front of an order, else the oldest
    /// if it completed at least `floor` ago, passing over up to [`MAX_SKIPS`] stale entries.
    /// `false` when it gave nothing up.
    fn give_up_oldest_completed(&mut self, floor: u64, now: u64, tally: &mut Tally) -> bool {
        for _ in 0..MAX_SKIPS {
            // The fronts of the orders: those due first, then the oldest.
            let Some((at, entry)) = (self.completed.iter().enumerate())
                .filter_map(|(at, order)| Some((at, *order.entries.front()?, order.ttl)))
                .min_by_key(|&(_, entry, ttl)| (entry.stamp.saturating_add(ttl) > now, entry.stamp))
                .map(|(at, entry, _)| (at, entry))
            else {
                return false;
            };
            let age = now.saturating_sub(entry.stamp);
            let taken = match self
                .records
                .take_if(entry, |r| r.expires <= now || age >= floor)
            {
                Found::Kept => return false,
                Found::Stale => None,
                Found::Taken(record) => Some(record),
            };
            self.completed[at].entries.pop_front();
            if let Some(record) = taken {
                if record.expires <= now {
                    self.dropped(&record, tally);
                } else {
                    self.bytes -= record.bytes();
                    tally.evicted(age);
                }
                return true;
            }
        }
        false
    }

    /// The error that refuses a claim this shard has no room for: what fills the shard, in
    /// words, from one pass over its records.
    fn full_error(&self, limits: &Limits, now: u64, need: usize) -> Error {
        if self.records.len() == 0 {
            // Nothing to give up: the bound itself is too small for one record.
            return Error::Store(format!(
                "memory store bound too small: a shard's share of max_bytes is {} bytes, less \
                 than this one record counts ({need} bytes); each of the {SHARDS} shards holds \
                 a {SHARDS}th of MemoryStore::builder().max_bytes, so raise it (the default is \
                 {} MiB)",
                limits.max_bytes,
                DEFAULT_MAX_BYTES / (1024 * 1024),
            ));
        }
        // Claims whose lease has not ended, and poisoned keys not yet expired (an expired one
        // no longer refuses its key).
        let (live_claims, poisoned) = self.records.iter().fold((0, 0), |(live, poisoned), r| {
            let is_live = matches!(r.state, State::Claimed { lease_end } if lease_end > now);
            let is_poisoned = matches!(r.state, State::Poisoned { .. }) && r.expires > now;
            (
                live + usize::from(is_live),
                poisoned + usize::from(is_poisoned),
            )
        });
        Error::Store(format!(
            "memory store full: a shard's {} records ({live_claims} live claims, {poisoned} \
             poisoned keys, the rest completed less than min_retention {:?} ago) fill its {} of \
             {} bytes; nothing can be given up without forgetting a job that may still be \
             redelivered. Raise MemoryStore::builder().max_bytes, lower min_retention, or use a \
             shared store",
            self.records.len(),
            Duration::from_nanos(limits.min_retention),
            self.bytes,
            limits.max_bytes,
        ))
    }
}

/// The hash a key is filed under: std's SipHash, keyed at random, of its scope and key, with the
/// scope's length so that `("ab", "c")` and `("a", "bc")` differ.
fn hash_key(hasher: &RandomState, scope: &str, key: &str) -> u64 {
    let mut h = hasher.build_hasher();
    h.write(scope.as_bytes());
    h.write(key.as_bytes());
    h.write_usize(scope.len());
    h.finish()
}

/// The next stamp of a shard: unique and increasing, `now` when it can be.
fn stamp(last_stamp: &mut u64, now: u64) -> u64 {
    *last_stamp = now.max(*last_stamp + 1);
    *last_stamp
}

/// A shard's records, filed by the hash of their scope and key that std's `RandomState`
/// computed once for the operation. hashbrown's `HashTable` takes that hash as it is, where
/// std's `HashMap` would hash it again on every lookup: four more SipHashes a job, which put the
/// store at 2.1–2.5 times a bare `Mutex<HashMap>` in `suite/benches/memory_store.rs` at 10 thousand
/// records (2 is its floor).
struct Records {
    table: HashTable<Box<Record>>,
    /// The store's hasher, for the table to place records again when it grows.
    hasher: RandomState,
}

impl Records {
    fn len(&self) -> usize {
        self.table.len()
    }

    fn iter(&self) -> impl Iterator<Item = &Record> {
        self.table.iter().map(|r| &**r)
    }

    fn find(&self, hash: u64, key: StoreKey<'_>) -> Option<&Record> {
        self.table.find(hash, |r| r.is(key)).map(|r| &**r)
    }

    fn find_mut(&mut self, hash: u64, key: StoreKey<'_>) -> Option<&mut Record> {
        self.table.find_mut(hash, |r| r.is(key)).map(|r| &mut **r)
    }

    /// Takes the record that holds `entry` out if `give_up` picks it.
    fn take_if(&mut self, entry: Entry, give_up: impl FnOnce(&Record) -> bool) -> Found {
        match self
            .table
            .find_entry(entry.hash, |r| r.stamp == entry.stamp)
        {
            Err(_) => Found::Stale,
            Ok(slot) if give_up(slot.get()) => Found::Taken(slot.remove().0),
            Ok(_) => Found::Kept,
        }
    }

    /// Files the record of a key the shard does not hold.
    fn insert(&mut self, hash: u64, record: Box<Record>) {
        // When the table grows, it asks each record's hash again.
        let hasher = &self.hasher;
        self.table.insert_unique(hash, record, |r| {
            let (scope, key) = r.name();
            hash_key(hasher, scope, key)
        });
    }
}

/// What [`Records::take_if`] found for an entry.
enum Found {
    /// No record holds the entry any more.
    Stale,
    /// The record that holds it, left in place.
    Kept,
    /// The record that holds it, taken out.
    Taken(Box<Record>),
}

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A claim: live until its lease ends, abandoned after.
    Claimed { lease_end: u64 },
    /// A completed job's result.
    Completed,
    /// A released claim: only the key's generation and crash count are kept.
    Released,
    /// A job refused for its TTL: its crash count reached its limit. The letter role is held
    /// until `letter_until` (the lease's end of the claim that got it), or for good,
    /// [`LETTERED`], once the letter is confirmed.
    Poisoned { letter_until: u64 },
}

/// The `letter_until` of a poisoned key whose dead letter is confirmed.
const LETTERED: u64 = u64::MAX;

/// One `(scope, key)`'s record.
struct Record {
    /// The scope, the key, the fingerprint, then the payload, in one allocation: the claim's
    /// token while claimed, the stored result once completed, nothing otherwise.
    data: Box<[u8]>,
    scope_len: u32,
    key_len: u32,
    /// The fingerprint's length, or [`NO_FINGERPRINT`].
    fp_len: u32,
    /// Abandoned claims counted.
    crashes: u32,
    /// The job's attempts counted over every claim ([`Store::attempted`]).
    attempts: u32,
    /// The claim's number among the key's claims, from 1.
    generation: u64,
    /// Nanoseconds since the store's epoch, like every time here: when the record is dropped (a
    /// claim's TTL from its claim or its lease's end, whichever is later; a completed record's
    /// from its completion; a poisoned key's from the claim that poisoned it).
    expires: u64,
    /// The stamp of its entry in its order: for a completed record, when it completed.
    stamp: u64,
    state: State,
    /// The steps its job recorded ([`Store::record_step`]), while claimed or released.
    steps: Vec<StepRecord>,
}

/// [`Record::fp_len`] of a record claimed without a fingerprint.
const NO_FINGERPRINT: u32 = u32::MAX;

impl Record {
    /// A new claim's record, not yet stamped.
    fn claimed(
        key: StoreKey<'_>,
        token: &str,
        fingerprint: Option<&str>,
        lease_end: u64,
        keep: u64,
    ) -> Result<Self, Error> {
        let len = |part: &str| {
            u32::try_from(part.len())
                .ok()
                .filter(|&n| n != NO_FINGERPRINT)
                .ok_or_else(|| {
                    Error::Store("memory store: scope, key or fingerprint longer than 4 GiB".into())
                })
        };
        let fp_len = fingerprint.map_or(Ok(NO_FINGERPRINT), len)?;
        let parts = [key.scope, key.key, fingerprint.unwrap_or(""), token];
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for part in parts {
            data.extend_from_slice(part.as_bytes());
        }
        Ok(Record {
            data: data.into_boxed_slice(),
            scope_len: len(key.scope)?,
            key_len: len(key.key)?,
            fp_len,
            crashes: 0,
            attempts: 1,
            generation: 1,
            expires: keep.max(lease_end),
            stamp: 0,
            state: State::Claimed { lease_end },
            steps: Vec::new(),
        })
    }

    /// What the record counts against the bound (see the [module docs](self#how-it-counts-bytes)).
    fn bytes(&self) -> usize {
        let steps = self.steps.iter().map(|s| step_bytes(&s.name, &s.value));
        RECORD_OVERHEAD + self.data.len() + steps.sum::<usize>()
    }

    /// The scope and the key, as [`MemoryStore`] hashes them.
    fn name(&self) -> (&str, &str) {
        let (scope, rest) = self.data.split_at(self.scope_len as usize);
        let key = &rest[..self.key_len as usize];
        // The bytes were copied from `&str`s: they are UTF-8.
        let text = |bytes| std::str::from_utf8(bytes).unwrap_or_default();
        (text(scope), text(key))
    }

    fn is(&self, key: StoreKey<'_>) -> bool {
        let scope_len = self.scope_len as usize;
        scope_len == key.scope.len()
            && self.key_len as usize == key.key.len()
            && self.data.get(..scope_len) == Some(key.scope.as_bytes())
            && self.data.get(scope_len..scope_len + key.key.len()) == Some(key.key.as_bytes())
    }

    fn fingerprint(&self) -> Option<&[u8]> {
        let at = self.scope_len as usize + self.key_len as usize;
        (self.fp_len != NO_FINGERPRINT).then(|| &self.data[at..at + self.fp_len as usize])
    }

    /// Where the payload starts in [`Record::data`].
    fn prefix(&self) -> usize {
        let fp = self.fingerprint().map_or(0, <[u8]>::len);
        self.scope_len as usize + self.key_len as usize + fp
    }

    fn payload(&self) -> &[u8] {
        &self.data[self.prefix()..]
    }

    /// A released key's history: no payload, its generation, crash count and expiry kept.
    fn free(&mut self) {
        self.set_payload(&[]);
        self.state = State::Released;
    }

    fn set_payload(&mut self, payload: &[u8]) {
        let prefix = &self.data[..self.prefix()];
        let mut data = Vec::with_capacity(prefix.len() + payload.len());
        data.extend_from_slice(prefix);
        data.extend_from_slice(payload);
        self.data = data.into_boxed_slice();
    }

    /// `token` holds a live claim on this record.
    fn held_by(&self, token: &str, now: u64) -> bool {
        matches!(self.state, State::Claimed { lease_end } if lease_end > now)
            && self.payload() == token.as_bytes()
    }
}

/// `d` in nanoseconds, saturating (a u64 of nanoseconds lasts 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
