#[jobguard::idempotent(key = order_id)]
async fn charge(order_id: &str) {
    let _ = order_id;
}

fn main() {
    let _ = charge("order-A");
}
