#[jobguard::retry(attempts = 3)]
async fn charge(order_id: &str) {
    let _ = order_id;
}

fn main() {
    let _ = charge("order-A");
}
