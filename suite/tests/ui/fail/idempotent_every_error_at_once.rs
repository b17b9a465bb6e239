#[jobguard::idempotent(key = ordr_id, tll = "24h", lease = 30, scope = "payments::charge", in_progress = "10s")]
async fn charge(order_id: &str, amount: u64) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(amount)
}

fn main() {
    let _ = charge("order-A", 100);
}
