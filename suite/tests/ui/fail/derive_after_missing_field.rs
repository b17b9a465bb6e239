use std::time::Duration;

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient(after = retry_after)]
    RateLimited { wait: Duration },
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("rate limited")
    }
}

// The derive's mistake is reported once: the type is still `Transient`, so this compiles.
#[jobguard::retry(attempts = 3)]
async fn charge(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    Err(GatewayError::RateLimited {
        wait: Duration::from_secs(1),
    })
}

fn main() {
    let _ = charge("order-A");
}
