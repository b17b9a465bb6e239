#[jobguard::retry(attempts = 3)]
async fn charge(order_id: &str) -> Option<u64> {
    let _ = order_id;
    Some(100)
}

fn main() {
    let _ = charge("order-A");
}
