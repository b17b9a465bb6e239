/// A step without `async`: its value is recorded once the future completes.
#[jobguard::step]
fn capture(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = capture("order-A");
}
