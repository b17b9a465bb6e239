#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient(x)]
    Timeout,
}

fn main() {
    let _ = GatewayError::Timeout;
}
