#[derive(Debug, jobguard::Transient)]
struct GatewayError {
    code: u16,
}

fn main() {
    let _ = GatewayError { code: 503 }.code;
}
