// An uncalled function is `dead_code` with either attribute, as it is without one.
#![deny(dead_code)]

#[jobguard::retry(attempts = 3)]
async fn retried() -> Result<u32, std::io::Error> {
    Ok(1)
}

#[jobguard::idempotent(key = order_id)]
async fn charged(order_id: &str) -> Result<u32, jobguard::Error> {
    Ok(order_id.len() as u32)
}

#[jobguard::idempotent(key = order_id)]
#[jobguard::retry(attempts = 3)]
async fn both(order_id: &str) -> Result<u32, jobguard::Error> {
    Ok(order_id.len() as u32)
}

async fn plain() -> Result<u32, std::io::Error> {
    Ok(1)
}

fn main() {}
