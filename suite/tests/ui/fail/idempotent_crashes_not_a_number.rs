#[jobguard::idempotent(key = order_id, crashes = "3")]
async fn charge(order_id: &str, amount: u64) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(amount)
}

#[jobguard::idempotent(key = order_id, crashes = LIMIT)]
async fn refund(order_id: &str, amount: u64) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(amount)
}

const LIMIT: u32 = 3;

fn main() {
    let _ = charge("order-A", 100);
    let _ = refund("order-A", 100);
    let _ = LIMIT;
}
