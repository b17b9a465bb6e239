#[jobguard::idempotent(key = order_id)]
async fn charge(order_id: &str, amount: u64) -> Option<u64> {
    let _ = order_id;
    Some(amount)
}

fn main() {
    let _ = charge("order-A", 100);
}
