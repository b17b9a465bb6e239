//! A permanent failure fails fast: one attempt, no delay, one `GiveUp::Permanent` dead letter,
//! and the error returned to the caller.

use jobguard::{Event, GiveUp, MemoryDeadLetters, Runtime, Transient};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, PartialEq, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    Declined,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = none)]
async fn charge(calls: &AtomicU32, errors: &[GatewayError]) -> Result<(), GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) as usize;
    match errors.get(n) {
        Some(GatewayError::Timeout) => Err(GatewayError::Timeout),
        Some(GatewayError::Declined) => Err(GatewayError::Declined),
        None => Ok(()),
    }
}

fn runtime() -> (Runtime, MemoryDeadLetters, Arc<Mutex<u32>>) {
    let letters = MemoryDeadLetters::new();
    let retries = Arc::new(Mutex::new(0));
    let seen = retries.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |e: &Event<'_>| {
            if matches!(e, Event::Retry { .. }) {
                *seen.lock().unwrap() += 1;
            }
        })
        .build();
    (runtime, letters, retries)
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_fails_after_one_attempt_without_waiting() {
    let (runtime, letters, retries) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime
        .scope(charge(&calls, &[GatewayError::Declined]))
        .await
        .unwrap_err();
    assert_eq!(err, GatewayError::Declined);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(*retries.lock().unwrap(), 0);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, GiveUp::Permanent);
    assert_eq!(letters[0].attempts, 1);
    assert_eq!(letters[0].error, "Declined");
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_after_transient_ones_stops_the_loop_there() {
    let (runtime, letters, retries) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let errors = [
        GatewayError::Timeout,
        GatewayError::Declined,
        GatewayError::Timeout,
    ];
    let err = runtime.scope(charge(&calls, &errors)).await.unwrap_err();
    assert_eq!(err, GatewayError::Declined);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(*retries.lock().unwrap(), 1);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Permanent, 2)
    );
}
