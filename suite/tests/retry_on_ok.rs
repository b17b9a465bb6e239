//! `#[retry(on_ok = path)]` and `Policy::run_if_ok`: an `Ok` value the classifier flags is
//! retried like a transient failure (after its `Retry-After` when it gives one); when the
//! attempts run out, the last `Ok` is returned and one dead letter says `exhausted`.

use jobguard::{GiveUp, Jitter, MemoryDeadLetters, Policy, Runtime, Verdict};
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Response {
    status: u16,
    retry_after: Option<Duration>,
}

/// A `503` (or `429`) inside `Ok` retries, after its `Retry-After` when it has one.
fn unavailable(response: &Response) -> Verdict {
    match (response.status, response.retry_after) {
        (503 | 429, Some(after)) => Verdict::RetryAfter(after),
        (503 | 429, None) => Verdict::Retry,
        _ => Verdict::Fail,
    }
}

fn is_503(response: &Response) -> bool {
    response.status == 503
}

/// Answers `503` until it has been called `busy + 1` times, then `200`.
fn answer(calls: &AtomicU32, busy: u32, retry_after: Option<Duration>) -> Response {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    if n < busy {
        Response {
            status: 503,
            retry_after,
        }
    } else {
        Response {
            status: 200,
            retry_after: None,
        }
    }
}

#[jobguard::retry(attempts = 4, base = "100ms", cap = "1s", jitter = none, on_ok = unavailable)]
async fn fetch(calls: &AtomicU32, busy: u32) -> Result<Response, io::Error> {
    Ok(answer(calls, busy, None))
}

#[jobguard::retry(attempts = 4, base = "100ms", jitter = none, on_ok = unavailable)]
async fn fetch_after(calls: &AtomicU32, busy: u32) -> Result<Response, io::Error> {
    Ok(answer(calls, busy, Some(Duration::from_secs(3))))
}

#[jobguard::retry(attempts = 3, base = "100ms", cap = "1s", jitter = none, on_ok = is_503, name = "http.fetch")]
async fn fetch_bool(calls: &AtomicU32, busy: u32) -> Result<Response, io::Error> {
    Ok(answer(calls, busy, None))
}

fn runtime() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

#[tokio::test(start_paused = true)]
async fn a_flagged_value_is_retried_on_the_curve() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let got = runtime.scope(fetch(&calls, 2)).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(100 + 200));
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn retry_after_in_the_value_is_honoured() {
    let (runtime, _letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let got = runtime.scope(fetch_after(&calls, 1)).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn exhausted_on_a_value_returns_the_last_value_and_one_exhausted_letter() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let got = runtime.scope(fetch(&calls, 10)).await.unwrap();
    assert_eq!(got.status, 503);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 4)
    );
    assert_eq!(letters[0].job, concat!(module_path!(), "::fetch"));
}

#[tokio::test(start_paused = true)]
async fn a_bool_classifier_retries_on_true_and_name_pins_the_job() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    assert_eq!(
        runtime.scope(fetch_bool(&calls, 1)).await.unwrap().status,
        200
    );
    let calls = AtomicU32::new(0);
    assert_eq!(
        runtime.scope(fetch_bool(&calls, 5)).await.unwrap().status,
        503
    );
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].job, "http.fetch");
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
}

#[tokio::test(start_paused = true)]
async fn policy_run_if_ok_retries_values_of_a_closure() {
    let (runtime, letters) = runtime();
    let policy = Policy::new()
        .attempts(3)
        .base(Duration::from_millis(100))
        .jitter(Jitter::None);
    let calls = AtomicU32::new(0);
    let got = runtime
        .scope(policy.run_if_ok(
            "poll",
            async |_| Ok::<_, io::Error>(answer(&calls, 1, None)),
            |r: &Response| r.status == 503,
        ))
        .await
        .unwrap();
    assert_eq!(got.status, 200);
    let calls = AtomicU32::new(0);
    let got = runtime
        .scope(policy.run_if_ok(
            "poll",
            async |_| Ok::<_, io::Error>(answer(&calls, 9, None)),
            unavailable,
        ))
        .await
        .unwrap();
    assert_eq!(got.status, 503);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (
            letters[0].job.as_str(),
            letters[0].reason,
            letters[0].attempts
        ),
        ("poll", GiveUp::Exhausted, 3)
    );
}
