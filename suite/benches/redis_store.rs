//! `RedisStore` claim+complete (one idempotent job's two round trips) with 1 and with 64
//! concurrent tasks, beside `redis-benchmark` at the same concurrency against the same private
//! `redis-server`, in one run.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench redis_store
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

#[path = "support/redis_job.rs"]
mod redis_job;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jobguard::store::redis::RedisStore;
use jobguard_testkit::redis::RedisServer;
use redis_job::{NEXT, flush, job, median};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const CONCURRENCY: [usize; 2] = [1, 64];
/// Jobs per latency sample and per `redis-benchmark` run.
const SAMPLE_JOBS: usize = 20_000;
/// Interleaved rounds of every contender.
const ROUNDS: usize = 5;

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

    // Interleaved rounds: this machine's speed drifts (shared cores), so each round measures
    // every contender back to back, and the ratios are taken per round, then the median.
    println!(
        "\n{ROUNDS} interleaved rounds of {SAMPLE_JOBS} jobs/requests each; rate = median round"
    );
    println!(
        "{:<44} {:>10} {:>9} {:>9}",
        "", "rate/s", "p50 ms", "p99 ms"
    );
    let peers: [(&str, &[&str]); 2] = [
        ("redis-benchmark -t set", &["-t", "set"]),
        (
            "redis-benchmark SET NX PX",
            &["SET", "key:__rand_int__", "v", "NX", "PX", "30000"],
        ),
    ];
    for tasks in CONCURRENCY {
        let mut ours = Vec::new();
        let mut lat = Vec::new();
        let mut floor = Vec::new();
        let mut theirs: [Vec<(f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..ROUNDS {
            flush(&rt, &store);
            let (wall, l) = rt.block_on(run(&store, tasks, SAMPLE_JOBS as u64, true));
            ours.push(SAMPLE_JOBS as f64 / wall.as_secs_f64());
            lat.extend(l);
            flush(&rt, &store);
            let wall = rt.block_on(set_nx_px(&store, tasks, SAMPLE_JOBS as u64));
            floor.push(SAMPLE_JOBS as f64 / wall.as_secs_f64());
            for (i, (name, command)) in peers.iter().enumerate() {
                flush(&rt, &store);
                match redis_benchmark(server.port(), tasks, command) {
                    Some(r) => theirs[i].push(r),
                    None => eprintln!("{name}: redis-benchmark not found or unreadable"),
                }
            }
        }
        lat.sort();
        let row = |what: String, rate: f64, p50: f64, p99: f64| {
            println!("{what:<44} {rate:>10.0} {p50:>9.3} {p99:>9.3}");
        };
        row(
            format!("RedisStore claim+complete, {tasks} task(s)"),
            median(&ours),
            percentile(&lat, 0.50),
            percentile(&lat, 0.99),
        );
        row(
            format!("redis-rs SET NX PX, {tasks} task(s)"),
            median(&floor),
            f64::NAN,
            f64::NAN,
        );
        for (i, (name, _)) in peers.iter().enumerate() {
            let runs = &theirs[i];
            if runs.len() != ROUNDS {
                continue;
            }
            let pick =
                |f: fn(&(f64, f64, f64)) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
            row(
                format!("{name} -c {tasks}"),
                pick(|r| r.0),
                pick(|r| r.1),
                pick(|r| r.2),
            );
        }
        for (i, (name, _)) in peers.iter().enumerate() {
            if theirs[i].len() != ROUNDS {
                continue;
            }
            let ratios: Vec<f64> = ours
                .iter()
                .zip(&theirs[i])
                .map(|(o, t)| 100.0 * o / t.0)
                .collect();
            println!(
                "  concurrency {tasks}: RedisStore jobs/s = {:.0}% of {name} requests/s (rounds: {})",
                median(&ratios),
                ratios
                    .iter()
                    .map(|r| format!("{r:.0}%"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
}

/// The client's own floor: one plain `SET NX PX` per job on the same connection manager.
async fn set_nx_px(store: &RedisStore, tasks: usize, jobs: u64) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks as u64)
        .map(|t| {
            let mut conn = store.connection();
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

criterion_group!(benches, bench);
criterion_main!(benches);
