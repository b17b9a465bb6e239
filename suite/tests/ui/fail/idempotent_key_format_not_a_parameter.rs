#[jobguard::idempotent(key = format!("{tenant}:{order}"))]
async fn charge(tenant: &str, order_id: &str, amount: u64) -> Result<u64, jobguard::Error> {
    let _ = (tenant, order_id);
    Ok(amount)
}

fn main() {
    let _ = charge("acme", "order-A", 100);
}
