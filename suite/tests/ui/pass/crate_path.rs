//! `crate = "..."`: a crate that re-exports jobguard names it for the expansion.

mod facade {
    pub use jobguard;
}

#[jobguard::retry(attempts = 2, base = "1ms", crate = "crate::facade::jobguard")]
async fn through_facade(n: u32) -> Result<u32, std::io::Error> {
    Ok(n + 1)
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    assert_eq!(through_facade(1).await.unwrap(), 2);
}
