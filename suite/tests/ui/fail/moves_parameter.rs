#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway timeout")
    }
}

fn consume(order_id: String) -> u64 {
    order_id.len() as u64
}

#[jobguard::retry(attempts = 3)]
async fn charge(order_id: String) -> Result<u64, GatewayError> {
    Ok(consume(order_id))
}

fn main() {
    let _ = charge("order-A".to_owned());
}
