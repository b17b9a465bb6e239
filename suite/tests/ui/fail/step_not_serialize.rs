/// A payment without `Serialize` / `Deserialize`: it cannot be recorded for a later run.
struct Payment {
    amount: u64,
}

#[jobguard::step(name = "capture.v1")]
async fn capture(order_id: &str, amount: u64) -> Result<Payment, jobguard::Error> {
    let _ = order_id;
    Ok(Payment { amount })
}

fn main() {
    let _ = capture("order-A", 100);
}
