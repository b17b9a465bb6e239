use std::net::TcpStream;

#[derive(Debug)]
struct GatewayError;

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway error")
    }
}

impl From<jobguard::Error> for GatewayError {
    fn from(_: jobguard::Error) -> Self {
        GatewayError
    }
}

impl jobguard::Transient for GatewayError {
    fn verdict(&self) -> jobguard::Verdict {
        jobguard::Verdict::Retry
    }
}

// A socket cannot be serialized into a dead letter: one error, though both the retry's letters
// and the crash letter of #[idempotent] would carry it.
#[jobguard::idempotent(key = order_id)]
#[jobguard::retry(payload = (order_id, socket))]
async fn charge(order_id: &str, socket: &TcpStream) -> Result<u64, GatewayError> {
    let _ = (order_id, socket);
    Ok(1)
}

fn main() {}
