#[derive(Debug)]
enum GatewayError {
    Declined,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined")
    }
}

#[jobguard::idempotent(key = order_id)]
async fn charge(order_id: &str, amount: u64) -> Result<u64, GatewayError> {
    if order_id.is_empty() {
        return Err(GatewayError::Declined);
    }
    Ok(amount)
}

fn main() {
    let _ = charge("order-A", 100);
}
