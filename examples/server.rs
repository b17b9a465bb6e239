//! A web service that queues charge jobs and runs them in the background.
//!
//! ```text
//! cargo run --example server                 # listens on 127.0.0.1:3000
//! curl -X POST 'http://127.0.0.1:3000/charge/order-A?key=idem-1'
//! curl http://127.0.0.1:3000/state
//! curl http://127.0.0.1:3000/metrics         # jobguard_attempts_total, jobguard_dead_lettered_total, ...
//! ```

use jobguard::{MemoryDeadLetters, MemoryStore};
use jobguard_workspace::scenario::{Service, router};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let service = Service::start(MemoryStore::new(), MemoryDeadLetters::new());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(service)).await?;
    Ok(())
}
