// The error type of a `#[retry]` job has no `Display`: its failures cannot be written into a
// dead letter, which the compiler says in words.
#[derive(Debug)]
enum GatewayError {
    Timeout,
}

impl jobguard::Transient for GatewayError {
    fn verdict(&self) -> jobguard::Verdict {
        jobguard::Verdict::Retry
    }
}

#[jobguard::retry(attempts = 3)]
async fn charge(order_id: &str) -> Result<u64, GatewayError> {
    let _ = order_id;
    Err(GatewayError::Timeout)
}

fn main() {}
