//! `#[retry]` under a paused clock: the exact delays of a recovery and of an exhaustion, the one
//! dead letter an exhaustion sends, and `Verdict::RetryAfter(d)` waiting exactly `d`.

use jobguard::{
    DeadLetter, Event, GiveUp, MemoryDeadLetters, Runtime, Transient, Verdict, http_verdict,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(after = wait)]
    Limited { wait: Duration },
    #[transient(after = wait)]
    MaybeLimited { wait: Option<Duration> },
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout => f.write_str("gateway timeout"),
            GatewayError::Limited { wait } => write!(f, "rate limited for {wait:?}"),
            GatewayError::MaybeLimited { wait } => write!(f, "rate limited for {wait:?}"),
        }
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

fn ms(delays: &Mutex<Vec<Duration>>) -> Vec<u128> {
    delays
        .lock()
        .unwrap()
        .iter()
        .map(Duration::as_millis)
        .collect()
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
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(ms(&delays), [500, 1000]);
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_success_runs_once_and_never_sleeps() {
    let (runtime, delays, letters) = recording();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    assert_eq!(runtime.scope(flaky(&calls, 0)).await.unwrap(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(delays.lock().unwrap().is_empty());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn exhausts_after_five_attempts_and_sends_one_complete_dead_letter() {
    let (runtime, delays, letters) = recording();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let wall_before = SystemTime::now();
    let err = runtime.scope(flaky(&calls, 99)).await.unwrap_err();
    let wall_after = SystemTime::now();

    // The caller still gets the last error.
    assert!(matches!(err, GatewayError::Timeout));
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(ms(&delays), [500, 1000, 2000, 4000]);
    assert_eq!(start.elapsed(), Duration::from_millis(7500));

    let letters: Vec<DeadLetter> = letters.letters();
    assert_eq!(letters.len(), 1, "exactly one dead letter per give-up");
    let letter = &letters[0];
    assert_eq!(letter.job, concat!(module_path!(), "::flaky"));
    assert_eq!(letter.key, None, "a job without #[idempotent] has no key");
    assert_eq!(letter.reason, GiveUp::Exhausted);
    assert_eq!(letter.attempts, 5);
    assert_eq!(letter.error, "gateway timeout");
    // Wall-clock times (the paused clock is tokio's, not the system's).
    assert!(wall_before <= letter.first_attempt, "{letter:?}");
    assert!(letter.first_attempt <= letter.last_attempt, "{letter:?}");
    assert!(letter.last_attempt <= wall_after, "{letter:?}");
    // The error history, when recorded, is the last errors, each this job's.
    assert!(letter.history.len() <= DeadLetter::HISTORY);
    assert!(
        letter.history.iter().all(|e| e == "gateway timeout"),
        "{letter:?}"
    );
    assert_eq!(letter.payload, None);
}

#[jobguard::retry(attempts = 3, base = "500ms", cap = "8s", jitter = full)]
async fn limited_then_ok(calls: &AtomicU32, wait: Duration) -> Result<u32, GatewayError> {
    match calls.fetch_add(1, Ordering::SeqCst) {
        0 => Err(GatewayError::Limited { wait }),
        1 => Err(GatewayError::MaybeLimited {
            wait: Some(wait * 2),
        }),
        n => Ok(n + 1),
    }
}

#[tokio::test(start_paused = true)]
async fn transient_after_field_waits_exactly_that_long_whatever_the_jitter() {
    let (runtime, delays, letters) = recording();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let wait = Duration::from_millis(3_210);
    let got = runtime.scope(limited_then_ok(&calls, wait)).await.unwrap();
    assert_eq!(got, 3);
    // Exactly the field's value, not the curve and not jittered, although `jitter = full`.
    assert_eq!(*delays.lock().unwrap(), [wait, wait * 2]);
    assert_eq!(start.elapsed(), wait * 3);
    assert!(letters.is_empty());
}

#[jobguard::retry(attempts = 2, base = "500ms", cap = "8s", jitter = none)]
async fn maybe_limited_without_a_wait(calls: &AtomicU32) -> Result<u32, GatewayError> {
    match calls.fetch_add(1, Ordering::SeqCst) {
        0 => Err(GatewayError::MaybeLimited { wait: None }),
        n => Ok(n + 1),
    }
}

#[tokio::test(start_paused = true)]
async fn an_after_field_holding_none_falls_back_to_the_curve() {
    let (runtime, delays, _) = recording();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    assert_eq!(
        runtime
            .scope(maybe_limited_without_a_wait(&calls))
            .await
            .unwrap(),
        2
    );
    assert_eq!(ms(&delays), [500]);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}

/// An HTTP failure: classified by [`http_verdict`], which reads `Retry-After`.
#[derive(Debug)]
struct HttpError {
    status: u16,
    retry_after: Option<&'static str>,
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}", self.status)
    }
}

impl Transient for HttpError {
    fn verdict(&self) -> Verdict {
        http_verdict(self.status, self.retry_after)
    }
}

#[jobguard::retry(attempts = 4, base = "500ms", cap = "8s", jitter = none)]
async fn http_call(responses: &Mutex<Vec<HttpError>>) -> Result<&'static str, HttpError> {
    let mut left = responses.lock().unwrap();
    if left.is_empty() {
        Ok("200 OK")
    } else {
        Err(left.remove(0))
    }
}

#[tokio::test(start_paused = true)]
async fn http_retry_after_seconds_are_waited_exactly_and_a_malformed_one_uses_the_curve() {
    let (runtime, delays, letters) = recording();
    let responses = Mutex::new(vec![
        HttpError {
            status: 503,
            retry_after: Some("7"),
        },
        HttpError {
            status: 429,
            retry_after: Some("soon"),
        }, // malformed: the curve's 1s
        HttpError {
            status: 429,
            retry_after: Some("2"),
        },
    ]);
    let start = Instant::now();
    assert_eq!(
        runtime.scope(http_call(&responses)).await.unwrap(),
        "200 OK"
    );
    assert_eq!(ms(&delays), [7000, 1000, 2000]);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_http_status_that_is_not_retryable_fails_fast() {
    let (runtime, delays, letters) = recording();
    let responses = Mutex::new(vec![HttpError {
        status: 404,
        retry_after: Some("7"),
    }]);
    let start = Instant::now();
    let err = runtime.scope(http_call(&responses)).await.unwrap_err();
    assert_eq!(err.status, 404);
    assert!(delays.lock().unwrap().is_empty());
    assert_eq!(start.elapsed(), Duration::ZERO);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Permanent, 1)
    );
    assert_eq!(letters[0].error, "HTTP 404");
}
