//! `MemoryStore` claim + complete (one idempotent job's store traffic) with 10 thousand, 1
//! million and 10 million records resident, each beside a bare `Mutex<HashMap>` holding as many;
//! and, before measuring, how long the store holds a shard while 100,000 records expire.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench memory_store -- --warm-up-time 1 --measurement-time 3
//! JOBGUARD_BENCH_SIZES=10000,1000000 cargo bench -p jobguard-suite --bench memory_store -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! For instruction counts, `JOBGUARD_BENCH_ONLY=memory:JOBS` (or `bare:JOBS`) fills one
//! contender to the first of the sizes, runs `JOBS` jobs on it and exits, without criterion:
//! under `valgrind --tool=callgrind`, (Ir at 40,000 jobs - Ir at 20,000) / 20,000 is one job's
//! instructions, the fill cancelling out.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench memory_store --no-run
//! JOBGUARD_BENCH_SIZES=10000 JOBGUARD_BENCH_ONLY=memory:20000 valgrind --tool=callgrind target/release/deps/memory_store-*
//! ```
//!
//! The contenders, one job per iteration, with fresh keys (`job-` and 16 hex digits of a counter,
//! written in place):
//!
//! - `MemoryStore` holding N records (`max_records(N)`, no byte bound in the way, `min_retention`
//!   zero, a 24 h TTL): `claim` the fresh key for a 30 s lease, then `complete` it with a 58-byte
//!   JSON record. The store is full, so every claim gives up the oldest completed record: the
//!   store's steady state at its bound, paying for one record's eviction per job.
//! - a bare `std::sync::Mutex<HashMap<String, Vec<u8>>>` holding N records: insert the token under
//!   the fresh key, then under the lock again replace it with the record, and remove the key
//!   written N jobs before, so it too holds N and frees one record per job.
//!
//! Everything runs on one current-thread tokio runtime; criterion's `to_async` enters it once
//! per sample and `iter_custom` times a plain loop of jobs. Each size is filled, measured and
//! dropped before the next, the store first. The bench prints the bytes per record the store
//! counts against its bound, and the growth of the process's resident memory over the fill.
//!
//! **Expiry.** Before the sizes, 100,000 records completed with a 20 ms TTL are left to expire;
//! then fresh claims (each released) are timed one by one until the store has dropped all of
//! them. A claim's time bounds how long it held its shard's lock. The check runs three times and
//! prints the longest claim of each, and the longest of the claims that dropped records.

use criterion::{Criterion, Throughput, criterion_group};
use jobguard::testing::{Claim, PlainClaim};
use jobguard::{MemoryStore, Store, StoreKey};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SCOPE: &str = "bench.charge";
/// A token shaped like `#[idempotent]`'s: 32 hex digits.
const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(24 * 3600);
/// What `#[idempotent]` stores for a small `Ok` value (as in `benches/redis_store.rs`).
const RECORD: &[u8] = br#"{"v":1,"ok":{"order_id":"order-123456","attempts_used":1}}"#;
const SIZES: [usize; 3] = [10_000, 1_000_000, 10_000_000];
const EXPIRING: usize = 100_000;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// `job-` and 16 hex digits of `n`.
fn write_key(n: u64, buf: &mut [u8; 20]) -> &str {
    buf[..4].copy_from_slice(b"job-");
    let mut n = n;
    for b in buf[4..].iter_mut().rev() {
        *b = b"0123456789abcdef"[(n & 15) as usize];
        n >>= 4;
    }
    std::str::from_utf8(buf).unwrap()
}

fn key(key: &str) -> StoreKey<'_> {
    StoreKey { scope: SCOPE, key }
}

/// One idempotent job's store traffic: claim a fresh key, then complete it.
async fn memory_job(store: &MemoryStore, k: &str, ttl: Duration) {
    let claim = store.claim_plain(key(k), TOKEN, None, LEASE).await;
    assert!(matches!(claim, Ok(Claim::Acquired)), "{claim:?}");
    store.complete(key(k), TOKEN, RECORD, ttl).await.unwrap();
}

/// A bare map holding `resident` records: each job adds one and removes the one added
/// `resident` jobs before.
struct Bare {
    map: Mutex<HashMap<String, Vec<u8>>>,
    resident: u64,
}

impl Bare {
    fn job(&self, n: u64) {
        let (mut fresh, mut old) = ([0; 20], [0; 20]);
        let k = write_key(n, &mut fresh);
        {
            let mut map = self.map.lock().unwrap();
            let prev = map.insert(k.to_owned(), TOKEN.as_bytes().to_vec());
            assert!(prev.is_none());
        }
        let mut map = self.map.lock().unwrap();
        *map.get_mut(k).unwrap() = RECORD.to_vec();
        if let Some(gone) = n.checked_sub(self.resident) {
            map.remove(write_key(gone, &mut old));
        }
    }
}

/// The process's resident memory, in bytes (Linux), else 0.
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A claim, a claim in progress, a completion and its replay: the store does what it claims.
async fn check(store: &MemoryStore) {
    let k = key("check-0");
    assert_eq!(
        store.claim_plain(k, TOKEN, None, LEASE).await,
        Ok(Claim::Acquired)
    );
    assert!(matches!(
        store.claim_plain(k, "another-token", None, LEASE).await,
        Ok(Claim::InProgress { .. })
    ));
    store.complete(k, TOKEN, RECORD, TTL).await.unwrap();
    assert_eq!(
        store.claim_plain(k, "another-token", None, LEASE).await,
        Ok(Claim::Completed(RECORD.to_vec()))
    );
}

/// 100,000 records expire; fresh claims are timed until the store has dropped them all.
///
/// A claim's time bounds how long it held its shard's lock, but on a shared machine the
/// longest of thousands of claims is whichever one the scheduler or the hypervisor interrupted.
/// So the claims are also grouped by how many expired records each dropped (the work it did
/// under the lock, which the store bounds): the group of the most work, timed hundreds of
/// times, gives the longest hold by its median and 99th percentile, which one interruption
/// cannot move.
async fn expiry_pauses() {
    for run in 1..=3 {
        let store = MemoryStore::new();
        let ttl = Duration::from_millis(20);
        let mut buf = [0; 20];
        let first = NEXT.fetch_add(EXPIRING as u64, Ordering::Relaxed);
        for n in first..first + EXPIRING as u64 {
            memory_job(&store, write_key(n, &mut buf), ttl).await;
        }
        std::thread::sleep(ttl);
        // The claims' times, by the number of expired records each dropped.
        let mut by_dropped: std::collections::BTreeMap<u64, Vec<Duration>> = Default::default();
        let mut times = Vec::new();
        let start = Instant::now();
        let mut expired = store.stats().expired;
        while expired < EXPIRING as u64 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let k = write_key(n, &mut buf);
            let t = Instant::now();
            let claim = store.claim_plain(key(k), TOKEN, None, LEASE).await;
            let took = t.elapsed();
            assert_eq!(claim, Ok(Claim::Acquired));
            let now_expired = store.stats().expired;
            by_dropped
                .entry(now_expired - expired)
                .or_default()
                .push(took);
            expired = now_expired;
            store.release(key(k), TOKEN).await.unwrap();
            times.push(took);
        }
        let claims = times.len();
        times.sort();
        let groups: Vec<String> = by_dropped
            .iter_mut()
            .map(|(dropped, times)| {
                times.sort();
                format!(
                    "{dropped} dropped: {} claims, median {:?}, 99th percentile {:?}, longest {:?}",
                    times.len(),
                    times[times.len() / 2],
                    times[times.len() * 99 / 100],
                    times[times.len() - 1],
                )
            })
            .collect();
        println!(
            "expiry run {run}: {EXPIRING} expired records dropped by {claims} claims in {:?}; \
             claim time median {:?}, 99.9th percentile {:?}, longest {:?}; by the records a \
             claim dropped: {}; {:?}",
            start.elapsed(),
            times[claims / 2],
            times[claims * 999 / 1000],
            times[claims - 1],
            groups.join("; "),
            store.stats(),
        );
    }
}

/// The two contenders in alternating batches of `BATCH` jobs, `ROUNDS` times: on a machine
/// whose load changes from one second to the next, each pair of batches runs under about the
/// same load, and the medians of the per-job times leave out the batches a neighbour preempted.
async fn interleaved(n: usize, store: &MemoryStore, bare: &Bare, next: &AtomicU64) {
    const BATCH: u64 = 20_000;
    const ROUNDS: usize = 31;
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut buf = [0; 20];
    for _ in 0..ROUNDS {
        let first = NEXT.fetch_add(BATCH, Ordering::Relaxed);
        let t = Instant::now();
        for k in first..first + BATCH {
            memory_job(store, write_key(k, &mut buf), TTL).await;
        }
        let a = t.elapsed() / BATCH as u32;
        let first = next.fetch_add(BATCH, Ordering::Relaxed);
        let t = Instant::now();
        for k in first..first + BATCH {
            bare.job(k);
        }
        let b = t.elapsed() / BATCH as u32;
        ours.push(a);
        theirs.push(b);
        ratios.push(a.as_secs_f64() / b.as_secs_f64());
    }
    ours.sort();
    theirs.sort();
    ratios.sort_by(f64::total_cmp);
    let mid = ROUNDS / 2;
    println!(
        "{n} resident, interleaved ({ROUNDS} rounds of {BATCH} jobs each): MemoryStore median \
         {:?}/job (fastest {:?}), Mutex<HashMap> median {:?}/job (fastest {:?}); ratio of \
         medians {:.2}, of fastest {:.2}, median of the rounds' ratios {:.2} (quartiles {:.2} - {:.2})",
        ours[mid],
        ours[0],
        theirs[mid],
        theirs[0],
        ours[mid].as_secs_f64() / theirs[mid].as_secs_f64(),
        ours[0].as_secs_f64() / theirs[0].as_secs_f64(),
        ratios[mid],
        ratios[ROUNDS / 4],
        ratios[3 * ROUNDS / 4],
    );
}

fn sizes() -> Vec<usize> {
    match std::env::var("JOBGUARD_BENCH_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|s| s.trim().parse().expect("JOBGUARD_BENCH_SIZES: numbers"))
            .collect(),
        Err(_) => SIZES.to_vec(),
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        check(&MemoryStore::new()).await;
        expiry_pauses().await;
    });

    let mut group = c.benchmark_group("memory_store");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    for n in sizes() {
        // The store, full at `n` records.
        let store = MemoryStore::builder()
            .max_records(n)
            .max_bytes(usize::MAX)
            .min_retention(Duration::ZERO)
            .build();
        let rss_before = rss();
        let fill = Instant::now();
        rt.block_on(async {
            check(&store).await;
            let mut buf = [0; 20];
            let first = NEXT.fetch_add(n as u64, Ordering::Relaxed);
            for k in first..first + n as u64 {
                memory_job(&store, write_key(k, &mut buf), TTL).await;
            }
        });
        let stats = store.stats();
        println!(
            "{n} resident: filled in {:?}; {} records, {} bytes counted ({} per record), \
             resident memory +{} bytes ({} per record); {:?}",
            fill.elapsed(),
            stats.records,
            stats.bytes,
            stats.bytes / stats.records,
            rss().saturating_sub(rss_before),
            rss().saturating_sub(rss_before) / stats.records,
            stats,
        );
        // The bare map, holding `n` records too.
        let bare = Bare {
            map: Mutex::new(HashMap::new()),
            resident: n as u64,
        };
        for k in 0..n as u64 {
            bare.job(k);
        }
        let next = AtomicU64::new(n as u64);
        rt.block_on(interleaved(n, &store, &bare, &next));

        let s = &store;
        group.bench_function(format!("{n} resident: MemoryStore claim + complete"), |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let first = NEXT.fetch_add(iters, Ordering::Relaxed);
                let mut buf = [0; 20];
                let start = Instant::now();
                for k in first..first + iters {
                    memory_job(s, write_key(k, &mut buf), TTL).await;
                }
                start.elapsed()
            })
        });
        let stats = store.stats();
        assert!(stats.evicted > 0 && stats.records <= n, "{stats:?}");
        println!("{n} resident, after: {stats:?}");
        drop(store);

        let (bare, next) = (&bare, &next);
        group.bench_function(
            format!("{n} resident: Mutex<HashMap> insert + get_mut + remove"),
            |b| {
                b.to_async(&rt).iter_custom(|iters| async move {
                    let first = next.fetch_add(iters, Ordering::Relaxed);
                    let start = Instant::now();
                    for k in first..first + iters {
                        bare.job(k);
                    }
                    start.elapsed()
                })
            },
        );
        assert_eq!(bare.map.lock().unwrap().len(), n);
    }
    group.finish();
}

criterion_group!(benches, bench);

/// `JOBGUARD_BENCH_ONLY=memory:JOBS` or `bare:JOBS`: one contender, filled to the first size,
/// runs `JOBS` jobs; nothing else (see the module docs).
fn only(mode: &str) {
    let (which, jobs) = mode
        .split_once(':')
        .expect("JOBGUARD_BENCH_ONLY: memory:JOBS or bare:JOBS");
    let jobs: u64 = jobs.parse().expect("JOBGUARD_BENCH_ONLY: a number of jobs");
    let n = sizes()[0];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match which {
        "memory" => {
            let store = MemoryStore::builder()
                .max_records(n)
                .max_bytes(usize::MAX)
                .min_retention(Duration::ZERO)
                .build();
            rt.block_on(async {
                check(&store).await;
                let mut buf = [0; 20];
                for k in 0..n as u64 + jobs {
                    memory_job(&store, write_key(k, &mut buf), TTL).await;
                }
            });
            println!("{n} resident, {jobs} jobs: {:?}", store.stats());
        }
        "bare" => {
            let bare = Bare {
                map: Mutex::new(HashMap::new()),
                resident: n as u64,
            };
            for k in 0..n as u64 + jobs {
                bare.job(k);
            }
            println!(
                "{n} resident, {jobs} jobs: {}",
                bare.map.lock().unwrap().len()
            );
        }
        other => panic!("JOBGUARD_BENCH_ONLY: memory or bare, not {other}"),
    }
}

fn main() {
    if let Ok(mode) = std::env::var("JOBGUARD_BENCH_ONLY") {
        return only(&mode);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
