//! A counting global allocator shows that the success path of a `#[retry]` fn makes zero heap
//! allocations: with the embedded default runtime, inside `Runtime::scope` with an observer,
//! with `timeout` (and `budget`) set, and through `Policy::run`.
//!
//! Each call is warmed up once first, so one-time lazy initialisation (the embedded runtime,
//! interned metric labels) does not count; the counter is switched on only around the measured
//! call, on this thread, on a current-thread runtime.

use jobguard::{Event, Jitter, MemoryDeadLetters, Policy, Runtime};
use jobguard_testkit::alloc::{self, Counting};
use jobguard_testkit::gateway::GatewayError;
use std::time::Duration;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `fut` on a fresh current-thread runtime: once to warm up, then again with the counter
/// on around the call only. Returns the allocations of the second run and its output.
fn allocations_of<F: Future>(mut make: impl FnMut() -> F) -> (usize, F::Output) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        make().await;
        alloc::start();
        let out = make().await;
        (alloc::stop(), out)
    })
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s")]
async fn capture(amount: u64) -> Result<u64, GatewayError> {
    Ok(amount + 1)
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", timeout = "2s")]
async fn capture_with_timeout(amount: u64) -> Result<u64, GatewayError> {
    Ok(amount + 1)
}

#[jobguard::retry(
    attempts = 5,
    base = "500ms",
    cap = "8s",
    timeout = "2s",
    budget = "30s"
)]
async fn capture_with_budget(amount: u64) -> Result<u64, GatewayError> {
    Ok(amount + 1)
}

#[jobguard::retry(attempts = 5, base = "0ms", cap = "0ms", jitter = none)]
async fn always_fails() -> Result<u64, GatewayError> {
    Err(GatewayError::Timeout)
}

#[test]
fn the_counter_counts() {
    let (n, boxed) = allocations_of(|| async { Box::new(7u64) });
    assert_eq!((n, *boxed), (1, 7));
    // A give-up writes a dead letter: that path does allocate, and is seen to.
    let (n, out) = allocations_of(always_fails);
    assert!(out.is_err());
    assert!(n > 0, "a dead letter allocates; the counter saw {n}");
}

#[test]
fn the_success_path_of_a_retry_fn_allocates_nothing() {
    let (n, out) = allocations_of(|| capture(41));
    assert_eq!(out.unwrap(), 42);
    assert_eq!(n, 0, "the success path of #[retry] allocated {n} time(s)");
}

#[test]
fn the_success_path_with_a_timeout_allocates_nothing() {
    let (n, out) = allocations_of(|| capture_with_timeout(41));
    assert_eq!(out.unwrap(), 42);
    assert_eq!(
        n, 0,
        "the success path with `timeout` allocated {n} time(s)"
    );
}

#[test]
fn the_success_path_with_a_timeout_and_a_budget_allocates_nothing() {
    let (n, out) = allocations_of(|| capture_with_budget(41));
    assert_eq!(out.unwrap(), 42);
    assert_eq!(
        n, 0,
        "the success path with `timeout` and `budget` allocated {n} time(s)"
    );
}

#[test]
fn the_success_path_inside_a_scoped_runtime_with_an_observer_allocates_nothing() {
    let runtime = Runtime::builder()
        .dead_letters(MemoryDeadLetters::new())
        .observer(|e: &Event<'_>| {
            std::hint::black_box(e);
        })
        .seed(1)
        .build();
    let (n, out) = allocations_of(|| runtime.scope(capture_with_timeout(41)));
    assert_eq!(out.unwrap(), 42);
    assert_eq!(n, 0, "the success path in a scope allocated {n} time(s)");
}

#[test]
fn the_success_path_of_policy_run_allocates_nothing() {
    const POLICY: Policy = Policy::new()
        .attempts(5)
        .jitter(Jitter::Full)
        .timeout(Duration::from_secs(2));
    let (n, out) = allocations_of(|| POLICY.run("capture", async |_| Ok::<_, GatewayError>(42)));
    assert_eq!(out.unwrap(), 42);
    assert_eq!(
        n, 0,
        "the success path of Policy::run allocated {n} time(s)"
    );
}
