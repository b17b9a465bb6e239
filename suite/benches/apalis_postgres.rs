//! Jobs per second through apalis on Postgres (apalis-postgres 1.0): a bare handler beside the
//! same handler under `#[idempotent]` + `#[retry]` with `PgStore` in the same database and
//! `GuardLayer`, on one private `postgres`, with the worker's concurrency at 16. A third
//! contender, the bare handler plus two plain SQL round trips on the same pool (`INSERT ... ON
//! CONFLICT DO NOTHING`, then an `UPDATE` of that row), is the floor for any
//! claim-then-complete design. A timed harness, one run:
//!
//! ```text
//! cargo bench -p jobguard-suite --bench apalis_postgres
//! ```
//!
//! Each trial pushes `JOBS` fresh jobs to a fresh queue, then times one in-process worker from
//! its start until apalis-postgres counts every job `Done` (polled every 5 ms). The contenders
//! alternate, `TRIALS` times each, and the table gives the median trial.
//! `JOBGUARD_BENCH_JOBS=N` changes the jobs per trial.

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use jobguard::apalis::GuardLayer;
use jobguard::{MemoryDeadLetters, PgStore, Runtime};
use jobguard_testkit::postgres::PgServer;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const TRIALS: usize = 5;
const CONCURRENCY: usize = 16;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    trial: usize,
    id: usize,
}

/// The work itself: nothing, so the table shows the pipeline's cost.
async fn bare(job: Job) -> Result<usize, jobguard::Error> {
    Ok(job.id)
}

#[jobguard::idempotent(key = format!("{}-{}", job.trial, job.id), scope = "bench.apalis_postgres", ttl = "60s")]
#[jobguard::retry(attempts = 3)]
async fn guarded(job: Job) -> Result<usize, jobguard::Error> {
    Ok(job.id)
}

static POOL: OnceLock<PgPool> = OnceLock::new();

/// The floor for a guarded job: the bare handler plus two SQL round trips on the pool, as a
/// claim and a completion are.
async fn two_round_trips(job: Job) -> Result<usize, jobguard::Error> {
    let pool = POOL.get().expect("the bench's pool");
    let key = format!("{}-{}", job.trial, job.id);
    let store = |e: sqlx::Error| jobguard::Error::Store(e.to_string());
    sqlx::query(
        "INSERT INTO bench_keys (key, state) VALUES ($1, 'claimed') ON CONFLICT DO NOTHING",
    )
    .bind(&key)
    .execute(pool)
    .await
    .map_err(store)?;
    sqlx::query("UPDATE bench_keys SET state = 'done' WHERE key = $1")
        .bind(&key)
        .execute(pool)
        .await
        .map_err(store)?;
    Ok(job.id)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Handler {
    Bare,
    RoundTrips,
    Guarded,
}

fn config(trial: usize) -> Config {
    Config::default()
        .queue(format!("bench-{trial}"))
        .batch_size(CONCURRENCY)
}

async fn done(pool: &PgPool, queue: &str) -> usize {
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM apalis.jobs WHERE job_type = $1 AND status = 'Done'")
            .bind(queue)
            .fetch_one(pool)
            .await
            .expect("count the done tasks");
    n as usize
}

/// One trial: pushes `jobs` jobs, then runs a worker until all are done; jobs per second.
async fn trial(pool: &PgPool, trial: usize, handler: Handler, jobs: usize) -> f64 {
    let config = config(trial);
    let queue = format!("bench-{trial}");
    let mut producer = PostgresStorage::<Job>::new(pool).with_config(config.clone());
    for id in 0..jobs {
        producer.push(Job { trial, id }).await.expect("push a job");
    }
    let storage = PostgresStorage::<Job>::new(pool).with_config(config);
    let poll = pool.clone();
    let until_done = async move {
        while done(&poll, &queue).await < jobs {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok::<(), WorkerError>(())
    };
    let name = format!("bench-worker-{trial}");
    let started = Instant::now();
    match handler {
        Handler::Bare => WorkerBuilder::new(name)
            .backend(storage)
            .concurrency(CONCURRENCY)
            .build(bare)
            .run_until(until_done)
            .await
            .expect("the worker runs"),
        Handler::RoundTrips => WorkerBuilder::new(name)
            .backend(storage)
            .concurrency(CONCURRENCY)
            .build(two_round_trips)
            .run_until(until_done)
            .await
            .expect("the worker runs"),
        Handler::Guarded => WorkerBuilder::new(name)
            .backend(storage)
            .concurrency(CONCURRENCY)
            .layer(GuardLayer::new())
            .build(guarded)
            .run_until(until_done)
            .await
            .expect("the worker runs"),
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
    let Some(server) = PgServer::start() else {
        return;
    };
    let jobs: usize = std::env::var("JOBGUARD_BENCH_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .connect(&server.url())
            .await
            .expect("connect to postgres");
        PostgresStorage::setup(&pool)
            .await
            .expect("apalis-postgres's migrations");
        let store = PgStore::new(pool.clone());
        store.migrate().await.expect("jobguard's migration");
        sqlx::query("CREATE TABLE bench_keys (key TEXT PRIMARY KEY, state TEXT NOT NULL)")
            .execute(&pool)
            .await
            .expect("the round trips' table");
        POOL.set(pool.clone()).expect("set once");
        Runtime::builder()
            .store(store)
            .dead_letters(MemoryDeadLetters::new())
            .build()
            .install()
            .expect("the bench's runtime");
        let mut n = 0;
        // Warm-up: connections, statements prepared, allocator.
        for handler in [Handler::Bare, Handler::RoundTrips, Handler::Guarded] {
            trial(&pool, n, handler, jobs / 4).await;
            n += 1;
        }
        let (mut bare, mut trips, mut guarded) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..TRIALS {
            for (handler, rates) in [
                (Handler::Bare, &mut bare),
                (Handler::RoundTrips, &mut trips),
                (Handler::Guarded, &mut guarded),
            ] {
                rates.push(trial(&pool, n, handler, jobs).await);
                n += 1;
            }
        }
        let (bare, trips, guarded) = (median(bare), median(trips), median(guarded));
        println!(
            "apalis + Postgres, {jobs} jobs per trial, concurrency {CONCURRENCY}, median of {TRIALS} trials"
        );
        println!(
            "| bare (jobs/s) | bare + 2 round trips (jobs/s) | #[idempotent] + #[retry] (jobs/s) | cost vs bare | cost vs 2 round trips |"
        );
        println!("|---:|---:|---:|---:|---:|");
        println!(
            "| {bare:.0} | {trips:.0} | {guarded:.0} | {:.1}% | {:.1}% |",
            (1.0 - guarded / bare) * 100.0,
            (1.0 - guarded / trips) * 100.0
        );
    });
}
