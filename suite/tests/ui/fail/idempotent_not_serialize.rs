/// A receipt without `Serialize` / `Deserialize`: it cannot be stored for replay.
struct Receipt {
    amount: u64,
}

#[jobguard::idempotent(key = order_id)]
async fn charge(order_id: &str, amount: u64) -> Result<Receipt, jobguard::Error> {
    let _ = order_id;
    Ok(Receipt { amount })
}

fn main() {
    let _ = charge("order-A", 100);
}
