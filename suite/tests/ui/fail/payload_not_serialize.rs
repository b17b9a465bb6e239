use std::net::TcpStream;

#[derive(Debug)]
struct GatewayError;

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway error")
    }
}

impl jobguard::Transient for GatewayError {
    fn verdict(&self) -> jobguard::Verdict {
        jobguard::Verdict::Retry
    }
}

// A socket cannot be serialized into a dead letter.
#[jobguard::retry(payload = (order_id, socket))]
async fn charge(order_id: &str, socket: &TcpStream) -> Result<u64, GatewayError> {
    let _ = (order_id, socket);
    Ok(1)
}

fn main() {}
