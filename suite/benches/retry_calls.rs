//! A plain loop of job calls, without criterion: for a profiler, and for a clock steadier than
//! criterion's on a shared machine. Under `valgrind --tool=callgrind`, two call counts give
//! the instructions of one call (the difference over the difference in calls), criterion's own
//! work left out.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench retry_calls --no-default-features --no-run
//! valgrind --tool=callgrind target/release/deps/retry_calls-* CONTENDER CALLS
//! ```
//!
//! `CONTENDER` is `bare`, `retry` or `breaker`: the success path of the same `async fn` as
//! `benches/retry.rs` measures; `bare-call`, `tokio-retry`,
//! `policy-run` and `backon` are that bench's "bare call", tokio-retry, `Policy::run` and backon
//! lines, as it writes them. Each contender runs in a loop of its own.
//!
//! On a shared machine, the process's user CPU time over many calls is a steadier clock than
//! criterion's wall time (a preempted call is not counted):
//!
//! ```text
//! /usr/bin/time -f %U target/release/deps/retry_calls-* CONTENDER 50000000
//! ```

#[path = "support/success_path.rs"]
mod success_path;

use std::hint::black_box;
use std::io;
use success_path::*;

#[inline(never)]
async fn bare(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

/// Calls `$job` `$calls` times in a loop of its own (one loop per contender, so the choice of
/// contender is not in the count), summing the answers.
macro_rules! calls {
    ($job:path, $calls:expr) => {{
        let mut sum = 0u64;
        for n in 0..$calls {
            sum = sum.wrapping_add(black_box($job(black_box(n)).await).unwrap_or(0));
        }
        sum
    }};
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
        match contender.as_str() {
            "bare" => calls!(bare, calls),
            "bare-call" => calls!(answer_bare, calls),
            "tokio-retry" => calls!(answer_tokio_retry, calls),
            "breaker" => calls!(answer_breaker, calls),
            "policy-run" => calls!(answer_policy_run, calls),
            "backon" => calls!(answer_backon, calls),
            "retry" => calls!(answer_retry, calls),
            other => panic!(
                "no contender {other:?}: bare, bare-call, tokio-retry, retry, breaker, policy-run, \
                 backon"
            ),
        }
    });
    println!("{contender}: {calls} calls, sum {sum}");
}
