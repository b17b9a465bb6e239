//! `timeout` cuts one attempt, which fails with `jobguard::Error::Timeout` and is retried.

use jobguard::{Event, GiveUp, MemoryDeadLetters, Runtime, Verdict};
use jobguard_testkit::gateway::GatewayError;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Every `(attempt, delay, error)` the observer saw retried.
type Retries = Arc<Mutex<Vec<(u32, Duration, String)>>>;

fn runtime() -> (Runtime, MemoryDeadLetters, Retries) {
    let letters = MemoryDeadLetters::new();
    let retries = Retries::default();
    let seen = retries.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |e: &Event<'_>| {
            if let Event::Retry {
                attempt,
                delay,
                error,
                ..
            } = e
            {
                seen.lock()
                    .unwrap()
                    .push((*attempt, *delay, error.to_string()));
            }
        })
        .build();
    (runtime, letters, retries)
}

/// Hangs for `hang` on the first `slow` attempts, then answers at once.
#[jobguard::retry(attempts = 3, base = "100ms", cap = "1s", jitter = none, timeout = "2s")]
async fn fetch(calls: &AtomicU32, slow: u32, hang: Duration) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= slow {
        tokio::time::sleep(hang).await;
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn a_hung_attempt_is_cut_at_the_timeout_and_retried() {
    let (runtime, letters, retries) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let got = runtime
        .scope(fetch(&calls, 1, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(got, 2);
    // Cut at 2s, then the curve's 100ms.
    assert_eq!(start.elapsed(), Duration::from_millis(2100));
    assert_eq!(
        *retries.lock().unwrap(),
        [(
            1,
            Duration::from_millis(100),
            "attempt timed out".to_owned()
        )]
    );
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_attempt_that_finishes_inside_the_timeout_is_not_cut() {
    let (runtime, _, retries) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let got = runtime
        .scope(fetch(&calls, 1, Duration::from_millis(1999)))
        .await
        .unwrap();
    assert_eq!(got, 1);
    assert_eq!(start.elapsed(), Duration::from_millis(1999));
    assert!(retries.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn every_attempt_timing_out_exhausts_with_error_timeout() {
    let (runtime, letters, retries) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime
        .scope(fetch(&calls, 99, Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert_eq!(err, GatewayError::Jobguard(jobguard::Error::Timeout));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // 2s + 100ms + 2s + 200ms + 2s.
    assert_eq!(start.elapsed(), Duration::from_millis(6300));
    assert_eq!(retries.lock().unwrap().len(), 2);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 3)
    );
    assert_eq!(letters[0].error, "attempt timed out");
}

/// Says every failure is permanent, its own `Timeout` included.
fn never(_: &GatewayError) -> Verdict {
    Verdict::Fail
}

#[jobguard::retry(attempts = 2, base = "100ms", cap = "1s", jitter = none, timeout = "1s", on = never)]
async fn fetch_never_retried(calls: &AtomicU32) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        std::future::pending::<()>().await;
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn a_cut_attempt_is_retried_even_when_the_classifier_would_fail_it() {
    let (runtime, _, retries) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    assert_eq!(runtime.scope(fetch_never_retried(&calls)).await.unwrap(), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(1100));
    assert_eq!(retries.lock().unwrap().len(), 1);
}
