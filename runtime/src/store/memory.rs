//! The in-memory store: the embedded default, for one process.
//!
//! # What it keeps, and for how long
//!
//! A [`MemoryStore`] keeps every claim for its lease (and, so that a lapsed one can be found and
//! counted as a crash, until its TTL unless room is short) and every completed record for its TTL,
//! within a bound in bytes ([`DEFAULT_MAX_BYTES`], 256 MiB, unless set with
//! [`MemoryStoreBuilder::max_bytes`]). The bytes counted are the store's own: its hash tables as
//! allocated, each record's key, token and stored result as the allocator hands them out (one
//! allocation a record), and the rings that order records by age, as allocated. A small job (a
//! 12-byte scope, a 20-byte key, a 58-byte result) costs about 245–275 bytes (`benches/
//! memory_store.rs` counts 246, 273 and 247 at 10 thousand, 1 million and 10 million; more just
//! after a table doubles), so the default bound holds about a million of them (1,261,200 of
//! `benches/memory_store_run.rs`' smaller ones, about 213 bytes each, most of the time, and
//! about a fifth fewer for a while every few million jobs, when a table's tombstones have to be
//! cleared); [`MemoryStore::stats`] says what it holds now.
//!
//! When a new record would not fit, the store drops expired records and released keys' histories
//! (no result is forgotten with them), then gives up the **oldest completed records first**,
//! before their TTL. It never gives up a live claim or a poisoned
//! key (refused for its TTL, so that its job is not run and dead-lettered again), and never a
//! record completed less than [`min_retention`](MemoryStoreBuilder::min_retention) ago (one hour
//! by default): a redelivery within that window always replays. Each record given up is counted
//! ([`MemoryStats::evicted`], [`Event::Evicted`](crate::Event::Evicted), the metric
//! `jobguard_store_evictions_total`) and a warning is logged at most once a minute with the age of
//! the records given up, so an operator sees that the TTL is not honoured, and why. A new claim
//! fails, closed, with [`Error::Store`] only when the records it looked at (the old ends of the
//! shard's orders, up to 64 given up and 256 buckets swept) are live claims, poisoned keys or
//! younger than `min_retention`.
//!
//! Expired records are dropped a few at a time, by the claims that add records: each drops up to
//! four expired records from the old end of its shard's completion order (and four from its
//! order of released keys) and looks at one more bucket of its shard's table (a lapsed claim, a
//! poisoned key, a record with a shorter TTL than older ones), so no operation holds a lock for
//! long, however many records expire at once. (A shard knows a time before which none of its records expires,
//! from its last pass over its table and the records written since: until then, it looks at no
//! bucket.) A claim that finds no room looks at up to 256 buckets before it
//! gives up.

use super::{ClaimOptions, Claimed, Letter, Store, StoreFuture, StoreKey};
use crate::Error;
use hashbrown::HashTable;
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

const SHARDS: usize = 16;

/// The default bound on the store's memory, in bytes: 256 MiB.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// The default floor under which a completed record is never given up for room: one hour.
pub const DEFAULT_MIN_RETENTION: Duration = Duration::from_secs(3600);

/// Table buckets each claim that adds a record looks at for expired records.
const SWEEP_STEP: usize = 1;
/// Table buckets a claim looks at when its shard is out of room, before it fails.
const SWEEP_MORE: usize = 256;
/// Expired records at the old end of the completion order each claim drops at most.
const EXPIRE_STEP: usize = 4;
/// Records one operation gives up at most to make room for one record.
const MAX_EVICTIONS: usize = 64;
/// Entries of an order a compaction looks at for each entry appended to it.
const COMPACT_STEP: usize = 8;
/// Stale entries one attempt to give a record up skips at most.
const STALE_SKIP: usize = 64;
/// Entries ahead of an order's front that giving up its front record reads (three cache lines
/// of 24-byte entries), so that they are in the cache when they reach the front.
const READ_AHEAD: usize = 8;
/// The largest result whose completed data `complete` builds before it takes the lock (see
/// [`completed_data`]).
const PREBUILT_MAX: usize = 512;
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
/// assert_eq!(
///     store.claim(key, "t1", options).await?,
///     Claimed::Acquired { generation: 1, crashes: 0 }
/// );
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
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
                hasher: SipKeys::random(),
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

/// Per-shard bounds, and the floor, in the store's units.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_bytes: usize,
    max_records: usize,
    min_retention: u64,
}

const NEVER: u64 = u64::MAX;

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    /// Hashes each `(scope, key)` once per operation: the hash picks the shard and is the one
    /// the shard's table files the record under.
    hasher: SipKeys,
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

/// One shard: its records, and the completed ones in the order they completed.
#[derive(Default)]
struct Shard {
    table: HashTable<Record>,
    /// Completed records, oldest first.
    order: Order,
    /// Released keys' records (their generation and crash count), oldest first: the first to
    /// go when room is short, floor or not.
    freed: Order,
    /// The records' heap allocations, in bytes (see [`heap_bytes`]).
    heap: usize,
    /// The next bucket the expiry sweep looks at.
    cursor: usize,
    /// No record of this shard expires before this time: until then, the sweep looks at no
    /// bucket, since none can hold an expired record. A lower bound, lowered by every record
    /// written and set again at the end of each pass of the sweep over the whole table.
    due: u64,
    /// The earliest expiry among the records the sweep's current pass looked at and kept, and
    /// those written since the pass began ([`u64::MAX`] for none): the next [`Shard::due`].
    pass_min: u64,
    /// Buckets the current pass has still to look at before it covers the whole table.
    pass_left: usize,
    /// The last completion stamp handed out: stamps are unique and increasing.
    last_stamp: u64,
    /// Records this shard gave up for room, and dropped as expired: counted under its lock,
    /// which the operation holds anyway, rather than in an atomic every operation would write.
    evicted: u64,
    expired: u64,
}

/// A completed or released record's place in an [`Order`].
#[derive(Clone, Copy)]
struct Entry {
    /// The record's stamp: [`Record::at`] while the record holds this place.
    stamp: u64,
    hash: u64,
    expires: u64,
}

/// Records in the order they were stamped, oldest first: a ring, so that a completion appends
/// and the oldest comes off the front, each in constant time.
///
/// A record that leaves the order other than from the front (an expired record dropped by the
/// sweep or claimed again, a released key claimed again) leaves its entry behind, *stale*: it is
/// known by its record no longer holding its stamp, and skipped when it reaches the front. When
/// stale entries are half the ring, a compaction walks it in place, [`COMPACT_STEP`] entries per
/// entry appended, so that they never hold more than about as much memory as the live ones.
#[derive(Default)]
struct Order {
    ring: VecDeque<Entry>,
    /// Stale entries among those in the ring (not counting a compaction's gap).
    stale: usize,
    /// A compaction under way, `(kept, next)`: the entries before `kept` were kept, those from
    /// `kept` to `next` are a gap left by it, those from `next` on are not looked at yet.
    compacting: Option<(usize, usize)>,
}

impl Order {
    /// Bytes the ring takes.
    fn bytes(&self) -> usize {
        self.ring.capacity() * size_of::<Entry>()
    }

    /// Whether appending an entry makes the ring grow (by [`Order::growth`] entries).
    fn grows(&self) -> bool {
        self.ring.len() == self.ring.capacity()
    }

    /// The entries a full ring grows by: an eighth of them, 16 at least. Not twice as many, as a
    /// `VecDeque` of its own would: at the bound a ring stays about as long as its shard has
    /// records, and with little room past its end the slot an append writes is one that an
    /// entry taken off the front left a few operations before, still in the cache, rather than
    /// one out of it. (It also keeps the ring's share of the bound small: 246 bytes a record
    /// counted at 10 thousand resident, 260 with doubling; and a ring near the bound grows by
    /// steps that still fit, where doubling would not.) The price is paid while a ring grows:
    /// about six steps for each doubling's one (from empty, 2.4 times as many at 625 entries,
    /// about 4 times at 80,000), each under its shard's lock, and each may copy the ring once
    /// to move it and most of it again (a wrapped ring's front part, when the step is too short
    /// to take its back part), where doubling's one step copies at most half of it again.
    fn growth(&self) -> usize {
        (self.ring.len() / 8).max(16)
    }

    /// The oldest entry, live or stale.
    fn front(&mut self) -> Option<Entry> {
        if let Some((0, next)) = self.compacting
            && next > 0
        {
            // Nothing kept yet: the gap is the front. (Entries are `Copy`: dropping a prefix of
            // a `VecDeque` moves its head, not the rest.)
            self.ring.drain(..next);
            self.compacting = Some((0, 0));
        }
        self.ring.front().copied()
    }

    /// Reads the entry [`READ_AHEAD`] places behind the front and throws it away: the entries
    /// come off the front in order, and a line of them read now, while the record at the front
    /// is looked up (a cache miss of its own), is in the cache when they reach the front, instead
    /// of a miss then that nothing else overlaps.
    #[inline(always)]
    fn read_ahead(&self) {
        if let Some(entry) = self.ring.get(READ_AHEAD) {
            std::hint::black_box(entry.stamp);
        }
    }

    /// Drops the entry [`Order::front`] returned.
    fn pop_front(&mut self) {
        self.ring.pop_front();
        if let Some((kept, next)) = &mut self.compacting {
            *kept = kept.saturating_sub(1);
            *next = next.saturating_sub(1);
        }
    }

    /// Drops the entry [`Order::front`] returned, found stale.
    #[inline(always)]
    fn pop_stale(&mut self) {
        self.pop_front();
        self.stale = self.stale.saturating_sub(1);
    }

    /// Appends `entry`, the youngest.
    #[inline(always)]
    fn push(&mut self, entry: Entry) {
        if self.grows() {
            self.ring.reserve_exact(self.growth());
        }
        self.ring.push_back(entry);
    }

    /// Notes that a record left the order other than from the front.
    fn forget(&mut self) {
        self.stale += 1;
    }

    /// Starts a compaction when stale entries are half the ring, and continues one for up to
    /// `steps` entries: each is looked up in `table`, kept if its record still holds its stamp,
    /// dropped if not.
    fn compact_some(&mut self, table: &HashTable<Record>, steps: usize) {
        if self.compacting.is_none() {
            if self.stale < 32 || self.stale * 2 < self.ring.len() {
                return;
            }
            self.compacting = Some((0, 0));
        }
        let Some((mut kept, mut next)) = self.compacting else {
            return;
        };
        for _ in 0..steps {
            let Some(&entry) = self.ring.get(next) else {
                self.ring.truncate(kept);
                self.compacting = None;
                return;
            };
            next += 1;
            if table.find(entry.hash, |r| r.holds(entry)).is_some() {
                self.ring[kept] = entry;
                kept += 1;
            } else {
                self.stale = self.stale.saturating_sub(1);
            }
        }
        self.compacting = Some((kept, next));
    }
}

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A claim: live until its lease ends, abandoned after.
    Claimed,
    /// A completed job's result.
    Completed,
    /// A released claim: only the key's generation and crash count are kept.
    Free,
    /// A job refused for good: its crash count reached its limit.
    Poisoned,
}

/// One `(scope, key)`'s record: 64 bytes aligned to 64, so that each takes one cache line of
/// its table. (At 72 bytes every record straddled two: a new record's write and the read of
/// the oldest one given up for it each missed the cache twice.)
#[repr(align(64))]
struct Record {
    /// The low half of the key's table hash, from which [`table_hash`] makes it whole again.
    hash: u32,
    /// The scope, the key, the fingerprint, then the payload, in one allocation: the claim's
    /// token while claimed, the stored result once completed, nothing otherwise.
    data: Box<[u8]>,
    scope_len: u32,
    key_len: u32,
    /// The fingerprint's length, or [`NO_FINGERPRINT`].
    fp_len: u32,
    /// Abandoned claims counted.
    crashes: u32,
    state: State,
    /// Nanoseconds since the epoch: when the record is dropped (a claim's TTL from its claim, a
    /// completed record's from its completion).
    expires: u64,
    /// The lease's end while claimed; the stamp ([`Shard::order`]'s or [`Shard::freed`]'s key)
    /// once completed or released; once poisoned, the end of the letter role's lease, or
    /// [`LETTERED`] once the letter is confirmed.
    at: u64,
    /// The claim's number among the key's claims, from 1.
    generation: u64,
}

/// [`Record::at`] of a poisoned record whose dead letter is confirmed.
const LETTERED: u64 = u64::MAX;

/// [`Record::fp_len`] of a record claimed without a fingerprint.
const NO_FINGERPRINT: u32 = u32::MAX;

impl Record {
    #[inline(always)]
    fn claimed(
        hash: u64,
        key: StoreKey<'_>,
        token: &str,
        fingerprint: Option<&str>,
        lease_end: u64,
        expires: u64,
    ) -> Result<Self, Error> {
        let too_long =
            || Error::Store("memory store: scope, key or fingerprint longer than 4 GiB".into());
        let scope_len = u32::try_from(key.scope.len()).map_err(|_| too_long())?;
        let key_len = u32::try_from(key.key.len()).map_err(|_| too_long())?;
        let fp = fingerprint.unwrap_or("");
        let fp_len = match fingerprint {
            Some(fp) => u32::try_from(fp.len())
                .ok()
                .filter(|&n| n != NO_FINGERPRINT)
                .ok_or_else(too_long)?,
            None => NO_FINGERPRINT,
        };
        let mut data = Vec::with_capacity(key.scope.len() + key.key.len() + fp.len() + token.len());
        data.extend_from_slice(key.scope.as_bytes());
        data.extend_from_slice(key.key.as_bytes());
        data.extend_from_slice(fp.as_bytes());
        data.extend_from_slice(token.as_bytes());
        Ok(Record {
            hash: hash as u32,
            data: data.into_boxed_slice(),
            scope_len,
            key_len,
            fp_len,
            crashes: 0,
            state: State::Claimed,
            expires: expires.max(lease_end),
            at: lease_end,
            generation: 1,
        })
    }

    #[inline]
    fn is(&self, hash: u64, key: StoreKey<'_>) -> bool {
        let (scope, key) = (key.scope.as_bytes(), key.key.as_bytes());
        self.hash == hash as u32
            && self.scope_len as usize == scope.len()
            && self.key_len as usize == key.len()
            && self.data.get(..scope.len()) == Some(scope)
            && self.data.get(scope.len()..scope.len() + key.len()) == Some(key)
    }

    fn fingerprint(&self) -> Option<&[u8]> {
        let at = self.scope_len as usize + self.key_len as usize;
        (self.fp_len != NO_FINGERPRINT).then(|| &self.data[at..at + self.fp_len as usize])
    }

    /// Where the payload starts in [`Record::data`].
    fn prefix(&self) -> usize {
        let fp = if self.fp_len == NO_FINGERPRINT {
            0
        } else {
            self.fp_len as usize
        };
        self.scope_len as usize + self.key_len as usize + fp
    }

    fn payload(&self) -> &[u8] {
        &self.data[self.prefix()..]
    }

    /// Replaces the payload with `built` when it is this record's data with the payload wanted
    /// (see [`completed_data`]: the scope, the key, then the payload, built before the lock for a
    /// record without a fingerprint), else with `payload` ([`Record::set_payload`]).
    #[inline]
    fn set_built_payload(&mut self, built: &mut Option<Box<[u8]>>, payload: &[u8]) {
        if self.fp_len == NO_FINGERPRINT
            && let Some(data) = built.take()
        {
            self.data = data;
        } else {
            self.set_payload(payload);
        }
    }

    /// Replaces the payload: a new allocation of the prefix and `payload`, the old one freed.
    fn set_payload(&mut self, payload: &[u8]) {
        let prefix = self.prefix();
        let mut data = Vec::with_capacity(prefix + payload.len());
        data.extend_from_slice(&self.data[..prefix]);
        data.extend_from_slice(payload);
        self.data = data.into_boxed_slice();
    }

    /// `token` holds a live claim on this record.
    fn held_by(&self, token: &str, now: u64) -> bool {
        self.live_claim(now) && self.payload() == token.as_bytes()
    }

    /// A claim whose lease has not ended.
    fn live_claim(&self, now: u64) -> bool {
        self.state == State::Claimed && self.at > now
    }

    /// Whether the record has a place in [`Shard::order`] (completed) or [`Shard::freed`]
    /// (released), under its stamp [`Record::at`]. A claim has none, and neither has a poisoned
    /// key: like a live claim it is never given up for room, only dropped once it expires
    /// (given up early, its job would run, crash and be poisoned and dead-lettered again).
    fn ordered(&self) -> bool {
        matches!(self.state, State::Completed | State::Free)
    }

    /// Whether this record holds `entry`'s place in its order: it is still ordered, under the
    /// entry's stamp. Stamps are unique within a shard, so of the records found by the entry's
    /// hash at most one holds it.
    #[inline(always)]
    fn holds(&self, entry: Entry) -> bool {
        self.ordered() && self.at == entry.stamp
    }

    fn heap(&self) -> usize {
        heap_bytes(self.data.len())
    }
}

/// A completed record's data as [`Record::set_payload`] would build it for a record claimed
/// without a fingerprint: the scope, the key, then `payload`. Built by `complete` before it hashes
/// the key, reads the clock and takes the lock, so that the writes into the new allocation (often
/// memory out of the cache: the data of the record the claim before gave up) reach the cache
/// while those go on, instead of holding up the lock's release.
fn completed_data(key: StoreKey<'_>, payload: &[u8]) -> Box<[u8]> {
    let (scope, key) = (key.scope.as_bytes(), key.key.as_bytes());
    let mut data = Vec::with_capacity(scope.len() + key.len() + payload.len());
    data.extend_from_slice(scope);
    data.extend_from_slice(key);
    data.extend_from_slice(payload);
    data.into_boxed_slice()
}

/// What an allocation of `len` bytes takes from a malloc like glibc's: a word of header, rounded
/// up to 16 bytes, 32 at least. Nothing for an empty one.
fn heap_bytes(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len + 8).next_multiple_of(16).max(32)
    }
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
    /// The data of the first record the operation took out of the table, freed once its lock
    /// is released: a record given up is the shard's oldest, its memory long out of the cache,
    /// and `free` reads and writes there.
    late: Option<Box<[u8]>>,
}

impl Tally {
    /// Takes a record out of the table: the first of an operation is freed after its lock is
    /// released, any more at once.
    fn discard(&mut self, record: Record) {
        if self.late.is_none() {
            self.late = Some(record.data);
        }
    }

    fn evicted(&mut self, age: u64) {
        if self.evicted == 0 {
            (self.youngest, self.oldest) = (age, age);
        }
        self.youngest = self.youngest.min(age);
        self.oldest = self.oldest.max(age);
        self.evicted += 1;
    }
}

impl Shard {
    /// An empty shard: nothing in it expires, ever, until a record is written.
    fn new() -> Self {
        Shard {
            due: NEVER,
            pass_min: NEVER,
            ..Shard::default()
        }
    }

    /// Bytes counted against the bound.
    fn bytes(&self) -> usize {
        self.table.allocation_size() + self.heap + self.order.bytes() + self.freed.bytes()
    }

    /// Whether the table doubles on the next insert: it has no room left, and too few of its
    /// buckets hold tombstones for the table to be rehashed in place instead (hashbrown does
    /// that when at most half its usable buckets are in use).
    fn grows(&self) -> bool {
        let (len, buckets) = (self.table.len(), self.table.num_buckets());
        let usable = if buckets < 8 {
            buckets.saturating_sub(1)
        } else {
            buckets / 8 * 7
        };
        len == self.table.capacity() && len + 1 > usable / 2
    }

    /// Whether a record of `heap` bytes fits (`adding`: as a new record, which may need the
    /// table to grow), without giving anything up.
    fn fits(&self, limits: &Limits, heap: usize, adding: bool) -> bool {
        let mut table = self.table.allocation_size();
        if adding {
            if self.table.len() >= limits.max_records {
                return false;
            }
            if self.grows() {
                table = (2 * table).max(4 * (size_of::<Record>() + 1) + 16);
            }
        }
        table + self.heap + heap + self.order.bytes() + self.freed.bytes() <= limits.max_bytes
    }

    /// Whether an entry appended to `order` (the completion order, else the released keys')
    /// fits: appending to a full ring grows it by [`Order::growth`] entries.
    fn entry_fits(&self, limits: &Limits, order: bool) -> bool {
        let ring = if order { &self.order } else { &self.freed };
        !ring.grows() || self.bytes() + ring.growth() * size_of::<Entry>() <= limits.max_bytes
    }

    /// Gives up completed records, oldest first and never one younger than the floor, until
    /// `heap` more bytes fit. `false` when they cannot.
    fn make_room(
        &mut self,
        limits: &Limits,
        heap: usize,
        adding: bool,
        now: u64,
        tally: &mut Tally,
    ) -> bool {
        self.give_up_until(limits, now, tally, |shard| shard.fits(limits, heap, adding))
    }

    /// Gives up records ([`Shard::give_up_oldest`]: never a completed one younger than the
    /// floor), [`MAX_EVICTIONS`] at most, until `fits` holds. `false` when it does not.
    #[inline(always)]
    fn give_up_until(
        &mut self,
        limits: &Limits,
        now: u64,
        tally: &mut Tally,
        fits: impl Fn(&Self) -> bool,
    ) -> bool {
        for _ in 0..MAX_EVICTIONS {
            if fits(self) {
                return true;
            }
            if !self.give_up_oldest(limits.min_retention, now, tally) {
                return false;
            }
        }
        fits(self)
    }

    /// Appends `entry` to `order` (the completion order, else the released keys'), and moves
    /// that order's compaction on. It first makes room if it can, so that the ring does not
    /// grow past the bound: like the table, a ring at the bound gives up its oldest entry
    /// rather than grow.
    #[inline(always)]
    fn push_entry(&mut self, op: &mut Op<'_>, order: bool, entry: Entry) {
        // Appended whether or not room was made.
        self.give_up_until(&op.limits, op.now, &mut op.tally, |shard| {
            shard.entry_fits(&op.limits, order)
        });
        let ring = if order {
            &mut self.order
        } else {
            &mut self.freed
        };
        ring.push(entry);
        ring.compact_some(&self.table, COMPACT_STEP);
    }

    /// Drops the oldest released key's record, else the oldest completed record if it expired
    /// or is older than `floor`. Stale entries at the front are dropped on the way (up to
    /// [`STALE_SKIP`] a call).
    ///
    /// The released keys' order is not walked with [`Shard::give_up_first`]: a history goes
    /// whatever its age and is counted as expired, never evicted; and a call that finds only
    /// stale entries there goes on to the completion order, where `give_up_first` would return
    /// with those stale entries as all it dropped.
    fn give_up_oldest(&mut self, floor: u64, now: u64, tally: &mut Tally) -> bool {
        for _ in 0..STALE_SKIP {
            let Some(entry) = self.freed.front() else {
                break;
            };
            if self.pop_freed(entry, tally) {
                return true;
            }
        }
        self.give_up_first(floor, now, tally)
    }

    /// Drops the oldest completed record if it expired or is older than `floor`, and the stale
    /// entries before it (up to [`STALE_SKIP`]). `true` when it dropped anything.
    fn give_up_first(&mut self, floor: u64, now: u64, tally: &mut Tally) -> bool {
        let mut dropped = false;
        for _ in 0..STALE_SKIP {
            let Some(entry) = self.order.front() else {
                return dropped;
            };
            self.order.read_ahead();
            let Ok(found) = self.table.find_entry(entry.hash, |r| r.holds(entry)) else {
                self.order.pop_stale();
                dropped = true;
                continue;
            };
            let expired = entry.expires <= now;
            let age = now.saturating_sub(entry.stamp);
            if !expired && age < floor {
                return dropped;
            }
            let (record, _) = found.remove();
            self.discard(record, tally);
            self.order.pop_front();
            if expired {
                tally.expired += 1;
            } else {
                tally.evicted(age);
            }
            return true;
        }
        dropped
    }

    /// Notes that a record in `state` left its order other than from the front.
    fn unorder(order: &mut Order, freed: &mut Order, state: State) {
        match state {
            State::Claimed | State::Poisoned => {}
            State::Free => freed.forget(),
            State::Completed => order.forget(),
        }
    }

    /// Pops `entry`, the released keys' oldest (from [`Order::front`]), and drops the record
    /// that holds it: a released key's history, given up quietly (no job's result is forgotten
    /// with it), counted as expired. `false` when none holds it (a stale entry).
    fn pop_freed(&mut self, entry: Entry, tally: &mut Tally) -> bool {
        let Ok(found) = self.table.find_entry(entry.hash, |r| r.holds(entry)) else {
            self.freed.pop_stale();
            return false;
        };
        let (record, _) = found.remove();
        self.discard(record, tally);
        self.freed.pop_front();
        tally.expired += 1;
        true
    }

    /// Takes `record`, just removed from the table, off the shard's bytes, and hands it to
    /// `tally` to be freed (see [`Tally::discard`]).
    #[inline(always)]
    fn discard(&mut self, record: Record, tally: &mut Tally) {
        self.heap -= record.heap();
        tally.discard(record);
    }

    /// The next stamp: unique and increasing, `now` when it can be.
    fn stamp(last_stamp: &mut u64, now: u64) -> u64 {
        let stamp = now.max(*last_stamp + 1);
        *last_stamp = stamp;
        stamp
    }

    /// Drops up to [`EXPIRE_STEP`] expired records from the old end of the completion order (and
    /// as many from the released keys'), then looks at `buckets` buckets of the table for any
    /// other expired record (a lapsed claim, a record with a shorter TTL than older ones), and
    /// moves a compaction of either order on. The buckets are skipped while [`Shard::due`] says
    /// that none holds an expired record.
    /// `pressed`: the shard is out of room, and abandoned claims (kept so the next claim can count
    /// them) go too.
    fn expire_some(&mut self, buckets: usize, now: u64, pressed: bool, tally: &mut Tally) {
        for _ in 0..EXPIRE_STEP {
            match self.order.front() {
                Some(entry) if entry.expires <= now => {
                    self.give_up_first(u64::MAX, now, tally);
                }
                _ => break,
            }
        }
        // Only an expired front entry itself, and only its own record: `give_up_oldest` would
        // go past a stale front to a released key whose history has not expired. (The loop
        // above may go past stale entries: under a floor no age reaches, `give_up_first` drops
        // only an expired record.)
        for _ in 0..EXPIRE_STEP {
            match self.freed.front() {
                Some(entry) if entry.expires <= now => {
                    self.pop_freed(entry, tally);
                }
                _ => break,
            }
        }
        let n = self.table.num_buckets();
        // Nothing expired (and, unless pressed, nothing else to drop): no bucket to look at.
        if n == 0 || (!pressed && now < self.due) {
            return;
        }
        for _ in 0..buckets.min(n) {
            self.cursor = (self.cursor + 1) & (n - 1);
            if let Ok(entry) = self.table.get_bucket_entry(self.cursor) {
                let record = entry.get();
                let lapsed = pressed && record.state == State::Claimed && record.at <= now;
                if record.expires <= now || lapsed {
                    let (record, _) = entry.remove();
                    Self::unorder(&mut self.order, &mut self.freed, record.state);
                    self.discard(record, tally);
                    tally.expired += 1;
                } else {
                    self.pass_min = self.pass_min.min(record.expires);
                }
            }
            // A pass ends when it has looked at every bucket once: every record kept was
            // looked at or written during it, so none expires before the earliest it saw.
            self.pass_left = self.pass_left.saturating_sub(1);
            if self.pass_left == 0 {
                self.due = self.pass_min;
                (self.pass_min, self.pass_left) = (u64::MAX, n);
            }
        }
    }

    /// Notes the expiry of a record just written, for [`Shard::due`].
    #[inline]
    fn written(&mut self, expires: u64) {
        self.due = self.due.min(expires);
        self.pass_min = self.pass_min.min(expires);
    }

    /// Inserts a new record. An insert into a table without room left may move every record
    /// to another bucket (a rehash, or a larger table): the sweep's pass starts again, so that
    /// it still looks at each record once before it ends.
    #[inline]
    fn insert(&mut self, record: Record, heap: usize) {
        let moves = self.table.len() == self.table.capacity();
        let expires = record.expires;
        self.heap += heap;
        let hash = table_hash(record.hash);
        self.table
            .insert_unique(hash, record, |r| table_hash(r.hash));
        if moves {
            (self.pass_min, self.pass_left) = (NEVER, self.table.num_buckets());
        }
        self.written(expires);
    }

    fn claim(
        &mut self,
        op: &mut Op<'_>,
        token: &str,
        options: &ClaimOptions<'_>,
    ) -> Result<Claimed, Error> {
        let (key, hash, now, limits) = (op.key, op.hash, op.now, &op.limits);
        let tally = &mut op.tally;
        let fingerprint = options.fingerprint;
        let lease_end = now.saturating_add(nanos(options.lease));
        let keep = now.saturating_add(nanos(options.ttl));
        if let Some(record) = self.table.find_mut(hash, |r| r.is(hash, key)) {
            let (mut generation, mut crashes) = (record.generation, 0);
            if record.expires > now {
                let reused = matches!(
                    (record.fingerprint(), fingerprint),
                    (Some(theirs), Some(ours)) if theirs != ours.as_bytes()
                );
                crashes = record.crashes;
                match record.state {
                    State::Completed if reused => return Ok(Claimed::KeyReused),
                    State::Completed => return Ok(Claimed::Completed(record.payload().to_vec())),
                    State::Poisoned => {
                        // The letter role, while no letter is confirmed and its last holder's
                        // lease has ended.
                        let letter = if record.at == LETTERED {
                            Letter::Written
                        } else if record.at > now {
                            Letter::Held
                        } else {
                            record.at = lease_end;
                            Letter::Yours
                        };
                        return Ok(Claimed::Poisoned { crashes, letter });
                    }
                    State::Claimed if record.at > now && reused => {
                        return Ok(Claimed::KeyReused);
                    }
                    State::Claimed if record.at > now => {
                        return Ok(Claimed::InProgress {
                            retry_in: Duration::from_nanos(record.at - now),
                        });
                    }
                    // Abandoned: its worker died (or stalled past its lease). Counted.
                    State::Claimed => crashes = crashes.saturating_add(1),
                    State::Free => {}
                }
                if options.crashes > 0 && crashes >= options.crashes {
                    Self::unorder(&mut self.order, &mut self.freed, record.state);
                    let before = record.heap();
                    record.state = State::Poisoned;
                    record.crashes = crashes;
                    record.set_payload(&[]);
                    record.expires = keep;
                    record.at = lease_end;
                    self.heap = self.heap + record.heap() - before;
                    self.written(keep);
                    return Ok(Claimed::Poisoned {
                        crashes,
                        letter: Letter::Yours,
                    });
                }
            } else {
                // Expired, history and all: the key is free again.
                tally.expired += 1;
            }
            // The new claim takes the record's place.
            let mut fresh = Record::claimed(hash, key, token, fingerprint, lease_end, keep)?;
            generation = generation.saturating_add(1);
            (fresh.generation, fresh.crashes) = (generation, crashes);
            let expires = fresh.expires;
            let old = std::mem::replace(record, fresh);
            self.heap = self.heap + record.heap() - old.heap();
            Self::unorder(&mut self.order, &mut self.freed, old.state);
            // The record taken over is cold: its data is freed once the lock is released.
            tally.discard(old);
            self.written(expires);
            return Ok(Claimed::Acquired {
                generation,
                crashes,
            });
        }
        /// A key's first claim in the store: nothing before it to number or count.
        const FIRST_CLAIM: Claimed = Claimed::Acquired {
            generation: 1,
            crashes: 0,
        };
        self.expire_some(SWEEP_STEP, now, false, tally);
        let mut record = Record::claimed(hash, key, token, fingerprint, lease_end, keep)?;
        let heap = record.heap();
        if self.table.len() < self.table.capacity() {
            // The table has a free slot: the record goes in first, and room is made after, with
            // the same rule (`fits` with the record in is `make_room`'s with it to come, the table
            // not growing). Its bucket's write, often a cache miss, then overlaps with the reads of
            // the record given up for it, instead of waiting for them.
            self.insert(record, heap);
            if self.give_up_until(limits, now, tally, |shard| {
                shard.table.len() <= limits.max_records && shard.fits(limits, 0, false)
            }) {
                return Ok(FIRST_CLAIM);
            }
            // No room: taken out again, and on as if it had never gone in (but for the table's
            // capacity: hashbrown may leave the slot a tombstone, as an eviction does, so that a
            // burst of refused claims can make a later claim grow the table or give up a record
            // sooner; the byte count follows the table's, so the bound holds).
            let Ok(entry) = self.table.find_entry(hash, |r| r.is(hash, key)) else {
                unreachable!("a claim just inserted is in its table");
            };
            record = entry.remove().0;
            self.heap -= heap;
        } else if self.make_room(limits, heap, true, now, tally) {
            self.insert(record, heap);
            return Ok(FIRST_CLAIM);
        }
        self.expire_some(SWEEP_MORE, now, true, tally);
        if !self.make_room(limits, heap, true, now, tally) {
            return Err(self.full_error(limits, now, heap));
        }
        self.insert(record, heap);
        Ok(FIRST_CLAIM)
    }

    /// The error that refuses a claim this shard has no room for: what fills the shard, in
    /// words, from one pass over its table.
    #[cold]
    fn full_error(&self, limits: &Limits, now: u64, heap: usize) -> Error {
        if self.table.is_empty() {
            // Nothing to give up: the bound itself is too small for one record.
            return Error::Store(format!(
                "memory store bound too small: a shard's share of max_bytes is {} bytes, less \
                 than one record with its table takes (this record's data alone is {heap} \
                 bytes); each of the {SHARDS} shards holds a {SHARDS}th of \
                 MemoryStore::builder().max_bytes, so raise it (the default is {} MiB)",
                limits.max_bytes,
                DEFAULT_MAX_BYTES / (1024 * 1024),
            ));
        }
        // Claims whose lease has not ended, and poisoned keys not yet expired (an expired one
        // no longer refuses its key).
        let (live_claims, poisoned) = self.table.iter().fold((0, 0), |(live, poisoned), r| {
            let is_poisoned = r.state == State::Poisoned && r.expires > now;
            (
                live + usize::from(r.live_claim(now)),
                poisoned + usize::from(is_poisoned),
            )
        });
        Error::Store(format!(
            "memory store full: a shard's {} records ({live_claims} live claims, {poisoned} \
             poisoned keys, the rest completed less than min_retention {:?} ago) fill its {} of {} \
             bytes; nothing can be given up \
             without forgetting a job that may still be redelivered. Raise \
             MemoryStore::builder().max_bytes, lower min_retention, or use a shared store",
            self.table.len(),
            Duration::from_nanos(limits.min_retention),
            self.bytes(),
            limits.max_bytes,
        ))
    }

    fn complete(
        &mut self,
        op: &mut Op<'_>,
        token: &str,
        result: &[u8],
        built: &mut Option<Box<[u8]>>,
        expires: u64,
    ) -> Result<(), Error> {
        let (key, hash, now) = (op.key, op.hash, op.now);
        let record = self
            .table
            .find_mut(hash, |r| r.is(hash, key))
            .filter(|r| r.held_by(token, now))
            .ok_or(Error::LeaseLost)?;
        let before = record.heap();
        let stamp = Self::stamp(&mut self.last_stamp, now);
        record.set_built_payload(built, result);
        record.state = State::Completed;
        record.expires = expires;
        record.at = stamp;
        self.heap = self.heap + record.heap() - before;
        self.written(expires);
        let entry = Entry {
            stamp,
            hash,
            expires,
        };
        self.push_entry(op, true, entry);
        // The result is kept whatever the room; older records make room for it if they can. A
        // floor of at least 1 ns keeps this record (its age is 0) even when stale entries
        // before it are dropped on the way and `min_retention` is zero.
        while !self.fits(&op.limits, 0, false)
            && self.order.front().is_some_and(|e| e.stamp != stamp)
            && self.give_up_oldest(op.limits.min_retention.max(1), now, &mut op.tally)
        {}
        Ok(())
    }

    fn renew(&mut self, op: &Op<'_>, token: &str, expires: u64) -> Result<(), Error> {
        let record = self
            .table
            .find_mut(op.hash, |r| r.is(op.hash, op.key))
            .filter(|r| r.held_by(token, op.now))
            .ok_or(Error::LeaseLost)?;
        record.at = expires;
        record.expires = record.expires.max(expires);
        Ok(())
    }

    /// Frees the key, keeping its generation and crash count until the claim's TTL.
    fn release(&mut self, op: &mut Op<'_>, token: &str) {
        let Some(record) = self
            .table
            .find_mut(op.hash, |r| r.is(op.hash, op.key))
            .filter(|r| r.held_by(token, op.now))
        else {
            return;
        };
        let (before, after, entry) = Self::freed(record, &mut self.last_stamp, op.hash, op.now);
        self.heap = self.heap + after - before;
        self.push_entry(op, false, entry);
    }

    /// Makes `record` (of the key hashed `hash`) a released key's history, stamped `now`: no
    /// token, no payload, its generation, crash count and expiry kept. Its heap bytes before and
    /// after, and the entry that puts it in the released keys' order (see `push_entry`). How a
    /// release and a forgive free a key.
    fn freed(
        record: &mut Record,
        last_stamp: &mut u64,
        hash: u64,
        now: u64,
    ) -> (usize, usize, Entry) {
        let before = record.heap();
        let stamp = Self::stamp(last_stamp, now);
        record.state = State::Free;
        record.set_payload(&[]);
        record.at = stamp;
        let entry = Entry {
            stamp,
            hash,
            expires: record.expires,
        };
        (before, record.heap(), entry)
    }
}

impl Shard {
    /// Forgives the key's crashes ([`Store::forgive`]): a poisoned key, or a claim whose lease
    /// lapsed, becomes a released key's history without crashes (its generation and expiry
    /// kept, and in the released keys' order, so that it goes first when room is short, as a
    /// released key's does); a released key's count goes back to 0. A completed record, a live
    /// claim and an expired record are left alone. `true` when a crash or a poisoned key was
    /// cleared.
    fn forgive(&mut self, op: &mut Op<'_>) -> bool {
        let (hash, now) = (op.hash, op.now);
        let Some(record) = self.table.find_mut(hash, |r| r.is(hash, op.key)) else {
            return false;
        };
        if record.expires <= now {
            // Expired, history and all: the next claim finds the key free and without crashes.
            return false;
        }
        match record.state {
            State::Completed => false,
            State::Claimed if record.at > now => false,
            State::Free => std::mem::replace(&mut record.crashes, 0) > 0,
            State::Poisoned | State::Claimed => {
                record.crashes = 0;
                let (before, after, entry) = Self::freed(record, &mut self.last_stamp, hash, now);
                self.heap = self.heap + after - before;
                self.push_entry(op, false, entry);
                true
            }
        }
    }
}

/// The keys of the store's SipHash-1-3: the hash `std`'s `RandomState` computes, with keys as
/// unpredictable as its own, written out so that the scope and the key go through it in one
/// pass (`std`'s `Hasher::write` pays for each call, and for the bytes left over between calls).
#[derive(Clone, Copy)]
struct SipKeys {
    k0: u64,
    k1: u64,
}

impl SipKeys {
    /// Two words from a `RandomState`, itself keyed from the operating system's randomness.
    fn random() -> Self {
        let state = RandomState::new();
        SipKeys {
            k0: state.hash_one(0x6a6f_6267_7561_7264_u64),
            k1: state.hash_one(0x6d65_6d6f_7279_u64),
        }
    }

    /// SipHash-1-3 of `a` then `b`.
    fn hash(&self, a: &[u8], b: &[u8]) -> u64 {
        siphash::<1, 3>(self.k0, self.k1, [a, b])
    }
}

/// SipHash-`C`-`D` with keys `k0`, `k1` of the concatenation of `parts`.
#[inline]
fn siphash<const C: usize, const D: usize>(k0: u64, k1: u64, parts: [&[u8]; 2]) -> u64 {
    #[inline(always)]
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    #[inline(always)]
    fn compress<const C: usize>(v: &mut [u64; 4], m: u64) {
        v[3] ^= m;
        for _ in 0..C {
            round(v);
        }
        v[0] ^= m;
    }
    /// Compresses the whole words of `bytes`, read straight from it, never through a buffer
    /// just written (whose bytes the processor would have to forward to a wider load), and
    /// returns the bytes left over: fewer than 8.
    #[inline(always)]
    fn compress_words<'a, const C: usize>(v: &mut [u64; 4], bytes: &'a [u8]) -> &'a [u8] {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            compress::<C>(v, u64::from_le_bytes(word.try_into().unwrap_or([0; 8])));
        }
        words.remainder()
    }
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let [a, mut b] = parts;
    let len = a.len() + b.len();
    // The bytes of `a` left over, topped up from `b`: `ntail` bytes, little-endian, in `tail`.
    let rest = compress_words::<C>(&mut v, a);
    let mut ntail = rest.len();
    let mut tail = le_word(rest);
    if ntail > 0 {
        let take = (8 - ntail).min(b.len());
        let (head, after) = b.split_at(take);
        tail |= le_word(head) << (8 * ntail);
        ntail += take;
        b = after;
        if ntail == 8 {
            compress::<C>(&mut v, tail);
            ntail = 0;
        }
    }
    // Once the word across the parts is whole, `b`'s own words (else `b` is spent).
    if ntail == 0 {
        tail = le_word(compress_words::<C>(&mut v, b));
    }
    compress::<C>(&mut v, tail | ((len as u64) << 56));
    v[2] ^= 0xff;
    for _ in 0..D {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// Fewer than 8 bytes as a little-endian word, the missing high bytes zero: the bytes a part
/// has left after its whole words, or those of the next part that top them up to a word.
#[inline(always)]
fn le_word(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    debug_assert!(n < 8, "le_word of {n} bytes");
    let u32_at = |i: usize| {
        u64::from(u32::from_le_bytes(
            bytes[i..i + 4].try_into().unwrap_or([0; 4]),
        ))
    };
    match n {
        // Four to seven: two 4-byte loads that overlap on the same bytes.
        4.. => u32_at(0) | (u32_at(n - 4) << (8 * (n - 4))),
        // The first, the middle and the last byte cover one to three bytes.
        1..=3 => {
            u64::from(bytes[0])
                | (u64::from(bytes[n / 2]) << (8 * (n / 2)))
                | (u64::from(bytes[n - 1]) << (8 * (n - 1)))
        }
        0 => 0,
    }
}

/// The hash a shard's table files a record under, from 32 bits of the key's SipHash (a record
/// keeps only those, so that it fits one cache line): they are its low half, which places the
/// record (the table takes its bucket from the low bits), and a multiple of them its high half,
/// whose top seven bits tag the record in the table's control bytes. The store picks the shard
/// by other bits of the SipHash (see `MemoryStore::locate`).
#[inline(always)]
fn table_hash(low: u32) -> u64 {
    (u64::from(low).wrapping_mul(0x9e37_79b9_7f4a_7c15) & !u64::from(u32::MAX)) | u64::from(low)
}

/// `d` in nanoseconds, saturating (a u64 of nanoseconds lasts 584 years), without the 128-bit
/// product of `Duration::as_nanos`.
fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
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
        self.inner.shards.iter().map(|s| lock(s).table.len()).sum()
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
        let now = self.inner.now();
        let (hash, shard) = self.locate(key);
        let shard = lock(shard);
        shard
            .table
            .find(hash, |r| r.is(hash, key))
            .filter(|r| r.state == State::Completed && r.expires > now)
            .map(|r| r.payload().to_vec())
    }

    /// `key`'s table hash ([`table_hash`]), computed once, and its shard. The shard is picked by
    /// bits 32–35 of the SipHash, which the table hash does not use (it is made of the low 32),
    /// so the records of one shard still spread over its whole table.
    fn locate(&self, key: StoreKey<'_>) -> (u64, &Mutex<Shard>) {
        // The scope's bytes, then the key's: pairs that spell the same bytes, such as
        // `("ab", "c")` and `("a", "bc")`, share a hash and are told apart by the comparison
        // of both parts.
        let hash = self
            .inner
            .hasher
            .hash(key.scope.as_bytes(), key.key.as_bytes());
        (
            table_hash(hash as u32),
            &self.inner.shards[(hash >> 32) as usize % SHARDS],
        )
    }

    /// Runs `f` on `key`'s shard with the time read once, then reports what it dropped.
    fn with_shard<R>(&self, key: StoreKey<'_>, f: impl FnOnce(&mut Shard, &mut Op<'_>) -> R) -> R {
        let (hash, shard) = self.locate(key);
        let mut op = Op {
            key,
            hash,
            now: self.inner.now(),
            limits: self.inner.limits,
            tally: Tally::default(),
        };
        let mut shard = lock(shard);
        let out = f(&mut shard, &mut op);
        // One counter at a time, and only when it moves: read as one 16-byte pair, the two
        // counts would wait for their 8-byte writes to reach the cache (no store forwarding),
        // and with them for every older write (the new record's bucket among them).
        if op.tally.evicted != 0 {
            shard.evicted += op.tally.evicted;
        }
        if op.tally.expired != 0 {
            shard.expired += op.tally.expired;
        }
        drop(shard);
        // Unlocked: the data of the record the operation took out is freed when `op` goes, at
        // the end of this function. Its last byte is read first (the value thrown away): `free`
        // reads only the block's first line, and glibc's per-thread cache hands the block to
        // the next allocation of its size on this thread (at the bound, the next completion's
        // data), which writes it whole. The last line comes in now, beside `free`'s miss,
        // instead of holding up that writer's lock; a block of two lines (usually, a small
        // result's, as most are) is then in the cache whole.
        if let Some(last) = op.tally.late.as_deref().and_then(<[u8]>::last) {
            std::hint::black_box(*last);
        }
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

impl Inner {
    fn stats(&self) -> MemoryStats {
        let (mut records, mut bytes, mut evicted, mut expired) = (0, 0, 0, 0);
        for shard in &self.shards {
            let shard = lock(shard);
            records += shard.table.len();
            bytes += shard.bytes();
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

    fn report_evictions(&self, tally: &Tally, now: u64) {
        let (youngest, oldest) = (
            Duration::from_nanos(tally.youngest),
            Duration::from_nanos(tally.oldest),
        );
        let event = crate::Event::Evicted {
            store: "memory",
            records: tally.evicted,
            youngest,
            oldest,
        };
        crate::observe::emit_unowned(&event);
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

/// The future of a call that succeeded with nothing to return: ready, and of no size.
struct Succeeded;

impl std::future::Future for Succeeded {
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(()))
    }
}

/// `result` as a [`StoreFuture`], allocating only for an error.
fn done<'a>(result: Result<(), Error>) -> StoreFuture<'a, ()> {
    match result {
        Ok(()) => Box::pin(Succeeded),
        Err(e) => Box::pin(std::future::ready(Err(e))),
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
        // The data is built first (see `completed_data`); unused, it is freed once the lock is
        // released (a record with a fingerprint builds its own; a lost lease keeps nothing).
        // Only for a small result: a record with a fingerprint (every one the HTTP layer
        // stores) would copy a large one twice.
        let mut built = (record.len() <= PREBUILT_MAX).then(|| completed_data(key, record));
        done(self.with_shard(key, |shard, op| {
            let expires = op.now.saturating_add(nanos(ttl));
            shard.complete(op, token, record, &mut built, expires)
        }))
    }

    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        self.with_shard(key, |shard, op| shard.release(op, token));
        done(Ok(()))
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

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        done(self.with_shard(key, |shard, op| {
            let expires = op.now.saturating_add(nanos(lease));
            shard.renew(op, token, expires)
        }))
    }

    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
        self.with_shard(key, |shard, op| {
            let (key, hash, now) = (op.key, op.hash, op.now);
            if let Some(record) = shard.table.find_mut(hash, |r| r.is(hash, key))
                && record.state == State::Poisoned
                && record.expires > now
            {
                record.at = LETTERED;
            }
        });
        done(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Claim, PlainClaim};

    const K: StoreKey<'static> = StoreKey {
        scope: "s",
        key: "k",
    };
    const LEASE: Duration = Duration::from_secs(30);

    /// A claim without a crash limit, as it found the key.
    fn claim_now(
        s: &MemoryStore,
        key: StoreKey<'_>,
        token: &str,
        fingerprint: Option<&str>,
        lease: Duration,
    ) -> Result<Claim, Error> {
        let options = ClaimOptions::new(lease).fingerprint(fingerprint).crashes(0);
        Claim::of(s.claim_counted(key, token, &options)?)
    }

    fn claim(s: &MemoryStore, key: StoreKey<'_>, token: &str) -> Claim {
        let options = ClaimOptions::new(LEASE).crashes(0);
        Claim::of(s.claim_counted(key, token, &options).unwrap()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn lease_lapses_and_a_stale_token_cannot_touch_the_successor() {
        let s = MemoryStore::new();
        assert_eq!(claim(&s, K, "old"), Claim::Acquired);
        tokio::time::advance(LEASE).await;
        assert_eq!(claim(&s, K, "new"), Claim::Acquired);
        assert_eq!(
            s.complete(K, "old", b"x", LEASE).await,
            Err(Error::LeaseLost)
        );
        assert_eq!(s.renew(K, "old", LEASE).await, Err(Error::LeaseLost));
        s.release(K, "old").await.unwrap();
        assert!(
            matches!(claim(&s, K, "third"), Claim::InProgress { retry_in } if retry_in == LEASE)
        );
        s.complete(K, "new", b"ok", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(claim(&s, K, "fourth"), Claim::Completed(b"ok".to_vec()));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(claim(&s, K, "fifth"), Claim::Acquired, "ttl honoured");
    }

    #[tokio::test(start_paused = true)]
    async fn full_store_evicts_expired_first_and_never_a_live_record() {
        let s = MemoryStore::with_capacity(SHARDS); // one record per shard
        let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        let mut refused = 0;
        let mut won = Vec::new();
        for k in &keys {
            match claim_now(&s, StoreKey { scope: "s", key: k }, "t", None, LEASE) {
                Ok(Claim::Acquired) => won.push(k.clone()),
                Err(Error::Store(_)) => refused += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(!won.is_empty() && won.len() <= SHARDS);
        assert_eq!(
            refused,
            keys.len() - won.len(),
            "no room: refused, not forgotten"
        );
        for k in &won {
            // still held: no live claim was evicted to make room
            assert!(matches!(
                claim(&s, StoreKey { scope: "s", key: k }, "u"),
                Claim::InProgress { .. }
            ));
        }
        tokio::time::advance(LEASE).await;
        // expired claims make room again
        let fresh: usize = keys
            .iter()
            .filter(|k| {
                matches!(
                    claim_now(&s, StoreKey { scope: "t", key: k }, "t", None, LEASE),
                    Ok(Claim::Acquired)
                )
            })
            .count();
        assert!(fresh > 0 && fresh <= SHARDS);
    }

    #[tokio::test]
    async fn fingerprints_and_scopes() {
        let s = MemoryStore::new();
        assert_eq!(
            claim_now(&s, K, "a", Some("f1"), LEASE).unwrap(),
            Claim::Acquired
        );
        assert_eq!(
            claim_now(&s, K, "b", Some("f2"), LEASE).unwrap(),
            Claim::KeyReused
        );
        assert!(matches!(
            claim_now(&s, K, "b", Some("f1"), LEASE).unwrap(),
            Claim::InProgress { .. }
        ));
        assert_eq!(
            claim_now(
                &s,
                StoreKey {
                    scope: "other",
                    key: "k"
                },
                "c",
                None,
                LEASE
            )
            .unwrap(),
            Claim::Acquired
        );
    }

    #[tokio::test]
    async fn no_two_scope_key_pairs_share_a_record() {
        let s = MemoryStore::new();
        let pairs = [
            ("ab", "c"),
            ("a", "bc"),
            ("abc", ""),
            ("", "abc"),
            ("a\0", "bc"),
        ];
        for (i, &(scope, key)) in pairs.iter().enumerate() {
            let k = StoreKey { scope, key };
            assert_eq!(claim(&s, k, "t"), Claim::Acquired, "{scope:?} {key:?}");
            s.complete(k, "t", i.to_string().as_bytes(), LEASE)
                .await
                .unwrap();
        }
        for (i, &(scope, key)) in pairs.iter().enumerate() {
            let k = StoreKey { scope, key };
            assert_eq!(s.completed(k), Some(i.to_string().into_bytes()));
        }
        assert_eq!(s.len(), pairs.len());
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_record_is_reclaimed_in_place_even_when_full() {
        let s = MemoryStore::with_capacity(SHARDS); // one record per shard
        assert_eq!(claim(&s, K, "a"), Claim::Acquired);
        s.complete(K, "a", b"x", Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(s.completed(K), Some(b"x".to_vec()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(s.completed(K), None, "expired");
        assert_eq!(claim(&s, K, "b"), Claim::Acquired);
        assert_eq!(s.len(), 1);
        assert_eq!(s.complete(K, "a", b"y", LEASE).await, Err(Error::LeaseLost));
        s.renew(K, "b", Duration::from_secs(60)).await.unwrap();
        tokio::time::advance(LEASE).await;
        assert!(
            matches!(claim(&s, K, "c"), Claim::InProgress { retry_in } if retry_in == LEASE),
            "renewed from now"
        );
        s.release(K, "c").await.unwrap();
        assert_eq!(s.len(), 1, "a non-holder's release is a no-op");
        s.release(K, "b").await.unwrap();
        assert_eq!(
            s.len(),
            1,
            "a released key keeps its generation and crash count"
        );
        assert_eq!(claim(&s, K, "d"), Claim::Acquired);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fingerprint_survives_completion_and_a_reclaim_replaces_it() {
        let s = MemoryStore::new();
        assert_eq!(
            claim_now(&s, K, "a", Some("f1"), LEASE).unwrap(),
            Claim::Acquired
        );
        s.complete(K, "a", b"r", Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(
            claim_now(&s, K, "b", Some("f2"), LEASE).unwrap(),
            Claim::KeyReused
        );
        assert_eq!(
            claim_now(&s, K, "b", None, LEASE).unwrap(),
            Claim::Completed(b"r".to_vec())
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            claim_now(&s, K, "c", Some("f2"), LEASE).unwrap(),
            Claim::Acquired
        );
        assert!(matches!(
            claim_now(&s, K, "d", Some("f2"), LEASE).unwrap(),
            Claim::InProgress { .. }
        ));
        assert_eq!(
            claim_now(&s, K, "d", Some("f1"), LEASE).unwrap(),
            Claim::KeyReused
        );
    }

    /// Claims and completes `n` keys `{prefix}{i}` with `ttl`.
    async fn fill(s: &MemoryStore, prefix: &str, n: usize, ttl: Duration) {
        for i in 0..n {
            let key = format!("{prefix}{i}");
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            assert_eq!(claim(s, k, "t"), Claim::Acquired, "{key}");
            s.complete(k, "t", &[7; 100], ttl).await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_completed_records_go_first_and_only_past_the_floor() {
        let floor = Duration::from_secs(60);
        let s = MemoryStore::builder()
            .max_bytes(SHARDS * 8 * 1024)
            .min_retention(floor)
            .build();
        let ttl = Duration::from_secs(24 * 3600);
        fill(&s, "old", 120, ttl).await;
        assert_eq!(s.stats().evicted, 0);
        // (Completion stamps are unique: records completed at one instant are a nanosecond apart.)
        tokio::time::advance(floor + Duration::from_millis(1)).await;
        // Past the floor, the old records make room for new ones, until only young ones are left:
        // then a new claim fails closed, in words.
        let mut done = Vec::new();
        let refused = loop {
            let key = format!("new{}", done.len());
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            match claim_now(&s, k, "t", None, LEASE) {
                Ok(Claim::Acquired) => s.complete(k, "t", &[7; 100], ttl).await.unwrap(),
                Err(e) => break e,
                Ok(other) => panic!("{other:?}"),
            }
            done.push(key);
            assert!(done.len() < 10_000, "never refused: {:?}", s.stats());
        };
        let Error::Store(words) = refused else {
            panic!("{refused:?}")
        };
        assert!(words.contains("min_retention"), "{words}");
        let stats = s.stats();
        assert!(stats.evicted > 0, "{stats:?}");
        for key in &done {
            let k = StoreKey { scope: "s", key };
            assert!(
                s.completed(k).is_some(),
                "{key}: younger than the floor, kept"
            );
        }
        let old_kept = (0..120)
            .filter(|i| {
                let key = format!("old{i}");
                s.completed(StoreKey {
                    scope: "s",
                    key: &key,
                })
                .is_some()
            })
            .count();
        assert_eq!(old_kept as u64, 120 - stats.evicted, "{stats:?}");
        // A claim of a completed key still replays.
        assert_eq!(
            claim(
                &s,
                StoreKey {
                    scope: "s",
                    key: &done[0]
                },
                "u"
            ),
            Claim::Completed(vec![7; 100])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expired_records_are_dropped_a_few_at_a_time() {
        let s = MemoryStore::new();
        fill(&s, "a", 2_000, Duration::from_secs(1)).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut claims = 0;
        // Each claim adds its own record (a released key's history), and drops a few expired.
        while s.stats().expired < 1_900 {
            let key = format!("b{claims}");
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            let before = s.stats().expired;
            assert_eq!(claim(&s, k, "t"), Claim::Acquired);
            s.release(k, "t").await.unwrap();
            let dropped = s.stats().expired - before;
            assert!(dropped <= (EXPIRE_STEP + SWEEP_STEP) as u64, "bounded work");
            claims += 1;
        }
        assert!(s.stats().expired >= 1_900);
        assert!(claims > 2_000 / (EXPIRE_STEP + SWEEP_STEP));
    }

    fn counted(s: &MemoryStore, token: &str, crashes: u32) -> Claimed {
        let options = ClaimOptions::new(LEASE).crashes(crashes);
        s.claim_counted(K, token, &options).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn abandoned_claims_are_counted_until_the_key_is_poisoned() {
        let s = MemoryStore::new();
        let acquired = |generation, crashes| Claimed::Acquired {
            generation,
            crashes,
        };
        assert_eq!(counted(&s, "a", 3), acquired(1, 0));
        tokio::time::advance(LEASE).await;
        assert_eq!(counted(&s, "b", 3), acquired(2, 1), "a takeover, counted");
        // A release is not a crash, and keeps the count and the generation.
        s.release(K, "b").await.unwrap();
        assert_eq!(counted(&s, "c", 3), acquired(3, 1));
        tokio::time::advance(LEASE).await;
        assert_eq!(counted(&s, "d", 3), acquired(4, 2));
        tokio::time::advance(LEASE).await;
        assert_eq!(
            counted(&s, "e", 3),
            Claimed::Poisoned {
                crashes: 3,
                letter: Letter::Yours
            }
        );
        assert_eq!(
            counted(&s, "f", 3),
            Claimed::Poisoned {
                crashes: 3,
                letter: Letter::Held
            },
            "refused for good, reported once"
        );
        assert_eq!(
            s.claim_plain(K, "g", None, LEASE).await,
            Err(Error::Poisoned { crashes: 3 })
        );
        assert_eq!(s.complete(K, "d", b"x", LEASE).await, Err(Error::LeaseLost));
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_limit_of_zero_never_poisons_and_a_live_claim_is_not_a_crash() {
        let s = MemoryStore::new();
        for generation in 1..=5 {
            assert_eq!(
                counted(&s, &format!("t{generation}"), 0),
                Claimed::Acquired {
                    generation,
                    crashes: generation as u32 - 1
                }
            );
            assert!(matches!(
                counted(&s, "other", 0),
                Claimed::InProgress { .. }
            ));
            tokio::time::advance(LEASE).await;
        }
    }

    /// Claims `K` and lets the claim lapse, so that the next claim (`crashes(1)`) poisons it.
    async fn poison(s: &MemoryStore, options: &ClaimOptions<'_>) {
        assert!(matches!(
            s.claim_counted(K, "a", options).unwrap(),
            Claimed::Acquired { .. }
        ));
        tokio::time::advance(LEASE).await;
        assert!(matches!(
            s.claim_counted(K, "b", options).unwrap(),
            Claimed::Poisoned {
                letter: Letter::Yours,
                ..
            }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_refused_for_room_leaves_nothing_behind() {
        // Full of live claims at 512 records (32 a shard): a new claim goes into its table's
        // free slot first, finds nothing to give up, and is taken out again.
        let s = MemoryStore::builder().max_records(512).build();
        let mut held = 0;
        let refused = loop {
            let key = format!("held{held}");
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            match claim_now(&s, k, "t", None, LEASE) {
                Ok(Claim::Acquired) => held += 1,
                Err(e) => break (key, e),
                Ok(other) => panic!("{other:?}"),
            }
        };
        assert!(matches!(refused.1, Error::Store(_)), "{:?}", refused.1);
        let before = s.stats();
        assert_eq!(before.records, held);
        for _ in 0..3 {
            let k = StoreKey {
                scope: "s",
                key: &refused.0,
            };
            assert!(claim_now(&s, k, "t", None, LEASE).is_err());
            assert_eq!(s.stats(), before, "nothing kept, nothing counted");
            assert_eq!(s.completed(k), None);
        }
        // Once the leases lapse, the key is claimed afresh: its first generation.
        tokio::time::advance(LEASE).await;
        let k = StoreKey {
            scope: "s",
            key: &refused.0,
        };
        assert_eq!(
            s.claim_counted(k, "u", &ClaimOptions::new(LEASE)).unwrap(),
            Claimed::Acquired {
                generation: 1,
                crashes: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_poisoned_record_is_never_given_up_for_room_before_its_ttl() {
        // Full at 512 records with no floor: a new claim gives up the oldest completed one.
        let s = MemoryStore::builder()
            .max_records(512)
            .min_retention(Duration::ZERO)
            .build();
        let options = ClaimOptions::new(LEASE).crashes(1);
        poison(&s, &options).await;
        // Many more poisoned keys, older than any completed record: none is in the way.
        let poisoned: Vec<String> = (0..200).map(|i| format!("poisoned{i}")).collect();
        for key in &poisoned {
            let k = StoreKey { scope: "s", key };
            s.claim_counted(k, "a", &options).unwrap();
        }
        tokio::time::advance(LEASE).await;
        for key in &poisoned {
            let k = StoreKey { scope: "s", key };
            assert!(matches!(
                s.claim_counted(k, "b", &options).unwrap(),
                Claimed::Poisoned {
                    letter: Letter::Yours,
                    ..
                }
            ));
        }
        for i in 0..2_000 {
            let key = format!("job{i}");
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            assert_eq!(claim(&s, k, "t"), Claim::Acquired, "{key}");
            s.complete(k, "t", b"r", Duration::from_secs(3600))
                .await
                .unwrap();
        }
        assert!(s.stats().evicted >= 1_500, "{:?}", s.stats());
        // Still poisoned, not claimed (no letter was confirmed, so the role is handed out
        // again).
        assert!(matches!(
            s.claim_counted(K, "c", &options).unwrap(),
            Claimed::Poisoned { crashes: 1, .. }
        ));
        for key in &poisoned {
            let k = StoreKey { scope: "s", key };
            assert!(matches!(
                s.claim_counted(k, "c", &options).unwrap(),
                Claimed::Poisoned { crashes: 1, .. }
            ));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_poisoned_key_is_refused_for_its_ttl() {
        let s = MemoryStore::new();
        let ttl = Duration::from_secs(3600);
        let options = ClaimOptions::new(LEASE).crashes(1).ttl(ttl);
        poison(&s, &options).await;
        tokio::time::advance(ttl - Duration::from_secs(1)).await;
        assert!(matches!(
            s.claim_counted(K, "c", &options).unwrap(),
            Claimed::Poisoned { .. }
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(matches!(
            s.claim_counted(K, "d", &options).unwrap(),
            Claimed::Acquired { crashes: 0, .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgiven_key_is_kept_as_a_released_keys_history() {
        let s = MemoryStore::new();
        let ttl = Duration::from_secs(3600);
        let options = ClaimOptions::new(LEASE).crashes(1).ttl(ttl);
        poison(&s, &options).await;
        assert_eq!(entries(&s), (0, 0, 1), "a poisoned key is in no order");
        assert_eq!(s.forgive(K).await, Ok(true));
        assert_eq!(
            entries(&s),
            (0, 1, 1),
            "forgiven: a released key's history, first to go when room is short"
        );
        assert_eq!(s.forgive(K).await, Ok(false), "nothing left to forgive");
        assert_eq!(
            s.claim_counted(K, "c", &options).unwrap(),
            Claimed::Acquired {
                generation: 2,
                crashes: 0
            }
        );
        // A lapsed claim: forgiven, so that its takeover counts no crash.
        tokio::time::advance(LEASE).await;
        assert_eq!(s.forgive(K).await, Ok(true));
        assert_eq!(s.complete(K, "c", b"x", ttl).await, Err(Error::LeaseLost));
        assert_eq!(
            s.claim_counted(K, "d", &options).unwrap(),
            Claimed::Acquired {
                generation: 3,
                crashes: 0
            }
        );
        // A key whose history expired: nothing to forgive, and the key is free without it.
        tokio::time::advance(LEASE).await;
        assert!(matches!(
            s.claim_counted(K, "e", &options).unwrap(),
            Claimed::Poisoned {
                letter: Letter::Yours,
                ..
            }
        ));
        tokio::time::advance(ttl).await;
        assert_eq!(s.forgive(K).await, Ok(false));
        assert!(matches!(
            s.claim_counted(K, "f", &options).unwrap(),
            Claimed::Acquired { crashes: 0, .. }
        ));
        assert_eq!(s.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn records_only_the_sweep_finds_expire_however_the_tables_grew_since() {
        let s = MemoryStore::new();
        // Claims taken and never completed nor released: in no order, only the sweep finds
        // them once their TTL ends.
        let short = ClaimOptions::new(Duration::from_millis(1)).ttl(Duration::from_secs(1));
        for i in 0..100 {
            let key = format!("abandoned{i}");
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            assert!(matches!(
                s.claim_counted(k, "t", &short).unwrap(),
                Claimed::Acquired { .. }
            ));
        }
        // The tables grow (each record moves to another bucket) while no record has expired.
        fill(&s, "long", 5_000, Duration::from_secs(24 * 3600)).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        let abandoned = |s: &MemoryStore| {
            s.inner.shards.iter().fold(0, |n, shard| {
                let shard = lock(shard);
                n + shard
                    .table
                    .iter()
                    .filter(|r| r.data.starts_with(b"sabandoned"))
                    .count()
            })
        };
        assert_eq!(abandoned(&s), 100);
        // Jobs whose records live a millisecond: the tables stay the size they are, and each
        // claim's sweep looks at one more bucket of its shard's.
        let mut claims = 0;
        while abandoned(&s) > 0 {
            for _ in 0..100 {
                let key = format!("new{claims}");
                let k = StoreKey {
                    scope: "s",
                    key: &key,
                };
                assert_eq!(claim(&s, k, "t"), Claim::Acquired);
                s.complete(k, "t", b"x", Duration::from_millis(1))
                    .await
                    .unwrap();
                tokio::time::advance(Duration::from_millis(1)).await;
                claims += 1;
            }
            assert!(claims < 50_000, "{:?}", s.stats());
        }
    }

    #[test]
    fn a_shard_with_nothing_due_looks_at_no_bucket() {
        let mut shard = Shard::new();
        let keys = SipKeys::random();
        for i in 0..100u64 {
            let key = i.to_string();
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            let hash = table_hash(keys.hash(b"s", key.as_bytes()) as u32);
            let at = 1_000 + i;
            let record = Record::claimed(hash, k, "t", None, at, 1_000_000 + i).unwrap();
            let heap = record.heap();
            shard.insert(record, heap);
        }
        let mut tally = Tally::default();
        // A pass over the whole table finds the earliest expiry; the sweep then rests.
        let n = shard.table.num_buckets();
        shard.expire_some(n, 2_000, false, &mut tally);
        assert_eq!(shard.due, 1_000_000);
        let cursor = shard.cursor;
        shard.expire_some(1, 2_000, false, &mut tally);
        assert_eq!(shard.cursor, cursor, "nothing due: no bucket looked at");
        // Pressed, it looks anyway (for lapsed claims), and drops them all.
        shard.expire_some(n, 2_000, true, &mut tally);
        assert_eq!((shard.table.len(), tally.expired), (0, 100));
    }

    /// Entries in each shard's two orders, and records in all.
    fn entries(s: &MemoryStore) -> (usize, usize, usize) {
        s.inner.shards.iter().fold((0, 0, 0), |(o, f, r), shard| {
            let shard = lock(shard);
            (
                o + shard.order.ring.len(),
                f + shard.freed.ring.len(),
                r + shard.table.len(),
            )
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_released_and_claimed_again_leaves_few_stale_entries() {
        let s = MemoryStore::new();
        for i in 0..10_000 {
            assert_eq!(claim(&s, K, &format!("t{i}")), Claim::Acquired);
            s.release(K, &format!("t{i}")).await.unwrap();
        }
        let (order, freed, records) = entries(&s);
        assert_eq!((order, records), (0, 1));
        assert!(freed <= 100, "{freed} entries in the released keys' order");
        assert_eq!(claim(&s, K, "last"), Claim::Acquired);
    }

    #[tokio::test(start_paused = true)]
    async fn records_that_expire_behind_a_longer_lived_one_leave_few_stale_entries() {
        let s = MemoryStore::new();
        // The oldest records of every shard live a day; those after them a millisecond, and
        // the sweep drops them from behind the long-lived ones.
        fill(&s, "long", 256, Duration::from_secs(24 * 3600)).await;
        for round in 0..200 {
            fill(&s, &format!("short{round}."), 100, Duration::from_millis(1)).await;
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        let (order, _, records) = entries(&s);
        assert!(
            order <= 2 * records + SHARDS * 64,
            "{order} entries in the completion orders for {records} records"
        );
        for i in 0..256 {
            let key = format!("long{i}");
            assert_eq!(
                s.completed(StoreKey {
                    scope: "s",
                    key: &key
                }),
                Some(vec![7; 100])
            );
        }
    }

    #[test]
    #[allow(deprecated)] // `SipHasher` is SipHash-2-4: the reference for the rounds.
    fn siphash_is_siphash_however_the_bytes_are_split() {
        use std::hash::{Hasher, SipHasher};
        let bytes: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(37)).collect();
        let (k0, k1) = (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);
        for len in 0..bytes.len() {
            let whole = &bytes[..len];
            let mut reference = SipHasher::new_with_keys(k0, k1);
            reference.write(whole);
            let expected = reference.finish();
            for cut in 0..=len {
                let (a, b) = whole.split_at(cut);
                assert_eq!(
                    siphash::<2, 4>(k0, k1, [a, b]),
                    expected,
                    "{len} split at {cut}"
                );
            }
        }
        // The reference vector of the SipHash paper: 15 bytes 00..0e under keys 00..0f.
        let fifteen: Vec<u8> = (0..15).collect();
        assert_eq!(
            siphash::<2, 4>(k0, k1, [&fifteen, &[]]),
            0xa129_ca61_49be_45e5
        );
        let keys = SipKeys::random();
        assert_eq!(keys.hash(b"ab", b"c"), keys.hash(b"a", b"bc"));
        assert_ne!(keys.hash(b"ab", b"c"), keys.hash(b"ab", b"d"));
    }

    #[test]
    fn heap_bytes_rounds_like_malloc() {
        assert_eq!(heap_bytes(0), 0);
        assert_eq!(heap_bytes(1), 32);
        assert_eq!(heap_bytes(24), 32);
        assert_eq!(heap_bytes(25), 48);
    }

    #[test]
    fn an_order_grows_by_an_eighth_and_the_bound_counts_that_step() {
        let mut order = Order::default();
        let entry = |n: u64| Entry {
            stamp: n,
            hash: n,
            expires: n,
        };
        let mut capacities = vec![];
        for n in 0..2_000 {
            if order.grows() {
                let expected = order.ring.len() + order.growth();
                order.push(entry(n));
                assert_eq!(order.ring.capacity(), expected);
                capacities.push(expected);
            } else {
                order.push(entry(n));
            }
        }
        assert_eq!(&capacities[..4], &[16, 32, 48, 64]);
        assert!(
            capacities
                .windows(2)
                .all(|w| w[1] == w[0] + (w[0] / 8).max(16))
        );
        // A shard whose completion order is full fits an entry only with the step's bytes.
        let mut shard = Shard::new();
        shard.order = order;
        while !shard.order.grows() {
            shard.order.push(entry(0));
        }
        let step = shard.order.growth() * size_of::<Entry>();
        let limits = |max_bytes| Limits {
            max_bytes,
            max_records: usize::MAX,
            min_retention: 0,
        };
        assert!(shard.entry_fits(&limits(shard.bytes() + step), true));
        assert!(!shard.entry_fits(&limits(shard.bytes() + step - 1), true));
    }

    /// One job on `shard` at time `i`: claims key `i` and completes it, under `limits`. The
    /// records it gave up for room.
    fn shard_job(shard: &mut Shard, keys: &SipKeys, i: u64, limits: Limits) -> u64 {
        let key = i.to_string();
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        let hash = table_hash(keys.hash(b"s", key.as_bytes()) as u32);
        let mut op = Op {
            key: k,
            hash,
            now: i,
            limits,
            tally: Tally::default(),
        };
        let options = ClaimOptions::new(LEASE);
        let claimed = shard.claim(&mut op, "t", &options).unwrap();
        assert!(matches!(claimed, Claimed::Acquired { .. }), "{claimed:?}");
        shard
            .complete(&mut op, "t", b"result", &mut None, NEVER)
            .unwrap();
        op.tally.evicted
    }

    #[test]
    fn a_full_ring_grows_only_by_a_step_that_fits_and_else_gives_up_its_oldest() {
        let keys = SipKeys::random();
        let unbounded = Limits {
            max_bytes: usize::MAX,
            max_records: usize::MAX,
            min_retention: 0,
        };
        // A shard whose completion ring has just filled (and whose table has room left).
        let filled = |keys: &SipKeys| {
            let mut shard = Shard::new();
            let mut i = 0;
            while !(shard.order.grows() && shard.order.ring.len() >= 48) {
                shard_job(&mut shard, keys, i, unbounded);
                i += 1;
            }
            (shard, i)
        };
        let (probe, _) = filled(&keys);
        let step = probe.order.growth() * size_of::<Entry>();
        // Bounds from a little below the step's room to well past it: the next job's claim
        // (its record, without giving anything up) and its ring's step are what the slack
        // has to hold.
        let (mut grew, mut held) = (false, false);
        for slack in (0..step + 1024).step_by(8) {
            let (mut shard, first) = filled(&keys);
            let capacity = shard.order.ring.capacity();
            let limits = Limits {
                max_bytes: shard.bytes() + slack,
                ..unbounded
            };
            let evicted = shard_job(&mut shard, &keys, first, limits);
            assert!(shard.bytes() <= limits.max_bytes, "slack {slack}");
            let now = shard.order.ring.capacity();
            if now > capacity {
                // Grown: by one step, and only because it fit: nothing was given up for it.
                assert_eq!(now, capacity + step / size_of::<Entry>(), "slack {slack}");
                assert_eq!(evicted, 0, "slack {slack}");
                grew = true;
            } else {
                // Held: room was made by giving up the oldest record instead.
                assert!(evicted > 0, "slack {slack}");
                held = true;
            }
        }
        assert!(
            grew && held,
            "both ways were taken: grew {grew}, held {held}"
        );
    }

    #[test]
    fn a_record_is_one_cache_line() {
        assert_eq!((size_of::<Record>(), align_of::<Record>()), (64, 64));
    }
}
