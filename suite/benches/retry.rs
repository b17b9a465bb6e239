//! The retry wrapper's cost, in one run, beside the peers.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench retry --no-default-features -- --warm-up-time 1 --measurement-time 3
//! cargo bench -p jobguard-suite --bench retry -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! `retry_success`: the first attempt succeeds. The work is as small as the peers' own examples
//! (`async fn` returning `Ok(black_box(n) + 1)`), wrapped as a new user would: `#[retry(attempts =
//! 5, base = "500ms", cap = "8s")]` (with and without a `static` breaker), `Policy::run`, backon's
//! `ExponentialBuilder` and tokio-retry's `Retry::start` with the same curve.
//!
//! `retry_fail3_then_succeed`: 4 attempts (3 retries), zero delay, no jitter, every error
//! retried. The "bare" line is a hand-written `loop` that calls the work again until it
//! succeeds: the least any retry can cost.
//!
//! Everything runs on one current-thread tokio runtime, the way a worker would run a job;
//! criterion's `to_async` enters it once per sample, not once per call. Every measured call's
//! answer is checked as it comes (see `answers!` for why not by a call of its own).

#[path = "support/success_path.rs"]
mod success_path;

use backon::{ConstantBuilder, Retryable};
use criterion::{Criterion, criterion_group, criterion_main};
use jobguard::{Jitter, Policy};
use std::cell::Cell;
use std::hint::black_box;
use std::io;
use std::time::Duration;
use success_path::*;
use tokio_retry::strategy::FixedInterval;

/// The work every contender wraps: fails with a transient I/O error (which allocates nothing)
/// until it has been called `fail + 1` times, then answers.
async fn work(calls: &Cell<u32>, fail: u32) -> Result<u64, io::Error> {
    let n = calls.get();
    calls.set(n + 1);
    if n < fail {
        Err(io::ErrorKind::ConnectionReset.into())
    } else {
        Ok(black_box(u64::from(n)))
    }
}

/// Calls `work` until it succeeds, with nothing in between.
async fn bare_loop(calls: &Cell<u32>, fail: u32) -> Result<u64, io::Error> {
    loop {
        if let Ok(v) = work(calls, fail).await {
            return Ok(v);
        }
    }
}

#[jobguard::retry(attempts = 4, base = "0ms", cap = "0ms", jitter = none)]
async fn attribute(calls: &Cell<u32>, fail: u32) -> Result<u64, io::Error> {
    work(calls, fail).await
}

const POLICY: Policy = Policy::new()
    .attempts(4)
    .base(Duration::ZERO)
    .cap(Duration::ZERO)
    .jitter(Jitter::None);

async fn policy_run(calls: &Cell<u32>, fail: u32) -> Result<u64, io::Error> {
    POLICY
        .run("bench::policy_run", async |_| work(calls, fail).await)
        .await
}

const BACKON: ConstantBuilder = ConstantBuilder::new()
    .with_delay(Duration::ZERO)
    .with_max_times(3);

async fn backon(calls: &Cell<u32>, fail: u32) -> Result<u64, io::Error> {
    (|| work(calls, fail)).retry(BACKON).await
}

async fn tokio_retry(calls: &Cell<u32>, fail: u32) -> Result<u64, io::Error> {
    // `Retry::spawn` is `Retry::start` under its pre-0.3.2 name.
    tokio_retry::Retry::start(FixedInterval::new(Duration::ZERO).take(3), || {
        work(calls, fail)
    })
    .await
}

/// Benchmarks one contender of the success path, and checks every answer it gives while
/// measured (a compare and a branch never taken, the same for every contender).
///
/// The check is made on the measured calls, not by a call of its own. A second call site (a
/// `block_on` before measuring) would make the compiler less willing to inline the contender's
/// `poll` into criterion's loop; the bare call is small enough to be inlined anyway, the
/// wrappers are not, so each wrapper would pay a function call the bare call does not, and the
/// ratio would measure the inliner rather than the wrapper. Polled from one place, as a worker
/// polls a job, every contender is treated alike.
macro_rules! answers {
    ($group:expr, $rt:expr, $name:expr, $call:path) => {{
        $group.bench_function($name, |b| {
            b.to_async($rt).iter(|| async {
                // Consumed as a `u64`, the same for every contender: the whole `Result` put
                // through `black_box` is copied differently from one contender's loop to the
                // next, and that copy, not the contender, would show in the figure.
                let answer = match $call(black_box(41)).await {
                    Ok(42) => 42,
                    other => wrong_answer($name, other),
                };
                black_box(answer)
            })
        });
    }};
}

#[cold]
#[inline(never)]
fn wrong_answer(name: &str, answer: Result<u64, io::Error>) -> ! {
    panic!("{name}: {answer:?}, not Ok(42)")
}

/// Benchmarks one contender: each iteration is one job call from a fresh counter, checked as
/// it comes (as in `answers!`): the contender ran the work `fail + 1` times and succeeded.
macro_rules! contender {
    ($group:expr, $rt:expr, $name:expr, $fail:expr, $call:path) => {{
        let fail: u32 = $fail;
        $group.bench_function($name, |b| {
            b.to_async($rt).iter(|| async {
                let calls = Cell::new(0);
                let out = $call(black_box(&calls), black_box(fail)).await;
                let ran = calls.get();
                match out {
                    Ok(v) if v == u64::from(fail) && ran == fail + 1 => black_box(v),
                    other => wrong_run($name, other, ran),
                }
            })
        });
    }};
}

#[cold]
#[inline(never)]
fn wrong_run(name: &str, out: Result<u64, io::Error>, ran: u32) -> ! {
    panic!("{name}: {out:?} after {ran} calls of the work")
}

fn retry(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let mut group = c.benchmark_group("retry_success");
    answers!(group, &rt, "bare call", answer_bare);
    answers!(group, &rt, "#[retry]", answer_retry);
    answers!(group, &rt, "#[retry] + breaker", answer_breaker);
    answers!(group, &rt, "Policy::run", answer_policy_run);
    answers!(group, &rt, "backon", answer_backon);
    answers!(group, &rt, "tokio-retry", answer_tokio_retry);
    group.finish();

    let mut group = c.benchmark_group("retry_fail3_then_succeed");
    contender!(group, &rt, "bare loop", 3, bare_loop);
    contender!(group, &rt, "#[retry]", 3, attribute);
    contender!(group, &rt, "Policy::run", 3, policy_run);
    contender!(group, &rt, "backon", 3, backon);
    contender!(group, &rt, "tokio-retry", 3, tokio_retry);
    group.finish();
}

criterion_group!(benches, retry);
criterion_main!(benches);
