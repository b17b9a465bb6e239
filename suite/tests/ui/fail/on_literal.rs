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

#[jobguard::retry(on = "transient")]
async fn charge(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = charge("order-A");
}
