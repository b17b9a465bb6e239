//! `RedisStore` claim+complete (one idempotent job's two round trips) at 64 concurrent tasks on
//! a 3-master Redis Cluster, beside the same on one `redis-server`, and beside
//! `redis-benchmark --cluster` and `redis-benchmark` at the same concurrency, in one run on one
//! machine.
//!
//! ```text
//! JOBGUARD_BENCH_QUICK=1 cargo bench -p jobguard-suite --bench redis_cluster
//! ```
//!
//! The cluster is the test kit's (`jobguard_testkit::cluster`): 3 masters and 3 replicas on free
//! loopback ports; the single node is a private `redis-server`. Rounds are interleaved (each
//! round measures every contender back to back) and the ratios are taken per round, then the
//! median, as this machine's speed drifts. The peers run `SET key:__rand_int__ v` (`-t set`),
//! parsed from `--csv`; `redis-benchmark --cluster` spreads its 64 clients over the masters.
//!
//! `JOBGUARD_BENCH_THREADS=N` sets the tokio worker threads (default 2); `JOBGUARD_BENCH_QUICK=1`
//! skips the criterion pass and prints only the table.

use jobguard_testkit::cluster;

#[path = "support/redis_job.rs"]
mod redis_job;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jobguard::store::redis::RedisStore;
use jobguard_testkit::redis::RedisServer;
use redis_job::{flush, job, median};
use std::process::Command;
use std::time::{Duration, Instant};

const TASKS: usize = 64;
/// Jobs per round of our contenders and requests per `redis-benchmark` run.
const JOBS: usize = 20_000;
/// Interleaved rounds of every contender.
const ROUNDS: usize = 5;

/// Runs `jobs` jobs from `TASKS` concurrent tasks; returns the wall time.
async fn run(store: &RedisStore, jobs: u64) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..TASKS as u64)
        .map(|t| {
            let store = store.clone();
            let mine = jobs / TASKS as u64 + u64::from(t < jobs % TASKS as u64);
            tokio::spawn(async move {
                for _ in 0..mine {
                    job(&store).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    start.elapsed()
}

/// `redis-benchmark [--cluster] -t set -c 64 --csv` against the node on `port` → requests/s.
fn redis_benchmark(port: u16, cluster: bool) -> Option<f64> {
    let mut cmd = Command::new("redis-benchmark");
    if cluster {
        cmd.arg("--cluster");
    }
    let out = cmd
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &TASKS.to_string(), "-n", &JOBS.to_string()])
        .args(["-r", "100000000", "--csv", "-t", "set"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms",...; the cluster mode prints the masters before it.
    let line = text.lines().find(|l| l.starts_with("\"SET\""))?;
    line.split(',').nth(1)?.trim_matches('"').parse().ok()
}

fn bench(c: &mut Criterion) {
    let (Some(server), Some(cluster)) = (RedisServer::start(), cluster::RedisCluster::start())
    else {
        eprintln!("redis_cluster bench skipped: no redis-server or redis-cli");
        return;
    };
    let threads: usize = std::env::var("JOBGUARD_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .unwrap();
    let single = rt.block_on(RedisStore::connect(&server.url())).unwrap();
    let clustered = rt
        .block_on(RedisStore::connect_cluster(cluster.urls()))
        .unwrap();
    // Load the scripts (on every master) once, outside the measurement.
    rt.block_on(run(&single, 256));
    rt.block_on(run(&clustered, 256));

    let quick = std::env::var_os("JOBGUARD_BENCH_QUICK").is_some();
    let mut group = c.benchmark_group("redis_cluster");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(8));
    for (name, store) in [("single", &single), ("cluster", &clustered)] {
        if quick {
            break;
        }
        group.bench_function(format!("claim+complete/{name}/tasks={TASKS}"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let store = store.clone();
                async move { run(&store, iters).await }
            })
        });
    }
    group.finish();

    let seed = cluster.masters()[0].port;
    let mut rates: [Vec<f64>; 4] = Default::default();
    for _ in 0..ROUNDS {
        flush(&rt, &clustered);
        rates[0].push(JOBS as f64 / rt.block_on(run(&clustered, JOBS as u64)).as_secs_f64());
        flush(&rt, &single);
        rates[1].push(JOBS as f64 / rt.block_on(run(&single, JOBS as u64)).as_secs_f64());
        flush(&rt, &clustered);
        rates[2].push(redis_benchmark(seed, true).unwrap_or(f64::NAN));
        flush(&rt, &single);
        rates[3].push(redis_benchmark(server.port(), false).unwrap_or(f64::NAN));
    }
    println!(
        "\n{ROUNDS} interleaved rounds of {JOBS} jobs/requests at {TASKS} tasks/clients; rate = median round"
    );
    let names = [
        "RedisStore claim+complete, cluster (jobs/s)",
        "RedisStore claim+complete, single (jobs/s)",
        "redis-benchmark --cluster -t set (req/s)",
        "redis-benchmark -t set (req/s)",
    ];
    for (name, r) in names.iter().zip(&rates) {
        println!("{name:<46} {:>10.0}", median(r));
    }
    let ratio = |a: usize, b: usize| {
        let per_round: Vec<f64> = rates[a]
            .iter()
            .zip(&rates[b])
            .map(|(x, y)| 100.0 * x / y)
            .collect();
        let rounds: Vec<String> = per_round.iter().map(|r| format!("{r:.0}%")).collect();
        format!("{:.0}% (rounds: {})", median(&per_round), rounds.join(" "))
    };
    println!("  cluster jobs/s = {} of single-node jobs/s", ratio(0, 1));
    println!(
        "  cluster jobs/s = {} of redis-benchmark --cluster requests/s",
        ratio(0, 2)
    );
    println!(
        "  single jobs/s = {} of redis-benchmark requests/s",
        ratio(1, 3)
    );
    println!(
        "  redis-benchmark --cluster = {} of redis-benchmark on one node",
        ratio(2, 3)
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
