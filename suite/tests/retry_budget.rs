//! `budget`: the loop never sleeps past it. It gives up at once with `GiveUp::Budget` when the
//! next attempt could not start inside it, and an attempt still running when it runs out is cut
//! with `jobguard::Error::Budget`.

use jobguard::{GiveUp, MemoryDeadLetters, Runtime, Transient};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, PartialEq, Transient)]
enum GatewayError {
    #[transient]
    Unavailable,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Unavailable => f.write_str("unavailable"),
            GatewayError::Jobguard(e) => write!(f, "{e}"),
        }
    }
}

fn runtime() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

/// Fails at once, every time.
#[jobguard::retry(attempts = 10, base = "400ms", cap = "8s", jitter = none, budget = "1s")]
async fn down(calls: &AtomicU32) -> Result<(), GatewayError> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(GatewayError::Unavailable)
}

#[tokio::test(start_paused = true)]
async fn gives_up_at_once_when_the_next_attempt_could_not_start_inside_the_budget() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime.scope(down(&calls)).await.unwrap_err();
    // Attempt 1 at 0ms, attempt 2 at 400ms; attempt 3 would start at 1200ms, past the budget:
    // the loop gives up at 400ms instead of sleeping 800ms first.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    // The caller gets the job's own last error.
    assert_eq!(err, GatewayError::Unavailable);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, GiveUp::Budget);
    assert_eq!(letters[0].attempts, 2);
    assert_eq!(letters[0].error, "unavailable");
}

/// Runs for `work` on every attempt, then fails.
#[jobguard::retry(attempts = 10, base = "100ms", cap = "8s", jitter = none, budget = "1s")]
async fn slow(calls: &AtomicU32, work: Duration) -> Result<(), GatewayError> {
    calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(work).await;
    Err(GatewayError::Unavailable)
}

#[tokio::test(start_paused = true)]
async fn an_attempt_running_at_the_end_of_the_budget_is_cut_with_error_budget() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime
        .scope(slow(&calls, Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert_eq!(err, GatewayError::Jobguard(jobguard::Error::Budget));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Budget, 1)
    );
    assert_eq!(letters[0].error, "retry budget spent");
}

#[tokio::test(start_paused = true)]
async fn a_later_attempt_is_cut_at_the_budget_measured_from_the_first() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    // 300ms + 100ms + 300ms + 200ms = 900ms, then attempt 3 starts with 100ms left.
    let err = runtime
        .scope(slow(&calls, Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(err, GatewayError::Jobguard(jobguard::Error::Budget));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(letters.letters()[0].reason, GiveUp::Budget);
}

/// Hangs on every attempt; `timeout` cuts each one, `budget` the whole.
#[jobguard::retry(attempts = 10, base = "100ms", cap = "8s", jitter = none, timeout = "2s", budget = "3s")]
async fn hangs(calls: &AtomicU32) -> Result<(), GatewayError> {
    calls.fetch_add(1, Ordering::SeqCst);
    std::future::pending().await
}

#[tokio::test(start_paused = true)]
async fn the_budget_cuts_sooner_than_the_timeout_when_it_ends_first() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime.scope(hangs(&calls)).await.unwrap_err();
    // Attempt 1 cut by the timeout at 2s, attempt 2 starts at 2.1s and is cut by the budget at 3s.
    assert_eq!(err, GatewayError::Jobguard(jobguard::Error::Budget));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert_eq!(letters.letters()[0].reason, GiveUp::Budget);
}

/// Asks for a `Retry-After` longer than what is left of the budget.
#[derive(Debug, Transient)]
enum Limited {
    #[transient(after = wait)]
    Wait { wait: Duration },
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for Limited {
    fn from(e: jobguard::Error) -> Self {
        Limited::Jobguard(e)
    }
}

impl std::fmt::Display for Limited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

#[jobguard::retry(attempts = 10, base = "100ms", cap = "8s", jitter = none, budget = "5s")]
async fn rate_limited(calls: &AtomicU32) -> Result<(), Limited> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(Limited::Wait {
        wait: Duration::from_secs(60),
    })
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_the_budget_gives_up_without_sleeping() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = runtime.scope(rate_limited(&calls)).await.unwrap_err();
    assert!(matches!(err, Limited::Wait { .. }));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(letters.letters()[0].reason, GiveUp::Budget);
}
