//! The reference scenario (SCENARIO.md): three deliveries of two charge jobs against a flaky
//! gateway, then the state document.
//!
//! ```text
//! cargo run --example charge                      # the embedded in-memory store
//! cargo run --example charge -- --redis URL       # a shared Redis store
//! ```

use jobguard::{MemoryDeadLetters, MemoryStore};
use jobguard_workspace::scenario::{Service, run_scenario};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let letters = MemoryDeadLetters::new();
    if args.iter().any(|a| a == "--redis") {
        return Err("--redis: the Redis store is not built yet".into());
    }
    println!("store: in memory (embedded default)");
    let service = Service::start(MemoryStore::new(), letters.clone());
    let state = run_scenario(&service).await;
    println!("\n$ GET /state\n{}", serde_json::to_string_pretty(&state)?);
    Ok(())
}
