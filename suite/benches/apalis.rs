//! Jobs per second through apalis on Redis: a bare handler beside the same handler under
//! `#[idempotent]` + `#[retry]` with `RedisStore` and `GuardLayer`, both on one private
//! `redis-server`, with one worker's concurrency at 1 and at 16, then four workers at 16 each on
//! a backlog of 7,000 jobs (`JOBGUARD_BENCH_BACKLOG=N` changes it), with the README's worker
//! settings (each fetches as many jobs as it runs). Not 10,000: apalis-redis 1.0 files every
//! pushed job as scheduled, and its fetch moves every due one to the queue in one Lua `unpack`,
//! which fails past about 8,000 ("too many results to unpack"), stopping the worker. A third contender, the bare
//! handler plus two plain Redis round trips, is the floor for any claim-then-complete design.
//! A timed harness, one run:
//!
//! ```text
//! cargo bench -p jobguard-suite --bench apalis
//! ```
//!
//! Each trial pushes `JOBS` fresh jobs to a fresh queue, then times one in-process worker from
//! its start until the broker counts every job done (its done set, polled every millisecond).
//! The contenders alternate, `TRIALS` times each, and the table gives the median trial.
//! `JOBGUARD_BENCH_JOBS=N` changes the jobs per trial.

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::GuardLayer;
use jobguard::{MemoryDeadLetters, RedisStore, Runtime};
use jobguard_testkit::redis::RedisServer;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const TRIALS: usize = 5;
const CONCURRENCY: [usize; 2] = [1, 16];

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    trial: usize,
    id: usize,
}

/// The work itself: nothing, so the table shows the pipeline's cost.
async fn bare(job: Job) -> Result<usize, jobguard::Error> {
    Ok(job.id)
}

#[jobguard::idempotent(key = format!("{}-{}", job.trial, job.id), scope = "bench.apalis", ttl = "60s")]
#[jobguard::retry(attempts = 3)]
async fn guarded(job: Job) -> Result<usize, jobguard::Error> {
    Ok(job.id)
}

/// The floor for a guarded job: the bare handler plus two Redis round trips, as a claim and a
/// completion are, on a connection manager like `RedisStore`'s.
async fn two_round_trips(job: Job) -> Result<usize, jobguard::Error> {
    let mut redis = CONN.get().expect("the bench's connection").clone();
    let key = format!("rt:{}:{}", job.trial, job.id);
    let store = |e: redis::RedisError| jobguard::Error::Store(e.to_string());
    let _: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg("claim")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut redis)
        .await
        .map_err(store)?;
    let _: () = redis.set_ex(&key, "done", 60).await.map_err(store)?;
    Ok(job.id)
}

static CONN: std::sync::OnceLock<redis::aio::ConnectionManager> = std::sync::OnceLock::new();

#[derive(Debug, Clone, Copy, PartialEq)]
enum Handler {
    Bare,
    RoundTrips,
    Guarded,
}

static TRIAL: AtomicUsize = AtomicUsize::new(0);

fn config(trial: usize, concurrency: usize) -> apalis_redis::Config {
    apalis_redis::Config::default()
        .queue(format!("bench-{trial}"))
        .batch_size(concurrency)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(10)
}

/// One trial: pushes `jobs` jobs, then runs `workers` workers (each `concurrency` jobs at a
/// time, fetching as many) until all are done; jobs per second.
async fn trial(
    url: &str,
    handler: Handler,
    workers: usize,
    concurrency: usize,
    jobs: usize,
) -> f64 {
    let trial = TRIAL.fetch_add(1, Ordering::Relaxed);
    let config = config(trial, concurrency);
    let conn = apalis_redis::connect(url).await.expect("connect");
    let mut producer = RedisStorage::<Job>::new(conn.clone()).with_config(config.clone());
    producer
        .push_bulk((0..jobs).map(|id| Job { trial, id }).collect())
        .await
        .expect("push the jobs");
    let done_set = config.done_jobs_set();
    let until_done = move || {
        let mut poll = conn.clone();
        let done_set = done_set.clone();
        async move {
            loop {
                let done: usize = poll.scard(&done_set).await.expect("SCARD");
                if done >= jobs {
                    return Ok::<(), WorkerError>(());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for w in 0..workers {
        let name = format!("bench-worker-{trial}-{w}");
        let storage = RedisStorage::<Job>::new(apalis_redis::connect(url).await.expect("connect"))
            .with_config(config.clone());
        let done = until_done();
        match handler {
            Handler::Bare => running.spawn(
                WorkerBuilder::new(name)
                    .backend(storage)
                    .concurrency(concurrency)
                    .build(bare)
                    .run_until(done),
            ),
            Handler::RoundTrips => running.spawn(
                WorkerBuilder::new(name)
                    .backend(storage)
                    .concurrency(concurrency)
                    .build(two_round_trips)
                    .run_until(done),
            ),
            Handler::Guarded => running.spawn(
                WorkerBuilder::new(name)
                    .backend(storage)
                    .concurrency(concurrency)
                    .layer(GuardLayer::new())
                    .build(guarded)
                    .run_until(done),
            ),
        };
    }
    while let Some(ran) = running.join_next().await {
        ran.expect("the worker's task").expect("the worker runs");
    }
    jobs as f64 / started.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    // `cargo test --benches` runs this with `--bench`-less arguments; only `cargo bench` measures.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(server) = RedisServer::start() else {
        return;
    };
    let jobs: usize = std::env::var("JOBGUARD_BENCH_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let backlog: usize = std::env::var("JOBGUARD_BENCH_BACKLOG")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(7_000);
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("a Redis URL");
        let conn = redis::aio::ConnectionManager::new(client)
            .await
            .expect("connect");
        CONN.set(conn).expect("set once");
        Runtime::builder()
            .store(RedisStore::connect(&url).await.expect("RedisStore"))
            .dead_letters(MemoryDeadLetters::new())
            .build()
            .install()
            .expect("the bench's runtime");
        // Warm-up: connections, scripts loaded, allocator.
        trial(&url, Handler::Bare, 1, 16, jobs / 4).await;
        trial(&url, Handler::Guarded, 1, 16, jobs / 4).await;

        println!("apalis + Redis, {jobs} jobs per trial, median of {TRIALS} trials");
        println!(
            "| concurrency | bare (jobs/s) | bare + 2 round trips (jobs/s) | #[idempotent] + #[retry] (jobs/s) | cost vs bare | cost vs 2 round trips |"
        );
        println!("|---:|---:|---:|---:|---:|---:|");
        for concurrency in CONCURRENCY {
            let (mut bare, mut trips, mut guarded) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..TRIALS {
                bare.push(trial(&url, Handler::Bare, 1, concurrency, jobs).await);
                trips.push(trial(&url, Handler::RoundTrips, 1, concurrency, jobs).await);
                guarded.push(trial(&url, Handler::Guarded, 1, concurrency, jobs).await);
            }
            let (bare, trips, guarded) = (median(bare), median(trips), median(guarded));
            println!(
                "| {concurrency} | {bare:.0} | {trips:.0} | {guarded:.0} | {:.1}% | {:.1}% |",
                (1.0 - guarded / bare) * 100.0,
                (1.0 - guarded / trips) * 100.0
            );
        }

        // The README's multi-worker setup: 4 workers, 16 jobs at a time each, on one backlog.
        println!();
        println!("4 workers x concurrency 16, a backlog of {backlog} jobs, median of {TRIALS} trials");
        println!("| bare (jobs/s) | bare + 2 round trips (jobs/s) | #[idempotent] + #[retry] (jobs/s) | guarded / bare |");
        println!("|---:|---:|---:|---:|");
        let (mut bare, mut trips, mut guarded) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..TRIALS {
            bare.push(trial(&url, Handler::Bare, 4, 16, backlog).await);
            trips.push(trial(&url, Handler::RoundTrips, 4, 16, backlog).await);
            guarded.push(trial(&url, Handler::Guarded, 4, 16, backlog).await);
        }
        let (bare, trips, guarded) = (median(bare), median(trips), median(guarded));
        println!(
            "| {bare:.0} | {trips:.0} | {guarded:.0} | {:.1}% |",
            guarded / bare * 100.0
        );
    });
}
