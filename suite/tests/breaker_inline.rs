//! The breaker on the success path of a call nobody watches (no observer is built in this
//! process, so every call takes the inline path): a closed breaker's permit and a half-open
//! probe's, through failure, a pending attempt, a dropped call and an `Ok` that `on_ok` retries.
//! Some of these repeat `tests/breaker_probes.rs` on purpose: that file builds an observer, which
//! takes every call in its process off the inline path.

use jobguard::{BreakerState, CircuitBreaker, Verdict};
use jobguard_testkit::gateway::GatewayError;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const COOLDOWN: Duration = Duration::from_secs(30);

/// A breaker that has just turned half-open: its next call is a probe.
async fn half_open(failures: u32) -> CircuitBreaker {
    let breaker = CircuitBreaker::new(failures, COOLDOWN);
    breaker.trip();
    tokio::time::advance(COOLDOWN).await;
    breaker
}

#[jobguard::retry(attempts = 3, base = "100ms", jitter = none, breaker = breaker)]
async fn failing(breaker: &CircuitBreaker, calls: &AtomicU32) -> Result<(), GatewayError> {
    calls.fetch_add(1, Ordering::Relaxed);
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 1, breaker = breaker)]
async fn slow_ok(breaker: &CircuitBreaker, wait: Duration) -> Result<(), GatewayError> {
    tokio::time::sleep(wait).await;
    Ok(())
}

/// `true` for an `Ok` that `on_ok` should retry: the first answer of every call.
fn first_answer(answer: &u32) -> Verdict {
    if *answer == 1 {
        Verdict::Retry
    } else {
        Verdict::Fail
    }
}

#[jobguard::retry(attempts = 3, base = "100ms", jitter = none, breaker = breaker, on_ok = first_answer)]
async fn answers(breaker: &CircuitBreaker, calls: &AtomicU32) -> Result<u32, GatewayError> {
    Ok(calls.fetch_add(1, Ordering::Relaxed) + 1)
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_it_and_the_next_attempt_is_refused() {
    let breaker = half_open(1).await;
    let calls = AtomicU32::new(0);
    let err = failing(&breaker, &calls).await.unwrap_err();
    assert!(
        matches!(
            err,
            GatewayError::Jobguard(jobguard::Error::CircuitOpen { .. })
        ),
        "{err:?}"
    );
    assert_eq!(calls.load(Ordering::Relaxed), 1, "only the probe ran");
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_probe_pending_at_its_first_poll_closes_it_when_it_succeeds() {
    let breaker = half_open(1).await;
    slow_ok(&breaker, Duration::from_secs(1)).await.unwrap();
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_pending_probe_dropped_with_its_call_gives_its_slot_back() {
    let breaker = half_open(1).await;
    let cut = tokio::time::timeout(
        Duration::from_secs(1),
        slow_ok(&breaker, Duration::from_secs(60)),
    )
    .await;
    assert!(cut.is_err(), "the probe was still running, and was dropped");
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    slow_ok(&breaker, Duration::ZERO)
        .await
        .expect("the slot came back: a new probe runs");
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_s_ok_that_on_ok_retries_reopens_it() {
    let breaker = half_open(1).await;
    let calls = AtomicU32::new(0);
    let got = answers(&breaker, &calls).await;
    assert!(
        matches!(
            got,
            Err(GatewayError::Jobguard(jobguard::Error::CircuitOpen { .. }))
        ),
        "{got:?}"
    );
    assert_eq!(calls.load(Ordering::Relaxed), 1, "the retry was refused");
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_closed_breaker_counts_a_retried_ok_once_and_the_success_clears_it() {
    let breaker = CircuitBreaker::new(2, COOLDOWN);
    let calls = AtomicU32::new(0);
    assert_eq!(answers(&breaker, &calls).await.unwrap(), 2);
    assert_eq!(breaker.state(), BreakerState::Closed);
    // The retried `Ok` counted one failure and the accepted one cleared it: one more failure
    // does not reach the threshold of two.
    let failures = AtomicU32::new(0);
    #[jobguard::retry(attempts = 1, breaker = breaker)]
    async fn once(breaker: &CircuitBreaker, calls: &AtomicU32) -> Result<(), GatewayError> {
        calls.fetch_add(1, Ordering::Relaxed);
        Err(GatewayError::Timeout)
    }
    once(&breaker, &failures).await.unwrap_err();
    assert_eq!(breaker.state(), BreakerState::Closed);
    once(&breaker, &failures).await.unwrap_err();
    assert_eq!(breaker.state(), BreakerState::Open);
}
