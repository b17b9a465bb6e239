//! 10,000,000 distinct `#[idempotent]` jobs at full speed on a `MemoryStore` with the default
//! bound (256 MiB), in a release build: none fails, resident memory stays within the bound plus
//! the overhead stated below, and the store gives up old records to stay there. A
//! `harness = false` bench, so that it runs in its own process and its memory figures are its
//! own:
//!
//! ```text
//! cargo bench -p jobguard-suite --bench memory_store_run
//! JOBGUARD_RUN_JOBS=1000000 JOBGUARD_RUN_MIN_RETENTION_MS=1000 cargo bench -p jobguard-suite --bench memory_store_run
//! ```
//!
//! The jobs run one after another on a current-thread runtime, through the attribute as a
//! service would call them, with a runtime whose store is `MemoryStore::builder()
//! .min_retention(..)` (1 s unless `JOBGUARD_RUN_MIN_RETENTION_MS` says otherwise: the default
//! hour would keep every record of a run this fast, and the store would rightly refuse new
//! claims once full). Every 1,000th job is redelivered right away and every 1,000th job is
//! redelivered again 10,000 jobs later, well within the floor: each must replay.
//!
//! The overhead allowed over the bound is what the process holds without the store (its
//! resident memory before the first job) plus 64 MiB: memory the allocator keeps after the
//! store freed it, and the store's tables growing by doubling.

use jobguard::{Error, MemoryStore, Runtime};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static RAN: AtomicU64 = AtomicU64::new(0);

#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
struct Receipt {
    order_id: u64,
    amount: u64,
}

#[jobguard::idempotent(key = order_id, scope = "bench.charge")]
async fn charge(order_id: u64) -> Result<Receipt, Error> {
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(Receipt {
        order_id,
        amount: 100,
    })
}

/// The process's resident memory now and at its peak, in bytes (Linux), else 0.
fn rss() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const MIB: usize = 1 << 20;

fn main() {
    // `cargo bench` passes `--bench`; a test run (`cargo test --benches`) does not: skip there.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "memory_store_run: run it with `cargo bench -p jobguard-suite --bench memory_store_run`"
        );
        return;
    }
    let jobs = env("JOBGUARD_RUN_JOBS", 10_000_000);
    let floor = Duration::from_millis(env("JOBGUARD_RUN_MIN_RETENTION_MS", 1_000));
    let store = MemoryStore::builder().min_retention(floor).build();
    let runtime = Runtime::builder().store(store.clone()).build();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (base, _) = rss();
    let start = Instant::now();
    let (mut failures, mut replays, mut not_replayed) = (0u64, 0u64, 0u64);
    let mut peak_store = 0;
    rt.block_on(runtime.scope(async {
        for id in 0..jobs {
            match charge(id).await {
                Ok(r) if r.order_id == id => {}
                other => {
                    failures += 1;
                    if failures <= 5 {
                        eprintln!("job {id}: {other:?}");
                    }
                }
            }
            let redeliver = [Some(id), id.checked_sub(10_000)];
            for old in redeliver.into_iter().flatten().filter(|n| n % 1_000 == 0) {
                let before = RAN.load(Ordering::Relaxed);
                let replayed = charge(old).await;
                replays += 1;
                if RAN.load(Ordering::Relaxed) != before || replayed.is_err() {
                    not_replayed += 1;
                }
            }
            if id % 1_000_000 == 999_999 {
                let stats = store.stats();
                peak_store = peak_store.max(stats.bytes);
                println!(
                    "{:>9} jobs, {:?}: {stats:?}, resident {} MiB",
                    id + 1,
                    start.elapsed(),
                    rss().0 / MIB
                );
            }
        }
    }));
    let elapsed = start.elapsed();
    let stats = store.stats();
    let (now, peak) = rss();
    let allowed = stats.max_bytes + base + 64 * MIB;
    println!(
        "{jobs} jobs in {elapsed:?} ({:.0} jobs/s), failures {failures}, redeliveries {replays} \
         (not replayed: {not_replayed}); store: {} records, {} bytes counted (peak seen {}), \
         bound {}, evicted {}, expired {}; resident memory: before {} MiB, now {} MiB, peak {} \
         MiB, allowed {} MiB (bound + before + 64 MiB)",
        jobs as f64 / elapsed.as_secs_f64(),
        stats.records,
        stats.bytes,
        peak_store,
        stats.max_bytes,
        stats.evicted,
        stats.expired,
        base / MIB,
        now / MIB,
        peak / MIB,
        allowed / MIB,
    );
    assert_eq!(failures, 0, "every job succeeds");
    assert_eq!(not_replayed, 0, "every redelivery within the floor replays");
    assert_eq!(RAN.load(Ordering::Relaxed), jobs, "no job ran twice");
    assert!(
        peak <= allowed,
        "peak resident memory {peak} over {allowed}"
    );
}
