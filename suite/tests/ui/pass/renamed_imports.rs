//! Both attributes imported under other names. `#[retry]` written above `#[idempotent]` expands
//! first and wraps the function before `#[idempotent]` does, so the retry loop runs inside the
//! claim: each attempt sees its own number, and a second call replays the result.
//! (Written the other way round, it is a compile error: see `tests/ui/fail`.)

use jobguard::idempotent as once;
use jobguard::retry as with_retry;
use std::sync::atomic::{AtomicU32, Ordering};

static CALLS: AtomicU32 = AtomicU32::new(0);

#[with_retry(attempts = 3, base = "1ms", jitter = none, on = all)]
#[once(key = order_id)]
async fn charge(order_id: &str) -> Result<u32, jobguard::Error> {
    let _ = order_id;
    CALLS.fetch_add(1, Ordering::SeqCst);
    let number = jobguard::attempt().map(|a| a.number).unwrap_or(0);
    if number < 2 {
        return Err(jobguard::Error::Timeout);
    }
    Ok(number)
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    assert_eq!(charge("order-A").await.unwrap(), 2);
    assert_eq!(charge("order-A").await.unwrap(), 2);
    assert_eq!(CALLS.load(Ordering::SeqCst), 2);
}
