//! The server example with `--redis` and the worker example, against a private `redis-server`:
//! the scenario's three requests go through apalis's Redis storage to the worker, which charges
//! order-A once (the second delivery replays), dead-letters order-B into the Redis stream, and
//! leaves the scenario's state document for the server to read. Real time: the backoff delays
//! (9 s in all) are real waits, as Redis I/O cannot run on a paused clock.

#[allow(dead_code)]
#[path = "../examples/server.rs"]
mod server;
#[allow(dead_code)]
#[path = "../examples/worker.rs"]
mod worker;

use jobguard::RedisDeadLetters;
use jobguard_testkit::redis::RedisServer;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_through_apalis_redis_and_the_worker_example() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let service = server::Service::start_redis(&url, false).await.unwrap();
    let worker_url = url.clone();
    tokio::spawn(async move { worker::run(&worker_url, 1).await.unwrap() });
    // One request at a time, each once the one before has left its mark, so the document's
    // order does not depend on which job a worker fetched first.
    type Done = fn(&server::State) -> bool;
    let steps: [(&str, &str, Done); 3] = [
        ("order-A", "idem-1", |s| {
            s.idempotency_store.contains_key("idem-1")
        }),
        ("order-A", "idem-1", |s| {
            s.attempts.iter().any(|a| a.contains("skipped"))
        }),
        // The letter is in its stream as soon as the job gives up; the journal's lines go to
        // Redis through one writer task, so wait for the ninth attempt line too.
        ("order-B", "idem-2", |s| {
            !s.dead_letter.is_empty() && s.attempts.len() >= 9
        }),
    ];
    let mut state = service.state().await;
    for (order, key, done) in steps {
        service.enqueue(order, key).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            state = service.state().await;
            if done(&state) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{order} did not finish: {state:?}"
            );
            // Polls the journal the worker writes in Redis.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["charges"], serde_json::json!(["order-A"]));
    assert_eq!(
        json["attempts"],
        serde_json::json!([
            "order-A attempt 1",
            "order-A attempt 2",
            "order-A attempt 3",
            "order-A skipped: idempotency key idem-1 already processed",
            "order-B attempt 1",
            "order-B attempt 2",
            "order-B attempt 3",
            "order-B attempt 4",
            "order-B attempt 5"
        ])
    );
    assert_eq!(
        json["backoff_delays"],
        serde_json::json!([0.5, 1.0, 0.5, 1.0, 2.0, 4.0])
    );
    assert_eq!(
        json["idempotency_store"],
        serde_json::json!({"idem-1": {"order_id": "order-A", "attempts_used": 3}})
    );
    assert_eq!(
        json["dead_letter"],
        serde_json::json!(["order-B key=idem-2 gave up: gateway timeout on order-B (attempt 5)"])
    );
    let letters = RedisDeadLetters::connect(&url, server::DEAD_LETTERS)
        .await
        .unwrap();
    let letters = letters.list().await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].1.key.as_deref(), Some("idem-2"));
}
