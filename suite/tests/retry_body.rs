//! `return` and `?` inside a `#[retry]` body end one attempt, not the whole call: an early
//! `return Err(..)` or a failed `?` is retried, and `?` converts through `From` as in any fn.

use jobguard::{MemoryDeadLetters, Runtime, Transient};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, PartialEq, Transient)]
enum JobError {
    #[transient]
    Busy,
    #[transient(from)]
    Io(IoKind),
}

/// `std::io::ErrorKind`, made comparable for the assertions.
#[derive(Debug, PartialEq)]
struct IoKind(std::io::ErrorKind);

impl Transient for IoKind {
    fn verdict(&self) -> jobguard::Verdict {
        std::io::Error::from(self.0).verdict()
    }
}

impl From<std::io::Error> for JobError {
    fn from(e: std::io::Error) -> Self {
        JobError::Io(IoKind(e.kind()))
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

fn read(n: u32, failing: &[u32], kind: std::io::ErrorKind) -> std::io::Result<u32> {
    if failing.contains(&n) {
        Err(kind.into())
    } else {
        Ok(n * 10)
    }
}

/// Attempt 1 returns early; attempt 2's `?` fails on a transient I/O error; attempt 3 succeeds.
#[jobguard::retry(attempts = 5, base = "100ms", cap = "1s", jitter = none)]
async fn job(calls: &AtomicU32, kind: std::io::ErrorKind) -> Result<u32, JobError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        return Err(JobError::Busy);
    }
    let value = read(n, &[2], kind)?;
    tokio::task::yield_now().await;
    Ok(value + 1)
}

fn runtime() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

#[tokio::test(start_paused = true)]
async fn an_early_return_and_a_failed_question_mark_each_end_one_attempt() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let got = runtime
        .scope(job(&calls, std::io::ErrorKind::ConnectionReset))
        .await;
    assert_eq!(got, Ok(31));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn question_mark_converts_through_from_and_a_permanent_cause_stops_the_loop() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    let got = runtime
        .scope(job(&calls, std::io::ErrorKind::PermissionDenied))
        .await;
    assert_eq!(
        got,
        Err(JobError::Io(IoKind(std::io::ErrorKind::PermissionDenied)))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(letters.letters()[0].reason, jobguard::GiveUp::Permanent);
}

/// `return Ok(..)` ends the call with that value on the attempt that returns it.
#[jobguard::retry(attempts = 3, base = "100ms", cap = "1s", jitter = none)]
async fn early_ok(calls: &AtomicU32) -> Result<&'static str, JobError> {
    if calls.fetch_add(1, Ordering::SeqCst) == 1 {
        return Ok("early");
    }
    Err(JobError::Busy)?;
    Ok("late")
}

#[tokio::test(start_paused = true)]
async fn an_early_return_ok_succeeds_on_that_attempt() {
    let (runtime, _) = runtime();
    let calls = AtomicU32::new(0);
    assert_eq!(runtime.scope(early_ok(&calls)).await, Ok("early"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
