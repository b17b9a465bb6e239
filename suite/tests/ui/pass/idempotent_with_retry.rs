//! `#[idempotent]` with `#[retry]` in both orders, on free functions and on methods (`&self`,
//! keyed by a parameter and by a field of `self`): the retry loop runs inside the claim, and a
//! second call replays the stored result without running the body.

use jobguard::Transient;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout => f.write_str("gateway timeout"),
            GatewayError::Jobguard(e) => write!(f, "{e}"),
        }
    }
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

/// Times out on the first attempt of every run, then succeeds.
fn flaky(calls: &AtomicU32) -> Result<u64, GatewayError> {
    if calls.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
        Err(GatewayError::Timeout)
    } else {
        Ok(100)
    }
}

static OUTER: AtomicU32 = AtomicU32::new(0);
static INNER: AtomicU32 = AtomicU32::new(0);

#[jobguard::idempotent(key = order_id)]
#[jobguard::retry(attempts = 3, base = "1ms", jitter = none)]
async fn idempotent_first(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    flaky(&OUTER)
}

#[jobguard::retry(attempts = 3, base = "1ms", jitter = none)]
#[jobguard::idempotent(key = order_id)]
async fn retry_first(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    flaky(&INNER)
}

struct Gateway {
    merchant: String,
    calls: AtomicU32,
}

impl Gateway {
    #[jobguard::idempotent(key = format!("{}:{order_id}", self.merchant))]
    #[jobguard::retry(attempts = 3, base = "1ms", jitter = none)]
    async fn capture(&self, order_id: &str) -> Result<u64, GatewayError> {
        flaky(&self.calls)
    }

    #[jobguard::retry(attempts = 3, base = "1ms", jitter = none)]
    #[jobguard::idempotent(key = self.merchant, scope = "tests.ui.settle")]
    async fn settle(&self) -> Result<u64, GatewayError> {
        flaky(&self.calls)
    }
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    for _ in 0..2 {
        assert_eq!(idempotent_first("order-A").await.unwrap(), 100);
        assert_eq!(retry_first("order-A").await.unwrap(), 100);
    }
    // One run of two attempts each; the second call was a replay.
    assert_eq!(OUTER.load(Ordering::SeqCst), 2);
    assert_eq!(INNER.load(Ordering::SeqCst), 2);

    let gateway = Gateway {
        merchant: "acme".to_owned(),
        calls: AtomicU32::new(0),
    };
    for _ in 0..2 {
        assert_eq!(gateway.capture("order-A").await.unwrap(), 100);
        assert_eq!(gateway.settle().await.unwrap(), 100);
    }
    assert_eq!(gateway.calls.load(Ordering::SeqCst), 4);
}
