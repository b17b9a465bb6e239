#[derive(Debug)]
struct GatewayError;

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway error")
    }
}

fn wrong(_: &GatewayError) -> u32 {
    0
}

#[jobguard::retry(attempts = 3, on = wrong)]
async fn charge(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = charge("order-A");
}
