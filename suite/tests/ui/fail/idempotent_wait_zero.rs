#[derive(Debug)]
enum GatewayError {
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

#[jobguard::idempotent(key = order_id, in_progress = wait("0s"))]
async fn charge(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    Ok(1)
}

fn main() {}
