//! The future of a `#[retry]` fn is `Send` whenever its body's is: it can go to `tokio::spawn`.

use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
struct JobError;

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("job error")
    }
}

impl From<jobguard::Error> for JobError {
    fn from(_: jobguard::Error) -> Self {
        JobError
    }
}

fn assert_send<T: Send>(_: &T) {}

static GATEWAY: jobguard::CircuitBreaker = jobguard::CircuitBreaker::new(5, Duration::from_secs(1));

#[jobguard::retry(attempts = 3, base = "1ms", on = all)]
async fn charge(order_id: String, amount: u64) -> Result<String, JobError> {
    tokio::task::yield_now().await;
    Ok(format!("{order_id}:{amount}"))
}

#[jobguard::retry(attempts = 3, base = "1ms", on = all, timeout = "1s", breaker = GATEWAY)]
async fn guarded(state: Arc<str>) -> Result<usize, JobError> {
    tokio::task::yield_now().await;
    Ok(state.len())
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let plain = charge("order-A".to_owned(), 100);
    assert_send(&plain);
    let guarded_call = guarded(Arc::from("abc"));
    assert_send(&guarded_call);
    let a = tokio::spawn(plain);
    let b = tokio::spawn(guarded_call);
    assert_eq!(a.await.unwrap().unwrap(), "order-A:100");
    assert_eq!(b.await.unwrap().unwrap(), 3);
}
