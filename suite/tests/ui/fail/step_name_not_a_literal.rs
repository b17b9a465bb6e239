const NAME: &str = "capture.v1";

/// The name is how a recorded value is found again: a constant or an expression is refused.
#[jobguard::step(name = NAME)]
async fn capture(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

/// An empty name, and an unknown argument.
#[jobguard::step(name = "", scope = "payments")]
async fn refund(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = capture("order-A");
    let _ = refund("order-A");
}
