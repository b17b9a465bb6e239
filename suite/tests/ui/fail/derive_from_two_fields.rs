#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient(from)]
    Io(std::io::Error, u16),
}

fn main() {
    let _ = GatewayError::Io(std::io::Error::other("reset"), 503);
}
