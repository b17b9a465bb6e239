//! The console's JSON API over `MemoryDeadLetters` and `MemoryStore`: every route, the filters
//! and pagination over 10,000 letters, the `409` on a stale count and the `403`s of a
//! read-only console, through a real HTTP client on a loopback socket (the same checks as
//! `console_redis.rs` and `console_postgres.rs`, less the corrupt entry a memory sink cannot
//! hold).

mod console_support;

use console_support::{LETTERS, console, exercise, letter, listening};
use jobguard::{DeadLetterSink, MemoryDeadLetters, MemoryStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_over_ten_thousand_letters_in_memory() {
    let letters = MemoryDeadLetters::with_capacity(2 * LETTERS);
    for i in 0..LETTERS {
        letters.send(letter(i)).await.unwrap();
    }
    let store = MemoryStore::new();
    let (read_only, _) = console(letters.clone(), store.clone(), listening().0);
    exercise(letters, store, read_only, false).await;
}
