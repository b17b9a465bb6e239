// A missing `Transient` is one error, on the return type, however the loop is expanded.
#[derive(Debug)]
struct GatewayError;

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway error")
    }
}

impl From<jobguard::Error> for GatewayError {
    fn from(_: jobguard::Error) -> Self {
        GatewayError
    }
}

#[jobguard::retry(attempts = 3, timeout = "1s")]
async fn timed(order_id: &str) -> Result<u64, GatewayError> {
    Ok(order_id.len() as u64)
}

#[jobguard::idempotent(key = order_id)]
#[jobguard::retry(attempts = 3)]
async fn charge(order_id: &str) -> Result<u64, GatewayError> {
    Ok(order_id.len() as u64)
}

fn main() {
    let _ = timed("order-A");
    let _ = charge("order-A");
}
