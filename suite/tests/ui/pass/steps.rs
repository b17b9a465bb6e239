//! `#[step]` on free functions, methods and generic functions, with a pinned name or the
//! function's, with `#[retry]` in both orders, and `jobguard::step` without the macro; inside an
//! `#[idempotent]` job a second run replays every step.

use jobguard::Transient;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Transient)]
enum ShopError {
    #[transient]
    Timeout,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<jobguard::Error> for ShopError {
    fn from(e: jobguard::Error) -> Self {
        ShopError::Jobguard(e)
    }
}

static RUNS: AtomicU32 = AtomicU32::new(0);

#[derive(serde::Serialize, serde::Deserialize)]
struct Payment {
    id: String,
}

#[jobguard::step(name = "capture.v1")]
async fn capture(order_id: &str) -> Result<Payment, ShopError> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(Payment {
        id: format!("pay-{order_id}"),
    })
}

#[jobguard::step]
#[jobguard::retry(attempts = 2, base = "1ms", cap = "1ms")]
async fn reserve(sku: &str) -> Result<u32, ShopError> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    let _ = sku;
    Ok(1)
}

#[jobguard::retry(attempts = 2, base = "1ms", cap = "1ms")]
#[jobguard::step(name = "ship.v2")]
async fn ship<T: AsRef<str>>(to: T) -> Result<(), ShopError> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    let _ = to.as_ref();
    Ok(())
}

struct Mailer {
    from: String,
}

impl Mailer {
    #[jobguard::step]
    async fn receipt(&self, payment: &Payment) -> Result<String, ShopError> {
        RUNS.fetch_add(1, Ordering::Relaxed);
        if payment.id.is_empty() {
            return Err(ShopError::Timeout);
        }
        Ok(format!("{} -> {}", self.from, payment.id))
    }
}

#[jobguard::idempotent(key = order_id)]
async fn checkout(mailer: &Mailer, order_id: &str, fail: bool) -> Result<String, ShopError> {
    let payment = capture(order_id).await?;
    reserve("sku-1").await?;
    ship("home").await?;
    let note = jobguard::step("note", async { Ok::<_, ShopError>(7u8) }).await?;
    let sent = mailer.receipt(&payment).await?;
    if fail {
        return Err(ShopError::Timeout);
    }
    Ok(format!("{sent} {note}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mailer = Mailer {
        from: "shop".into(),
    };
    assert!(checkout(&mailer, "order-A", true).await.is_err());
    assert_eq!(RUNS.load(Ordering::Relaxed), 4);
    let sent = checkout(&mailer, "order-A", false).await.unwrap();
    assert_eq!(sent, "shop -> pay-order-A 7");
    assert_eq!(RUNS.load(Ordering::Relaxed), 4, "every step replayed");
}
