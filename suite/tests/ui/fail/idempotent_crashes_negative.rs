#[jobguard::idempotent(key = order_id, crashes = -1)]
async fn charge(order_id: &str, amount: u64) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(amount)
}

#[jobguard::idempotent(key = order_id, crashes = 5_000_000_000)]
async fn refund(order_id: &str, amount: u64) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(amount)
}

fn main() {
    let _ = charge("order-A", 100);
    let _ = refund("order-A", 100);
}
