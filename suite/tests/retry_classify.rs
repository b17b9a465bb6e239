//! `on = all` retries every failure, of a type that need not be `Transient`; `on = path` asks a
//! custom classifier returning a `Verdict` or a `bool`.

use jobguard::{GiveUp, MemoryDeadLetters, Runtime, Verdict};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// An error that says nothing about retrying: no `Transient` impl.
#[derive(Debug, PartialEq)]
struct Opaque(u32);

impl std::fmt::Display for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "opaque failure {}", self.0)
    }
}

fn runtime() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

#[jobguard::retry(attempts = 4, base = "100ms", cap = "1s", jitter = none, on = all)]
async fn anything_goes(calls: &AtomicU32, fail_times: u32) -> Result<u32, Opaque> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= fail_times {
        return Err(Opaque(n));
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn on_all_retries_an_error_that_is_not_transient() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    assert_eq!(runtime.scope(anything_goes(&calls, 3)).await.unwrap(), 4);
    assert_eq!(start.elapsed(), Duration::from_millis(700));
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn on_all_exhausts_like_any_transient_failure() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    assert_eq!(
        runtime.scope(anything_goes(&calls, 99)).await.unwrap_err(),
        Opaque(4)
    );
    let letters = letters.letters();
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 4)
    );
    assert_eq!(letters[0].error, "opaque failure 4");
}

/// Odd codes are transient, `0` asks for exactly 5s, even codes are permanent.
fn by_code(error: &Opaque) -> Verdict {
    match error.0 {
        0 => Verdict::RetryAfter(Duration::from_secs(5)),
        n if n % 2 == 1 => Verdict::Retry,
        _ => Verdict::Fail,
    }
}

#[jobguard::retry(attempts = 5, base = "100ms", cap = "1s", jitter = none, on = by_code)]
async fn coded(calls: &AtomicU32, codes: &[u32]) -> Result<u32, Opaque> {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    match codes.get(n as usize) {
        Some(&code) => Err(Opaque(code)),
        None => Ok(n + 1),
    }
}

#[tokio::test(start_paused = true)]
async fn a_custom_classifier_decides_retry_retry_after_and_fail() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    // 1: curve 100ms; 0: exactly 5s; 3: curve 400ms; then success.
    assert_eq!(runtime.scope(coded(&calls, &[1, 0, 3])).await.unwrap(), 4);
    assert_eq!(start.elapsed(), Duration::from_millis(5500));
    assert!(letters.is_empty());

    let calls = AtomicU32::new(0);
    let start = Instant::now();
    assert_eq!(
        runtime.scope(coded(&calls, &[1, 2, 3])).await.unwrap_err(),
        Opaque(2)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    let letters = letters.letters();
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Permanent, 2)
    );
}

/// A classifier may answer with a `bool`: `true` retries on the curve.
fn is_odd(error: &Opaque) -> bool {
    error.0 % 2 == 1
}

#[jobguard::retry(attempts = 5, base = "100ms", cap = "1s", jitter = none, on = is_odd)]
async fn odd_only(calls: &AtomicU32, codes: &[u32]) -> Result<u32, Opaque> {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    match codes.get(n as usize) {
        Some(&code) => Err(Opaque(code)),
        None => Ok(n + 1),
    }
}

#[tokio::test(start_paused = true)]
async fn a_bool_classifier_retries_on_true_and_fails_on_false() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    assert_eq!(runtime.scope(odd_only(&calls, &[1, 3])).await.unwrap(), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(300));

    let calls = AtomicU32::new(0);
    assert_eq!(
        runtime.scope(odd_only(&calls, &[1, 4])).await.unwrap_err(),
        Opaque(4)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(letters.letters()[0].reason, GiveUp::Permanent);
}
