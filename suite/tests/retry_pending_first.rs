//! A call's first attempt when it does not succeed in its first poll (pending, then failing or
//! succeeding): numbered, timed, counted against the breaker and retried as any other attempt.

use jobguard::{BreakerState, CircuitBreaker};
use jobguard_testkit::gateway::GatewayError;
use std::sync::Mutex;
use std::time::Duration;

/// The attempt numbers the body saw, in order.
static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Yields once (so its first poll is pending), then fails until attempt `ok_at`.
async fn pends_then(ok_at: u32) -> Result<u32, std::io::Error> {
    let number = jobguard::attempt().expect("inside a guarded call").number;
    SEEN.lock().unwrap().push(number);
    tokio::task::yield_now().await;
    // Still attempt `number` after the pending poll.
    assert_eq!(jobguard::attempt().map(|a| a.number), Some(number));
    if number < ok_at {
        Err(std::io::ErrorKind::ConnectionReset.into())
    } else {
        Ok(number)
    }
}

#[jobguard::retry(attempts = 3, base = "10ms", jitter = none)]
async fn pending_first(ok_at: u32) -> Result<u32, std::io::Error> {
    pends_then(ok_at).await
}

#[tokio::test(start_paused = true)]
async fn a_pending_first_attempt_that_fails_is_retried_as_attempt_two() {
    SEEN.lock().unwrap().clear();
    assert_eq!(pending_first(2).await.unwrap(), 2);
    assert_eq!(pending_first(1).await.unwrap(), 1);
    assert_eq!(*SEEN.lock().unwrap(), [1, 2, 1]);
    let exhausted = pending_first(9).await.unwrap_err();
    assert_eq!(exhausted.kind(), std::io::ErrorKind::ConnectionReset);
    assert_eq!(*SEEN.lock().unwrap(), [1, 2, 1, 1, 2, 3]);
}

static ONE_FAILURE: CircuitBreaker = CircuitBreaker::new(1, Duration::from_secs(60));

#[jobguard::retry(attempts = 1, breaker = ONE_FAILURE)]
async fn pending_then_reset() -> Result<(), GatewayError> {
    tokio::task::yield_now().await;
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 1, breaker = ONE_FAILURE)]
async fn refused() -> Result<(), GatewayError> {
    unreachable!("an open breaker refuses the attempt before it is polled")
}

#[tokio::test(start_paused = true)]
async fn a_pending_first_attempt_counts_its_failure_against_the_breaker() {
    assert_eq!(ONE_FAILURE.state(), BreakerState::Closed);
    assert!(matches!(
        pending_then_reset().await,
        Err(GatewayError::Timeout)
    ));
    // The failure was booked in the epoch the first attempt was admitted in.
    assert_eq!(ONE_FAILURE.state(), BreakerState::Open);
    // The open breaker is left to the rounds: refused, and the body is never polled.
    assert!(matches!(
        refused().await,
        Err(GatewayError::Jobguard(jobguard::Error::CircuitOpen { .. }))
    ));
}

/// Asks for its attempt's start only after a pending poll.
#[jobguard::retry(attempts = 2, base = "10ms", jitter = none)]
async fn asks_late(wait: Duration) -> Result<tokio::time::Instant, std::io::Error> {
    tokio::time::sleep(wait).await;
    Ok(jobguard::attempt().expect("inside the call").started)
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_asked_after_a_pending_poll_started_at_its_first_poll() {
    let called = tokio::time::Instant::now();
    assert_eq!(asks_late(Duration::from_secs(5)).await.unwrap(), called);
}
