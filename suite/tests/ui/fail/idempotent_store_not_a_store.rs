#[derive(Debug)]
enum GatewayError {
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

// A connection string is not a store: build a `RedisStore` from it.
static STORE: &str = "redis://127.0.0.1:6379";

#[jobguard::idempotent(key = order_id, store = STORE)]
async fn charge(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    Ok(1)
}

fn main() {}
