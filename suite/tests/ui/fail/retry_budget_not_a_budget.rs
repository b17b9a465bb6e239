// `retry_budget` names a breaker by mistake: it takes a `RetryBudget`.
use std::time::Duration;

static GATEWAY: jobguard::CircuitBreaker = jobguard::CircuitBreaker::new(5, Duration::from_secs(30));

#[jobguard::retry(attempts = 3, retry_budget = GATEWAY)]
async fn charge(order_id: &str) -> Result<u64, std::io::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = charge("order-A");
}
