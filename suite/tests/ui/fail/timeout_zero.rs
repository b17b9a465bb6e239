#[jobguard::retry(attempts = 3, timeout = "0s")]
async fn charge(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = charge("order-A");
}
