#[derive(Debug)]
enum GatewayError {
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

// Not `Serialize`: it cannot be fingerprinted.
struct Card {
    number: String,
}

#[jobguard::idempotent(key = order_id, fingerprint = card)]
async fn charge(order_id: &str, card: &Card) -> Result<u64, GatewayError> {
    let _ = (order_id, &card.number);
    Ok(1)
}

fn main() {}
