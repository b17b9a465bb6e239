// A `const` is a new budget wherever it is named: one whose deposits no call would ever see.
#[allow(clippy::declare_interior_mutable_const)]
const RETRIES: jobguard::RetryBudget =
    jobguard::RetryBudget::new(0.1, 1, std::time::Duration::from_secs(10));

#[jobguard::retry(attempts = 3, retry_budget = RETRIES)]
async fn charge(order_id: &str) -> Result<u64, std::io::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = charge("order-A");
}
