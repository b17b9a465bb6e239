/// `#[step]` is an effect inside a job; `#[idempotent]` makes the job: not both on one function.
#[jobguard::step]
#[jobguard::idempotent(key = order_id)]
async fn capture(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

#[jobguard::idempotent(key = order_id)]
#[jobguard::step]
async fn refund(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = capture("order-A");
    let _ = refund("order-A");
}
