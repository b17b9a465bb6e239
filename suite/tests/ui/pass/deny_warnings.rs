//! Both attributes imported by name and written on one function, in both orders, in a crate
//! that denies every warning and clippy's default lints: the expansion leaves neither (the
//! second attribute's import counts as used), and `on_ok` and `name` add none.
#![deny(warnings, clippy::all)]

use jobguard::{Verdict, idempotent, retry};

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

#[idempotent(key = order_id, scope = "payments.charge")]
#[retry(attempts = 3, base = "1ms", cap = "1ms")]
async fn charge(order_id: &str, amount: u64) -> Result<u64, GatewayError> {
    if amount == 0 {
        return Err(GatewayError::Timeout);
    }
    Ok(amount)
}

#[retry(attempts = 2, base = "1ms", cap = "1ms", timeout = "1s")]
#[idempotent(key = order_id)]
async fn refund(order_id: &str) -> Result<u64, GatewayError> {
    Ok(order_id.len() as u64)
}

fn busy(status: &u16) -> Verdict {
    Verdict::from(*status == 503)
}

#[retry(attempts = 2, base = "1ms", cap = "1ms", on_ok = busy, name = "http.poll")]
async fn poll() -> Result<u16, std::io::Error> {
    Ok(200)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(charge("order-A", 100).await.unwrap(), 100);
        assert_eq!(refund("order-B").await.unwrap(), 7);
        assert_eq!(poll().await.unwrap(), 200);
    });
}
