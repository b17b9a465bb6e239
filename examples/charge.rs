//! The reference scenario (SCENARIO.md): three deliveries of two charge jobs against a flaky
//! gateway, then the state document.
//!
//! ```text
//! cargo run --example charge                      # the embedded in-memory store
//! cargo run --example charge -- --redis URL       # Redis store, dead letters in a Redis stream
//! cargo run --example charge -- --redis URL --redrive   # then the gateway recovers: redrive
//! ```
//!
//! With `--redis`, order-B's dead letter stays in the stream `jobguard:dead_letters:charge`.
//! With `--redrive` too, the gateway then recovers and every letter in the stream is redriven
//! (`Service::redrive`: `RedisDeadLetters::redrive(id, |letter| charge(..))`): the job runs
//! again from the letter's payload under its idempotency key, order-B is charged once, and the
//! letter is removed because the job succeeded.

use jobguard::{MemoryDeadLetters, MemoryStore, RedisDeadLetters, RedisStore};
use jobguard_workspace::scenario::{Service, run_scenario};

const STREAM: &str = "jobguard:dead_letters:charge";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let redis_url = match args.iter().position(|a| a == "--redis") {
        Some(i) => Some(
            args.get(i + 1)
                .ok_or("--redis needs a URL, such as redis://127.0.0.1:6379")?
                .clone(),
        ),
        None => None,
    };
    let service = match &redis_url {
        Some(url) => {
            // A fresh demo: forget the keys an earlier run completed (layout `jobguard:{scope}:{key}`).
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let _: () = redis::cmd("DEL")
                .arg("jobguard:payments.charge:idem-1")
                .arg("jobguard:payments.charge:idem-2")
                .query_async(&mut conn)
                .await?;
            println!("store: redis at {url}; dead letters: stream {STREAM}");
            Service::start(
                RedisStore::connect(url).await?,
                RedisDeadLetters::connect(url, STREAM).await?,
            )
        }
        None => {
            println!("store: in memory (embedded default)");
            Service::start(MemoryStore::new(), MemoryDeadLetters::new())
        }
    };
    let state = run_scenario(&service).await;
    println!("\n$ GET /state\n{}", serde_json::to_string_pretty(&state)?);
    if let Some(url) = &redis_url {
        let letters = RedisDeadLetters::connect(url, STREAM).await?;
        println!();
        for (id, letter) in letters.list().await? {
            println!(
                "in {STREAM}: {id} job={} key={} reason={} attempts={} payload={}",
                letter.job,
                letter.key.as_deref().unwrap_or("-"),
                letter.reason,
                letter.attempts,
                letter
                    .payload
                    .as_ref()
                    .map_or("-".into(), ToString::to_string),
            );
        }
        if args.iter().any(|a| a == "--redrive") {
            println!("\n$ the gateway recovers; redrive {STREAM}");
            for (id, done) in service.redrive(&letters).await? {
                println!(
                    "  {id}: {}",
                    if done { "redriven, removed" } else { "kept" }
                );
            }
            println!(
                "letters left in {STREAM}: {}\n\n$ GET /state\n{}",
                letters.len().await?,
                serde_json::to_string_pretty(&service.state().await)?
            );
        } else {
            println!("redrive them with: cargo run --example charge -- --redis {url} --redrive");
        }
    }
    Ok(())
}
