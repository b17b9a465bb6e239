//! `#[retry(breaker = ...)]` under a paused clock: the breaker is asked before every attempt,
//! only transient failures count, and an open breaker ends the call with `Error::CircuitOpen`
//! and a `GiveUp::CircuitOpen` dead letter: at once when it is open for longer than the next
//! attempt would wait, else after the wait, when the half-open breaker lets the attempt probe.

use jobguard::{BreakerState, CircuitBreaker, DeadLetter, GiveUp, MemoryDeadLetters, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

fn with_letters() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

const COOLDOWN: Duration = Duration::from_secs(30);

/// Fails with `error` every time, through `breaker`.
#[jobguard::retry(attempts = 5, base = "100ms", cap = "1s", jitter = none, breaker = breaker)]
async fn always(
    breaker: &CircuitBreaker,
    calls: &AtomicU32,
    error: fn() -> GatewayError,
) -> Result<(), GatewayError> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(error())
}

#[tokio::test(start_paused = true)]
async fn a_breaker_that_opens_mid_loop_stops_the_loop() {
    let letters = MemoryDeadLetters::new();
    let retries = std::sync::Arc::new(AtomicU32::new(0));
    let counted = retries.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |e: &jobguard::Event<'_>| {
            if matches!(e, jobguard::Event::Retry { .. }) {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        })
        .build();
    let breaker = CircuitBreaker::new(2, COOLDOWN);
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime
        .scope(always(&breaker, &calls, || GatewayError::Timeout))
        .await
        .unwrap_err();
    // Attempt 1 at 0ms fails, attempt 2 at 100ms fails and opens the breaker for 30s, longer
    // than the 200ms the next attempt would wait: the call is refused at once, as that attempt
    // would be, with no retry announced and no sleep; the loop stops with 3 attempts unused.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let retry_in = COOLDOWN;
    assert!(
        matches!(err, GatewayError::Jobguard(jobguard::Error::CircuitOpen { retry_in: r }) if r == retry_in),
        "{err:?}"
    );
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100),
        "no wait for a refusal known in advance"
    );
    assert_eq!(
        retries.load(Ordering::SeqCst),
        1,
        "after attempt 1 only: no retry is announced that the breaker would refuse"
    );
    assert_eq!(breaker.state(), BreakerState::Open);
    let letters: Vec<DeadLetter> = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, GiveUp::CircuitOpen);
    assert_eq!(letters[0].attempts, 2);
    assert_eq!(
        letters[0].error,
        jobguard::Error::CircuitOpen { retry_in }.to_string()
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_fails_the_call_at_once_and_dead_letters_it() {
    let (runtime, letters) = with_letters();
    let breaker = CircuitBreaker::new(5, COOLDOWN);
    breaker.trip();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime
        .scope(always(&breaker, &calls, || GatewayError::Timeout))
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the body never runs");
    assert!(
        matches!(err, GatewayError::Jobguard(jobguard::Error::CircuitOpen { retry_in }) if retry_in == COOLDOWN),
        "{err:?}"
    );
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "CircuitOpen is never retried by the loop"
    );
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, GiveUp::CircuitOpen);
    assert_eq!(letters[0].attempts, 0);
    assert!(letters[0].job.ends_with("::always"), "{}", letters[0].job);
}

#[tokio::test(start_paused = true)]
async fn permanent_errors_never_trip_it() {
    let (runtime, letters) = with_letters();
    let consecutive = CircuitBreaker::new(1, COOLDOWN);
    let rate = CircuitBreaker::failure_rate(0.5, 4, COOLDOWN).min_calls(1);
    let calls = AtomicU32::new(0);
    for breaker in [&consecutive, &rate] {
        for _ in 0..10 {
            let err = runtime
                .scope(always(breaker, &calls, || GatewayError::Declined))
                .await
                .unwrap_err();
            assert!(matches!(err, GatewayError::Declined), "{err:?}");
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        20,
        "one attempt per call: permanent"
    );
    assert!(
        letters
            .letters()
            .iter()
            .all(|l| l.reason == GiveUp::Permanent)
    );
    // A transient failure still trips both: they were only spared, not disabled.
    runtime
        .scope(always(&consecutive, &calls, || GatewayError::Timeout))
        .await
        .unwrap_err();
    runtime
        .scope(always(&rate, &calls, || GatewayError::Timeout))
        .await
        .unwrap_err();
    assert_eq!(consecutive.state(), BreakerState::Open);
    assert_eq!(rate.state(), BreakerState::Open);
}

#[jobguard::retry(attempts = 3, base = "100ms", jitter = none, timeout = "1s", breaker = breaker)]
async fn hangs(breaker: &CircuitBreaker, calls: &AtomicU32) -> Result<(), GatewayError> {
    calls.fetch_add(1, Ordering::SeqCst);
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_counts_as_a_transient_failure() {
    let (runtime, letters) = with_letters();
    let breaker = CircuitBreaker::new(2, COOLDOWN);
    let calls = AtomicU32::new(0);
    let err = runtime.scope(hangs(&breaker, &calls)).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(
        matches!(
            err,
            GatewayError::Jobguard(jobguard::Error::CircuitOpen { .. })
        ),
        "{err:?}"
    );
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(letters.letters()[0].reason, GiveUp::CircuitOpen);
}

#[jobguard::retry(attempts = 5, base = "100ms", jitter = none, breaker = breaker)]
async fn recovers_after(
    breaker: &CircuitBreaker,
    calls: &AtomicU32,
    failures: u32,
) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= failures {
        return Err(GatewayError::Timeout);
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn a_success_inside_the_loop_resets_the_count() {
    let (runtime, letters) = with_letters();
    let breaker = CircuitBreaker::new(3, COOLDOWN);
    let calls = AtomicU32::new(0);
    assert_eq!(
        runtime
            .scope(recovers_after(&breaker, &calls, 2))
            .await
            .unwrap(),
        3
    );
    calls.store(0, Ordering::SeqCst);
    assert_eq!(
        runtime
            .scope(recovers_after(&breaker, &calls, 2))
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        breaker.state(),
        BreakerState::Closed,
        "2 + 2 failures, never 3 in a row"
    );
    assert!(letters.is_empty());
}

/// Fails with a `Retry-After` of `wait` while `calls` is below `failures`.
#[jobguard::retry(attempts = 3, base = "100ms", jitter = none, on = after, breaker = breaker)]
async fn rate_limited(
    breaker: &CircuitBreaker,
    calls: &AtomicU32,
    failures: u32,
) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= failures {
        return Err(GatewayError::Timeout);
    }
    Ok(n)
}

/// Every failure asks to be retried 2s later: longer than the 1s cooldown below.
fn after(_: &GatewayError) -> jobguard::Verdict {
    jobguard::Verdict::RetryAfter(Duration::from_secs(2))
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_the_cooldown_is_kept_and_the_next_attempt_probes() {
    let (runtime, letters) = with_letters();
    let breaker = CircuitBreaker::new(1, Duration::from_secs(1));
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let n = runtime
        .scope(rate_limited(&breaker, &calls, 1))
        .await
        .expect("the breaker is half-open when the wait ends: attempt 2 probes and succeeds");
    assert_eq!(n, 2);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "the Retry-After wait"
    );
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert!(letters.is_empty());
}
