// Both attributes imported under other names, `#[retry]` written below `#[idempotent]`: neither
// can see that the other is its sibling, so `#[with_retry]` would receive `#[once]`'s expansion
// and claim the key on every attempt. It is an error instead.
use jobguard::idempotent as once;
use jobguard::retry as with_retry;

#[once(key = order_id)]
#[with_retry(attempts = 3)]
async fn charge(order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = order_id;
    Ok(100)
}

fn main() {
    let _ = charge("order-A");
}
