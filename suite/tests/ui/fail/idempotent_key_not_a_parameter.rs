#[jobguard::idempotent(key = order)]
async fn charge(order_id: &str, amount: u64) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(amount)
}

fn main() {
    let _ = charge("order-A", 100);
}
