//! `MemoryStore` claim+complete (one idempotent job's store traffic) beside a bare
//! `Mutex<HashMap>` insert-and-get, and the replay of a completed key, in one run.
//!
//! ```text
//! cargo bench --bench memory_store -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The contenders, one job (or one replay) per iteration:
//!
//! - `MemoryStore` (default capacity, 16 shards): `claim` a fresh key for a 30 s lease, then
//!   `complete` it with a small JSON record; the replay is a `claim` of a completed key, which
//!   answers `Claim::Completed(record)`.
//! - a bare `std::sync::Mutex<HashMap<String, Vec<u8>>>`: insert the token under the fresh key,
//!   then, under the lock again, get it and replace it with the record; the replay is a get that
//!   clones the record. This is the line the 2× target is judged against.
//! - the same bare map split into 16 `Mutex<HashMap>` shards picked by a `RandomState` hash of
//!   the key, as `MemoryStore` does: the bare map's cost plus sharding's, for a fair look.
//! - the harness alone: making the fresh key, nothing stored.
//!
//! **Steady state.** Keys are fresh per iteration (a counter, written in place, no `format!`).
//! `MemoryStore` is bounded: at capacity (100,000 records, 6,250 a shard) a claim first evicts the
//! shard's expired records, and a claim it still has no room for fails with `Error::Store`. With
//! a TTL of minutes, the store would be full within a tenth of a second and every claim after it
//! would measure a scan of the shard and a refusal. So the jobs here complete with a 1 ms TTL:
//! at the rates measured here (about a million jobs a second) about a thousand records are live
//! at once, far under the capacity, and each shard fills to its bound with expired records, then
//! evicts them all in one sweep: the store's own steady state, paying for every record's
//! eviction (the check prints the live count). The bare maps are bounded alike: a map (or
//! shard) at the same bound is cleared before the next insert, so both sides hold about as many
//! records and free each one once. The replay keys (1,024, completed before measuring with a
//! one-hour TTL) live in separate stores and maps.
//!
//! **Harness.** Everything runs on one current-thread tokio runtime. `Store`'s methods return
//! boxed futures, so the store is awaited as a job would await it; criterion's `to_async` enters
//! the runtime once per sample (`iter_custom` times a plain loop of jobs inside it), not once per
//! job, so no `block_on` is measured. The clock is not paused (a paused tokio clock would put a
//! mutex behind every `Instant::now()` the store reads).
//!
//! Before measuring, each contender is checked: a claim of a free key is acquired, a second one
//! finds it in progress, and after the completion a claim replays the record (for the bare maps:
//! the job leaves the record under the key, and the replay returns it); 3× capacity fresh jobs
//! all succeed (never refused for room) and leave at most the capacity kept. The check also
//! prints how long `MemoryStore`'s sweeps hold up the claim that triggers one, which the mean
//! per job amortizes away.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jobguard::store::memory::DEFAULT_CAPACITY;
use jobguard::{Claim, MemoryStore, Store, StoreKey};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SCOPE: &str = "bench.charge";
/// A token shaped like `#[idempotent]`'s: 32 hex digits.
const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const LEASE: Duration = Duration::from_secs(30);
/// Short, so the fresh keys expire and the bounded store sweeps them: see the module doc.
const TTL: Duration = Duration::from_millis(1);
/// Long, so the replayed keys stay completed for the whole run.
const REPLAY_TTL: Duration = Duration::from_secs(3600);
/// What `#[idempotent]` stores for a small `Ok` value (as in `benches/redis_store.rs`).
const RECORD: &[u8] = br#"{"v":1,"ok":{"order_id":"order-123456","attempts_used":1}}"#;
/// `MemoryStore`'s shard count (private to the runtime; its doc says 16).
const SHARDS: usize = 16;
const REPLAY_KEYS: usize = 1024;
/// A job slower than this in the check is counted as a sweep's pause.
const SLOW: Duration = Duration::from_micros(50);

static NEXT: AtomicU64 = AtomicU64::new(0);

/// `job-` and 16 hex digits of a counter, written in place: a fresh key without `format!`.
struct FreshKeys {
    next: u64,
    buf: [u8; 20],
}

impl FreshKeys {
    /// `count` keys no one has used yet.
    fn take(count: u64) -> Self {
        let mut buf = [b'0'; 20];
        buf[..4].copy_from_slice(b"job-");
        FreshKeys {
            next: NEXT.fetch_add(count, Ordering::Relaxed),
            buf,
        }
    }

    fn next(&mut self) -> &str {
        let mut n = self.next;
        self.next += 1;
        for b in self.buf[4..].iter_mut().rev() {
            *b = b"0123456789abcdef"[(n & 15) as usize];
            n >>= 4;
        }
        std::str::from_utf8(&self.buf).unwrap()
    }
}

fn key(key: &str) -> StoreKey<'_> {
    StoreKey { scope: SCOPE, key }
}

/// One idempotent job's store traffic: claim a fresh key, then complete it.
async fn memory_job(store: &MemoryStore, k: &str, ttl: Duration) {
    let claim = store.claim(key(k), TOKEN, None, LEASE).await;
    assert!(matches!(claim, Ok(Claim::Acquired)), "{claim:?}");
    store.complete(key(k), TOKEN, RECORD, ttl).await.unwrap();
}

/// A redelivery of a completed job: its claim replays the record.
async fn memory_replay(store: &MemoryStore, k: &str) -> Vec<u8> {
    match store.claim(key(k), TOKEN, None, LEASE).await {
        Ok(Claim::Completed(record)) => record,
        other => panic!("{other:?}"),
    }
}

type Map = HashMap<String, Vec<u8>>;

/// `shards` bare `Mutex<HashMap>`s, each cleared when it reaches its share of `capacity`.
struct Bare {
    shards: Box<[Mutex<Map>]>,
    per_shard: usize,
    hasher: RandomState,
}

impl Bare {
    fn new(shards: usize, capacity: usize) -> Self {
        Bare {
            shards: (0..shards).map(|_| Mutex::new(Map::new())).collect(),
            per_shard: capacity.div_ceil(shards),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Map> {
        if self.shards.len() == 1 {
            return &self.shards[0];
        }
        let i = self.hasher.hash_one(key) as usize % self.shards.len();
        &self.shards[i]
    }

    /// Insert a claim for a fresh key, then get it and replace it with the record.
    fn job(&self, key: &str) {
        let shard = self.shard(key);
        {
            let mut map = shard.lock().unwrap();
            if map.len() >= self.per_shard {
                map.clear();
            }
            let prev = map.insert(key.to_owned(), TOKEN.as_bytes().to_vec());
            assert!(prev.is_none());
        }
        let mut map = shard.lock().unwrap();
        *map.get_mut(key).unwrap() = RECORD.to_vec();
    }

    fn replay(&self, key: &str) -> Vec<u8> {
        self.shard(key).lock().unwrap().get(key).unwrap().clone()
    }

    fn complete_forever(&self, key: &str) {
        let mut map = self.shard(key).lock().unwrap();
        map.insert(key.to_owned(), RECORD.to_vec());
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

/// Each contender does what its name claims, and stays bounded at steady state.
async fn check(fresh: &MemoryStore, replays: &MemoryStore, bare: &[(&str, &Bare, &Bare)]) {
    let k = key("check-0");
    assert_eq!(
        replays.claim(k, TOKEN, None, LEASE).await,
        Ok(Claim::Acquired)
    );
    assert!(matches!(
        replays.claim(k, "another-token", None, LEASE).await,
        Ok(Claim::InProgress { .. })
    ));
    replays
        .complete(k, TOKEN, RECORD, REPLAY_TTL)
        .await
        .unwrap();
    assert_eq!(memory_replay(replays, "check-0").await, RECORD);

    let jobs = 3 * DEFAULT_CAPACITY as u64;
    let mut keys = FreshKeys::take(jobs);
    // The last two thirds are the steady state: time each job to see the sweeps' pauses.
    let (start, mut slow) = (Instant::now(), Vec::new());
    for i in 0..jobs {
        let t = Instant::now();
        memory_job(fresh, keys.next(), TTL).await;
        let took = t.elapsed();
        if i >= jobs / 3 && took > SLOW {
            slow.push(took);
        }
    }
    let per_job = start.elapsed() / jobs as u32;
    assert!(fresh.len() <= fresh.capacity(), "{}", fresh.len());
    slow.sort();
    println!(
        "check: MemoryStore ran {jobs} fresh jobs ({per_job:?} each), none refused; {} records kept \
         (capacity {}); ~{} live at a time ({TTL:?} TTL); of the last {}, {} took over {SLOW:?} \
         (median {:?}, slowest {:?}): the sweeps",
        fresh.len(),
        fresh.capacity(),
        TTL.as_nanos() / per_job.as_nanos().max(1),
        jobs - jobs / 3,
        slow.len(),
        slow.get(slow.len() / 2).copied().unwrap_or_default(),
        slow.last().copied().unwrap_or_default(),
    );

    for (name, fresh, replays) in bare {
        fresh.job("check-0");
        assert_eq!(fresh.replay("check-0"), RECORD, "{name}");
        replays.complete_forever("check-0");
        assert_eq!(replays.replay("check-0"), RECORD, "{name}");
        let mut keys = FreshKeys::take(jobs);
        for _ in 0..jobs {
            fresh.job(keys.next());
        }
        assert!(fresh.len() <= DEFAULT_CAPACITY, "{name}: {}", fresh.len());
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let fresh = MemoryStore::new();
    let replays = MemoryStore::new();
    assert_eq!(fresh.capacity(), DEFAULT_CAPACITY);
    let bare = Bare::new(1, DEFAULT_CAPACITY);
    let bare_replays = Bare::new(1, DEFAULT_CAPACITY);
    let sharded = Bare::new(SHARDS, DEFAULT_CAPACITY);
    let sharded_replays = Bare::new(SHARDS, DEFAULT_CAPACITY);
    let replay_keys: Vec<String> = (0..REPLAY_KEYS).map(|i| format!("order-{i}")).collect();
    rt.block_on(async {
        check(
            &fresh,
            &replays,
            &[
                ("Mutex<HashMap>", &bare, &bare_replays),
                ("16 × Mutex<HashMap>", &sharded, &sharded_replays),
            ],
        )
        .await;
        for k in &replay_keys {
            memory_job(&replays, k, REPLAY_TTL).await;
            bare_replays.complete_forever(k);
            sharded_replays.complete_forever(k);
        }
    });

    let (fresh, replays) = (&fresh, &replays);
    let mut group = c.benchmark_group("memory_store");
    group.throughput(Throughput::Elements(1));

    group.bench_function("fresh key: MemoryStore claim + complete", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut keys = FreshKeys::take(iters);
            let start = Instant::now();
            for _ in 0..iters {
                memory_job(fresh, keys.next(), TTL).await;
            }
            start.elapsed()
        })
    });
    for (name, map) in [
        ("fresh key: Mutex<HashMap> insert + get_mut", &bare),
        ("fresh key: 16 × Mutex<HashMap> insert + get_mut", &sharded),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let mut keys = FreshKeys::take(iters);
                let start = Instant::now();
                for _ in 0..iters {
                    map.job(keys.next());
                }
                start.elapsed()
            })
        });
    }
    group.bench_function("fresh key: harness only (make the key)", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut keys = FreshKeys::take(iters);
            let start = Instant::now();
            for _ in 0..iters {
                black_box(keys.next());
            }
            start.elapsed()
        })
    });

    let replay_key = |i: u64| replay_keys[i as usize % REPLAY_KEYS].as_str();
    group.bench_function("replay: MemoryStore claim → Completed", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let start = Instant::now();
            for i in 0..iters {
                black_box(memory_replay(replays, replay_key(i)).await);
            }
            start.elapsed()
        })
    });
    for (name, map) in [
        ("replay: Mutex<HashMap> get + clone", &bare_replays),
        ("replay: 16 × Mutex<HashMap> get + clone", &sharded_replays),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let start = Instant::now();
                for i in 0..iters {
                    black_box(map.replay(replay_key(i)));
                }
                start.elapsed()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
