//! What the broker benchmarks (`rabbitmq`, `nats`) share: the three handlers a consumer loop
//! runs (bare, bare plus two Redis round trips, guarded), the runtime they run under, and the
//! median of a contender's trials. Included with `#[path]`.

use jobguard::{Delivery, MemoryDeadLetters, RedisStore, Runtime};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use std::sync::OnceLock;

/// Trials per contender; the table gives the median.
pub const TRIALS: usize = 5;
/// The consumer's prefetch, and the jobs it runs at a time.
pub const CONCURRENCY: usize = 16;

/// What a consumer loop runs for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// The work itself: nothing, so the table shows the pipeline's cost.
    Bare,
    /// The bare handler plus two plain Redis round trips (`SET NX PX`, then `SET EX`): the floor
    /// of any claim-then-complete design.
    RoundTrips,
    /// The bare handler under `#[idempotent]` + `#[retry]` with `RedisStore`, in the delivery's
    /// scope ([`Delivery::scope_settled`]), as the examples run it.
    Guarded,
}

impl Handler {
    /// The contenders, in the order each round runs them.
    pub const ALL: [Handler; 3] = [Handler::Bare, Handler::RoundTrips, Handler::Guarded];

    /// Runs job `id` of trial `trial` in `delivery`; whether the message is to be acked.
    pub async fn run(self, trial: usize, id: u64, delivery: Delivery) -> bool {
        let result = match self {
            Handler::Bare => bare(id).await,
            Handler::RoundTrips => two_round_trips(trial, id).await,
            Handler::Guarded => {
                let (result, settled) = delivery.scope_settled(guarded(trial, id)).await;
                return result.is_ok() || settled;
            }
        };
        result.is_ok()
    }
}

async fn bare(id: u64) -> Result<u64, jobguard::Error> {
    Ok(id)
}

#[jobguard::idempotent(key = format!("{trial}-{id}"), scope = "bench.broker", ttl = "60s")]
#[jobguard::retry(attempts = 3)]
async fn guarded(trial: usize, id: u64) -> Result<u64, jobguard::Error> {
    Ok(id)
}

static CONN: OnceLock<ConnectionManager> = OnceLock::new();

async fn two_round_trips(trial: usize, id: u64) -> Result<u64, jobguard::Error> {
    let mut redis = CONN.get().expect("the bench's connection").clone();
    let key = format!("rt:{trial}:{id}");
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
    Ok(id)
}

/// Connects the round trips' connection and installs the guarded handler's runtime: claims in
/// `RedisStore` on `redis_url`, letters in memory.
pub async fn install(redis_url: &str) {
    let client = redis::Client::open(redis_url).expect("a Redis URL");
    let conn = ConnectionManager::new(client).await.expect("connect");
    CONN.set(conn).expect("set once");
    Runtime::builder()
        .store(RedisStore::connect(redis_url).await.expect("RedisStore"))
        .dead_letters(MemoryDeadLetters::new())
        .build()
        .install()
        .expect("the bench's runtime");
}

/// The median of `xs`.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The jobs per trial: `JOBGUARD_BENCH_JOBS`, else `default`.
pub fn jobs(default: usize) -> usize {
    std::env::var("JOBGUARD_BENCH_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Prints the table of one benchmark: a header, then one row of medians.
pub fn print(title: &str, jobs: usize, rates: [Vec<f64>; 3]) {
    let [bare, trips, guarded] = rates.map(median);
    println!("{title}, {jobs} jobs per trial, prefetch {CONCURRENCY}, median of {TRIALS} trials");
    println!(
        "| bare (jobs/s) | bare + 2 round trips (jobs/s) | #[idempotent] + #[retry] (jobs/s) | cost vs bare | cost vs 2 round trips |"
    );
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {bare:.0} | {trips:.0} | {guarded:.0} | {:.1}% | {:.1}% |",
        (1.0 - guarded / bare) * 100.0,
        (1.0 - guarded / trips) * 100.0
    );
}
