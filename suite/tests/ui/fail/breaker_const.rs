// A `const` is a new breaker wherever it is named: one that would never trip across calls.
#[allow(clippy::declare_interior_mutable_const)]
const GATEWAY: jobguard::CircuitBreaker =
    jobguard::CircuitBreaker::new(5, std::time::Duration::from_secs(30));

#[jobguard::retry(attempts = 3, breaker = GATEWAY)]
async fn charge(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = charge("order-A");
}
