//! `cargo run --example charge -- --redis URL --redrive`, as a test against a private
//! `redis-server`: the scenario leaves order-B's dead letter in the Redis stream, with its key
//! and its arguments; once the gateway recovers, the redrive runs the job again from the letter,
//! charges order-B exactly once, and removes the letter. Real time: the scenario's backoff
//! delays (9 s in all) are real waits here, as Redis I/O cannot run on a paused clock.

#[allow(dead_code)]
#[path = "../../examples/charge.rs"]
mod example;

use example::{Service, run_scenario};
use jobguard::{RedisDeadLetters, RedisStore};
use jobguard_testkit::redis::RedisServer;

const STREAM: &str = "jobguard:dead_letters:charge";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_b_is_left_in_the_stream_and_the_redrive_charges_it_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let letters = RedisDeadLetters::connect(&url, STREAM).await.unwrap();
    let service = Service::start(RedisStore::connect(&url).await.unwrap(), letters.clone());
    let state = run_scenario(&service).await;
    assert_eq!(state.charges, ["order-A"]);

    let left = letters.list().await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    let letter = left[0].1.as_ref().unwrap();
    assert_eq!(letter.key.as_deref(), Some("idem-2"));
    assert_eq!(letter.reason, jobguard::GiveUp::Exhausted);
    assert_eq!(letter.attempts, 5);
    assert_eq!(letter.payload, Some(serde_json::json!(["order-B", 100])));

    let redriven = service.redrive(&letters).await.unwrap();
    assert_eq!(redriven, [(left[0].0.clone(), true)]);
    assert!(letters.is_empty().await.unwrap());
    let state = service.state().await;
    assert_eq!(state.charges, ["order-A", "order-B"]);
    assert_eq!(
        state.attempts.last().map(String::as_str),
        Some("order-B attempt 6"),
        "one attempt: the redrive's first succeeded"
    );
    assert_eq!(state.idempotency_store["idem-2"].attempts_used, 6);

    // Redelivered after the redrive, order-B replays: no second charge, no letter.
    service.enqueue("order-B", "idem-2");
    service.finished(4).await;
    assert_eq!(service.state().await.charges, ["order-A", "order-B"]);
    assert!(letters.is_empty().await.unwrap());
}
