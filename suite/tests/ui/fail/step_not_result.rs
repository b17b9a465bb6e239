/// A step that cannot fail: nothing tells a recorded value from a failure to run again.
#[jobguard::step]
async fn capture(order_id: &str) -> u64 {
    let _ = order_id;
    100
}

/// A step without a return type.
#[jobguard::step(name = "notify.v1")]
async fn notify(order_id: &str) {
    let _ = order_id;
}

fn main() {
    let _ = capture("order-A");
    let _ = notify("order-A");
}
