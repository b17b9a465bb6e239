//! `#[retry]` under a paused clock: the exact delays, what is retried and what is not.

use jobguard::{DeadLetter, Event, GiveUp, MemoryDeadLetters, Runtime, Transient};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(after = wait)]
    Limited { wait: Duration },
    Declined,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// A runtime that records every retry delay and keeps dead letters.
fn recording() -> (Runtime, Arc<Mutex<Vec<Duration>>>, MemoryDeadLetters) {
    let delays = Arc::new(Mutex::new(Vec::new()));
    let letters = MemoryDeadLetters::new();
    let seen = delays.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |e: &Event<'_>| {
            if let Event::Retry { delay, .. } = e {
                seen.lock().unwrap().push(*delay);
            }
        })
        .build();
    (runtime, delays, letters)
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = none)]
async fn flaky(calls: &AtomicU32, fail_times: u32) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= fail_times {
        return Err(GatewayError::Timeout);
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn recovers_on_the_third_attempt_after_half_a_second_then_one() {
    let (runtime, delays, letters) = recording();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let got = runtime.scope(flaky(&calls, 2)).await.unwrap();
    assert_eq!(got, 3);
    assert_eq!(*delays.lock().unwrap(), [Duration::from_millis(500), Duration::from_secs(1)]);
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn exhausts_after_five_attempts_and_dead_letters_once() {
    let (runtime, delays, letters) = recording();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime.scope(flaky(&calls, 99)).await.unwrap_err();
    assert!(matches!(err, GatewayError::Timeout));
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    let ms: Vec<u128> = delays.lock().unwrap().iter().map(Duration::as_millis).collect();
    assert_eq!(ms, [500, 1000, 2000, 4000]);
    assert_eq!(start.elapsed(), Duration::from_millis(7500));
    let letters: Vec<DeadLetter> = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
    assert_eq!(letters[0].attempts, 5);
    assert_eq!(letters[0].error, "Timeout");
    assert!(letters[0].job.ends_with("::flaky"), "{}", letters[0].job);
    assert!(letters[0].first_attempt <= letters[0].last_attempt);
}
