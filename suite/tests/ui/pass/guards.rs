//! `timeout`, `budget`, `breaker` and `dead_letter` with an error that has
//! `From<jobguard::Error>`, and durations given as expressions: a `Duration` call, a `const`;
//! `retry_budget` alone with an error that has no `From<jobguard::Error>`.

use jobguard::{CircuitBreaker, MemoryDeadLetters, RetryBudget, Transient};
use std::sync::LazyLock;
use std::time::Duration;

#[derive(Debug, Transient)]
enum JobError {
    #[transient]
    Busy,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Busy => f.write_str("busy"),
            JobError::Jobguard(e) => write!(f, "{e}"),
        }
    }
}

impl From<jobguard::Error> for JobError {
    fn from(e: jobguard::Error) -> Self {
        JobError::Jobguard(e)
    }
}

const BASE: Duration = Duration::from_millis(10);
static GATEWAY: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(30));
static LETTERS: LazyLock<MemoryDeadLetters> = LazyLock::new(MemoryDeadLetters::new);

#[jobguard::retry(attempts = 2, base = Duration::from_millis(10), cap = "1s", timeout = "50ms")]
async fn slow() -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

#[jobguard::retry(attempts = 10, base = BASE, budget = "100ms", jitter = equal)]
async fn busy() -> Result<(), JobError> {
    Err(JobError::Busy)
}

#[jobguard::retry(attempts = 2, base = BASE, cap = BASE, breaker = GATEWAY, dead_letter = *LETTERS, jitter = decorrelated)]
async fn guarded(fail: bool) -> Result<u32, JobError> {
    if fail { Err(JobError::Busy) } else { Ok(1) }
}

static RETRIES: RetryBudget = RetryBudget::new(0.0, 0, Duration::from_secs(10));

#[jobguard::retry(attempts = 3, base = BASE, retry_budget = RETRIES)]
async fn unbudgeted() -> std::io::Result<u32> {
    Err(std::io::ErrorKind::ConnectionReset.into())
}

#[jobguard::retry(attempts = 2, timeout = "1s", budget = "10s", jitter = full)]
async fn io_timeout() -> std::io::Result<u32> {
    Ok(2)
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    assert!(matches!(
        slow().await,
        Err(JobError::Jobguard(jobguard::Error::Timeout))
    ));
    assert!(busy().await.is_err());
    assert_eq!(guarded(false).await.unwrap(), 1);
    assert!(guarded(true).await.is_err());
    assert_eq!(LETTERS.letters().len(), 1);
    assert_eq!(io_timeout().await.unwrap(), 2);
    // An empty budget: the first attempt runs, and no retry follows.
    assert!(unbudgeted().await.is_err());
}
