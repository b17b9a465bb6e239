//! The success path's contenders, shared by `benches/retry.rs` (criterion) and
//! `benches/retry_calls.rs` (a plain loop, for a profiler or a CPU-time clock), so that both
//! measure the same code.
//! Included with `#[path]`.

use backon::{ExponentialBuilder, Retryable};
use jobguard::{CircuitBreaker, Policy};
use std::hint::black_box;
use std::io;
use std::time::Duration;
use tokio_retry::strategy::ExponentialBackoff;

/// The success path's work: as small as the peers' examples.
pub async fn answer(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

/// The "bare call": the work behind one plain `async fn`.
pub async fn answer_bare(n: u64) -> Result<u64, io::Error> {
    answer(n).await
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s")]
pub async fn answer_retry(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

pub static BREAKER: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", breaker = BREAKER)]
pub async fn answer_breaker(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

const CURVE: Policy = Policy::new()
    .attempts(5)
    .base(Duration::from_millis(500))
    .cap(Duration::from_secs(8));

pub async fn answer_policy_run(n: u64) -> Result<u64, io::Error> {
    CURVE.run("bench::answer", async |_| answer(n).await).await
}

pub async fn answer_backon(n: u64) -> Result<u64, io::Error> {
    let curve = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(8))
        .with_max_times(4)
        .with_jitter();
    (|| answer(n)).retry(curve).await
}

pub async fn answer_tokio_retry(n: u64) -> Result<u64, io::Error> {
    let curve = ExponentialBackoff::from_millis(2)
        .factor(250)
        .max_delay(Duration::from_secs(8))
        .map(tokio_retry::strategy::jitter)
        .take(4);
    tokio_retry::Retry::start(curve, || answer(n)).await
}
