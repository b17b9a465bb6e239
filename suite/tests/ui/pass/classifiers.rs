//! `on`: the default and explicit `transient` (derived with `after` and `from`), `all`, a
//! classifier returning `Verdict` and one returning `bool`.

use jobguard::{Transient, Verdict};
use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(after = wait)]
    Limited {
        wait: Duration,
    },
    #[transient(after = 0)]
    MaybeLimited(Option<Duration>),
    #[transient(from)]
    Io(std::io::Error),
    Declined,
}

impl Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// An error type with no `Transient` impl: fine under `all` or a classifier.
#[derive(Debug)]
struct Opaque(u16);

impl Display for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status {}", self.0)
    }
}

fn by_status(error: &Opaque) -> Verdict {
    jobguard::http_verdict(error.0, None)
}

fn is_retryable(error: &Opaque) -> bool {
    error.0 >= 500
}

mod classify {
    pub fn never(_: &super::Opaque) -> bool {
        false
    }
}

static LIMITED: AtomicU32 = AtomicU32::new(0);

#[jobguard::retry(attempts = 3, base = "1ms")]
async fn default_on() -> Result<(), GatewayError> {
    if LIMITED.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(GatewayError::Limited {
            wait: Duration::from_millis(5),
        });
    }
    Ok(())
}

#[jobguard::retry(attempts = 2, base = "1ms", on = transient)]
async fn explicit_transient(error: fn() -> GatewayError) -> Result<(), GatewayError> {
    Err(error())
}

#[jobguard::retry(attempts = 3, base = "1ms", on = all)]
async fn all(calls: &AtomicU32) -> Result<u32, Opaque> {
    match calls.fetch_add(1, Ordering::SeqCst) {
        0 => Err(Opaque(404)),
        n => Ok(n),
    }
}

#[jobguard::retry(attempts = 3, base = "1ms", on = by_status)]
async fn verdict(calls: &AtomicU32, status: u16) -> Result<(), Opaque> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(Opaque(status))
}

#[jobguard::retry(attempts = 3, base = "1ms", on = is_retryable)]
async fn boolean(calls: &AtomicU32, status: u16) -> Result<(), Opaque> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(Opaque(status))
}

#[jobguard::retry(attempts = 3, base = "1ms", on = classify::never)]
async fn by_path(calls: &AtomicU32) -> Result<(), Opaque> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(Opaque(503))
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    default_on().await.unwrap();
    assert_eq!(LIMITED.load(Ordering::SeqCst), 2);
    assert!(matches!(
        explicit_transient(|| GatewayError::Declined).await,
        Err(GatewayError::Declined)
    ));
    assert!(
        explicit_transient(|| GatewayError::MaybeLimited(None))
            .await
            .is_err()
    );
    assert!(explicit_transient(|| GatewayError::Timeout).await.is_err());
    assert!(
        explicit_transient(|| GatewayError::Io(std::io::ErrorKind::NotFound.into()))
            .await
            .is_err()
    );

    let calls = AtomicU32::new(0);
    assert_eq!(all(&calls).await.unwrap(), 1);

    let calls = AtomicU32::new(0);
    assert!(verdict(&calls, 503).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 3, "503 retries");
    let calls = AtomicU32::new(0);
    assert!(verdict(&calls, 404).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "404 is permanent");

    let calls = AtomicU32::new(0);
    assert!(boolean(&calls, 500).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let calls = AtomicU32::new(0);
    assert!(boolean(&calls, 400).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let calls = AtomicU32::new(0);
    assert!(by_path(&calls).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
