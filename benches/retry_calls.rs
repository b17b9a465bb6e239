//! A plain loop of job calls for instruction counting: `valgrind --tool=callgrind` on this
//! binary at two call counts gives the instructions of one call (the difference over the
//! difference in calls), without criterion's own work in the count.
//!
//! ```text
//! cargo bench --bench retry_calls --no-default-features --no-run
//! valgrind --tool=callgrind target/release/deps/retry_calls-* CONTENDER CALLS
//! ```
//!
//! `CONTENDER` is `bare`, `retry` or `breaker`: the success path of the same `async fn` as
//! `benches/retry.rs` measures.

use jobguard::CircuitBreaker;
use std::hint::black_box;
use std::io;
use std::time::Duration;

static BREAKER: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));

#[inline(never)]
async fn bare(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s")]
async fn retried(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", breaker = BREAKER)]
async fn broken(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with("--"));
    let contender = args.next().unwrap_or_else(|| "retry".to_owned());
    let calls: u64 = args
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let sum = rt.block_on(async {
        let mut sum = 0u64;
        for n in 0..calls {
            sum = sum.wrapping_add(match contender.as_str() {
                "bare" => black_box(bare(black_box(n)).await).unwrap_or(0),
                "breaker" => black_box(broken(black_box(n)).await).unwrap_or(0),
                _ => black_box(retried(black_box(n)).await).unwrap_or(0),
            });
        }
        sum
    });
    println!("{contender}: {calls} calls, sum {sum}");
}
