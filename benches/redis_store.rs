//! `RedisStore` claim+complete (one idempotent job's two round trips) with 1 and with 64
//! concurrent tasks, beside `redis-benchmark` at the same concurrency against the same private
//! `redis-server`, in one run.
//!
//! ```text
//! cargo bench --bench redis_store
//! ```
//!
//! Criterion measures the throughput; a second, sampled pass records each job's latency for p50
//! and p99. The peers are `redis-benchmark -t set` (a plain `SET`) and
//! `redis-benchmark SET key:__rand_int__ v NX PX 30000` (closer to a claim: one conditional
//! write with an expiry), each with `-c 1` and `-c 64`, parsed from `--csv`, and a plain
//! `SET NX PX` through the same redis-rs connection manager (the client's own floor for one round
//! trip). A summary table with the ratios is printed at the end.
//!
//! `JOBGUARD_BENCH_THREADS=N` sets the tokio worker threads (default 2; `0` is a current-thread
//! runtime); `JOBGUARD_BENCH_QUICK=1` skips the criterion pass and prints only the table.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jobguard::store::redis::RedisStore;
use jobguard::{Claim, Store, StoreKey};
use jobguard_workspace::redis::RedisServer;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(30);
/// Short, so the keys the benchmark writes do not pile up in memory.
const TTL: Duration = Duration::from_secs(30);
/// What `#[idempotent]` stores for a small `Ok` value.
const RECORD: &[u8] = br#"{"v":1,"ok":{"order_id":"order-123456","attempts_used":1}}"#;
const CONCURRENCY: [usize; 2] = [1, 64];
/// Jobs per latency sample and per `redis-benchmark` run.
const SAMPLE_JOBS: usize = 60_000;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// One idempotent job's store traffic: claim a fresh key, then complete it.
async fn job(store: &RedisStore) {
    let key = format!("job-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let key = StoreKey {
        scope: "bench.charge",
        key: &key,
    };
    let claim = store
        .claim(key, "token-0123456789abcdef", None, LEASE)
        .await;
    assert_eq!(claim, Ok(Claim::Acquired));
    store
        .complete(key, "token-0123456789abcdef", RECORD, TTL)
        .await
        .unwrap();
}

/// Runs `jobs` jobs from `tasks` concurrent tasks; returns the wall time and, when `sample`,
/// every job's latency.
async fn run(
    store: &RedisStore,
    tasks: usize,
    jobs: u64,
    sample: bool,
) -> (Duration, Vec<Duration>) {
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks as u64)
        .map(|t| {
            let store = store.clone();
            let mine = jobs / tasks as u64 + u64::from(t < jobs % tasks as u64);
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(if sample { mine as usize } else { 0 });
                for _ in 0..mine {
                    let t0 = Instant::now();
                    job(&store).await;
                    if sample {
                        lat.push(t0.elapsed());
                    }
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await.unwrap());
    }
    (start.elapsed(), lat)
}

struct Row {
    what: String,
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// `redis-benchmark ... --csv` → rate, p50 and p99 (ms) of its one test.
fn redis_benchmark(port: u16, clients: usize, command: &[&str]) -> Option<(f64, f64, f64)> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &SAMPLE_JOBS.to_string()])
        .args(["-r", "100000000", "--csv"])
        .args(command)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let line = text
        .lines()
        .find(|l| !l.starts_with("\"test\"") && l.contains(','))?;
    let cols: Vec<f64> = line
        .rsplitn(8, ',')
        .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    // cols: [test (NaN), rps, avg, min, p50, p95, p99, max]
    Some((cols[1], cols[4], cols[6]))
}

fn bench(c: &mut Criterion) {
    let Some(server) = RedisServer::start() else {
        eprintln!("redis_store bench skipped: no redis-server");
        return;
    };
    let threads: usize = std::env::var("JOBGUARD_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let rt = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap()
    };
    let store = rt.block_on(RedisStore::connect(&server.url())).unwrap();
    // Load the scripts once, outside the measurement.
    rt.block_on(job(&store));

    let quick = std::env::var_os("JOBGUARD_BENCH_QUICK").is_some();
    let mut group = c.benchmark_group("redis_store");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(8));
    for tasks in CONCURRENCY.into_iter().filter(|_| !quick) {
        group.bench_function(format!("claim+complete/tasks={tasks}"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let store = store.clone();
                async move { run(&store, tasks, iters, false).await.0 }
            })
        });
    }
    group.finish();

    let mut rows = Vec::new();
    for tasks in CONCURRENCY {
        flush(&rt, &store);
        let wall = rt.block_on(set_nx_px(&store, tasks, SAMPLE_JOBS as u64));
        rows.push(Row {
            what: format!("redis-rs SET NX PX, {tasks} task(s), requests/s"),
            rate: SAMPLE_JOBS as f64 / wall.as_secs_f64(),
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
        });
        flush(&rt, &store);
        let (wall, mut lat) = rt.block_on(run(&store, tasks, SAMPLE_JOBS as u64, true));
        lat.sort();
        rows.push(Row {
            what: format!("RedisStore claim+complete, {tasks} task(s), jobs/s"),
            rate: SAMPLE_JOBS as f64 / wall.as_secs_f64(),
            p50_ms: percentile(&lat, 0.50),
            p99_ms: percentile(&lat, 0.99),
        });
        for (name, command) in [
            ("redis-benchmark -t set", &["-t", "set"][..]),
            (
                "redis-benchmark SET NX PX",
                &["SET", "key:__rand_int__", "v", "NX", "PX", "30000"][..],
            ),
        ] {
            flush(&rt, &store);
            match redis_benchmark(server.port(), tasks, command) {
                Some((rate, p50_ms, p99_ms)) => rows.push(Row {
                    what: format!("{name} -c {tasks}, requests/s"),
                    rate,
                    p50_ms,
                    p99_ms,
                }),
                None => eprintln!("{name}: redis-benchmark not found or unreadable"),
            }
        }
    }
    println!(
        "\n{:<52} {:>10} {:>9} {:>9}",
        "", "rate", "p50 ms", "p99 ms"
    );
    for r in &rows {
        println!(
            "{:<52} {:>10.0} {:>9.3} {:>9.3}",
            r.what, r.rate, r.p50_ms, r.p99_ms
        );
    }
    for tasks in CONCURRENCY {
        let ours = rows.iter().find(|r| {
            r.what
                .starts_with(&format!("RedisStore claim+complete, {tasks} "))
        });
        for peer in ["redis-benchmark -t set", "redis-benchmark SET NX PX"] {
            let theirs = rows
                .iter()
                .find(|r| r.what.starts_with(&format!("{peer} -c {tasks},")));
            if let (Some(o), Some(t)) = (ours, theirs) {
                println!(
                    "concurrency {tasks}: RedisStore jobs/s = {:.0}% of {peer} requests/s",
                    100.0 * o.rate / t.rate
                );
            }
        }
    }
}

/// The client's own floor: one plain `SET NX PX` per job on the same connection manager.
async fn set_nx_px(store: &RedisStore, tasks: usize, jobs: u64) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks as u64)
        .map(|t| {
            let mut conn = store.manager();
            let mine = jobs / tasks as u64 + u64::from(t < jobs % tasks as u64);
            tokio::spawn(async move {
                for _ in 0..mine {
                    let key = format!("set-{}", NEXT.fetch_add(1, Ordering::Relaxed));
                    let _: redis::Value = redis::cmd("SET")
                        .arg(key)
                        .arg("v")
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    start.elapsed()
}

fn flush(rt: &tokio::runtime::Runtime, store: &RedisStore) {
    rt.block_on(async {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut store.manager())
            .await
            .unwrap();
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
