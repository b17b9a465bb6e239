//! The server example with `--redis` and the worker example, against a private `redis-server`:
//! the scenario's three requests go through apalis's Redis storage to the worker, which charges
//! order-A once (the second delivery replays), and leaves the scenario's state document for the
//! server to read. order-B is pushed with `max_attempts` 3: its first two deliveries run out of
//! attempts and hand the job back to the broker without a dead letter; the third writes its one
//! letter into the Redis stream, counting all 15 attempts. Real time: the backoff delays (24 s
//! in all) and the broker's redelivery delays (1 s, then 2 s) are real waits, as Redis I/O
//! cannot run on a paused clock.

#[allow(dead_code)]
#[path = "../../examples/server.rs"]
mod server;
#[allow(dead_code)]
#[path = "../../examples/worker.rs"]
mod worker;

use jobguard::RedisDeadLetters;
use jobguard_testkit::redis::RedisServer;
use redis::AsyncCommands;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_through_apalis_redis_and_the_worker_example() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let service = server::Service::start_redis(&url, false).await.unwrap();
    let worker_url = url.clone();
    tokio::spawn(async move {
        worker::run(&worker_url, worker::Settings::default())
            .await
            .unwrap()
    });
    let config = server::redis_config();
    let mut redis = apalis_redis::connect(url.clone()).await.unwrap();
    // One request at a time, each once the broker has the one before as finished (done, or
    // dead: acknowledged after the handler returned, so after its claim was completed or
    // released and its letter written), so the document's order does not depend on which job
    // a worker fetched first. The journal's lines go to Redis through one writer task in the
    // order they were written, and order-B's letter line is the last: once it is there, every
    // line before it is too.
    //
    // Nothing here reads `service.state()` while a job may run: the state document reads the
    // idempotency store by claiming each key (and releasing it at once), and a delivery that
    // tried to claim its key in that moment would be handed back `InProgress`, spending one of
    // order-B's three deliveries (the letter then counted 20 attempts, or came a delivery
    // short).
    let steps = [
        // (order, key, (done, dead, dead letter lines) once it finished)
        ("order-A", "idem-1", (1, 0, 0)),
        ("order-A", "idem-1", (2, 0, 0)),
        ("order-B", "idem-2", (2, 1, 1)),
    ];
    for (order, key, finished) in steps {
        service.enqueue(order, key).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let done: usize = redis.scard(config.done_jobs_set()).await.unwrap();
            let dead: usize = redis.scard(config.dead_jobs_set()).await.unwrap();
            let lines: usize = redis.llen("demo:dead_letters").await.unwrap();
            if (done, dead, lines) == finished {
                break;
            }
            if Instant::now() >= deadline {
                let attempts: Vec<String> = redis.lrange("demo:attempts", 0, -1).await.unwrap();
                panic!(
                    "{order} did not finish: {done} done, {dead} dead, {lines} letter lines, attempts {attempts:?}"
                );
            }
            // Polls the broker's sets and the journal in Redis.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Every job has finished: reading the store by claiming its keys disturbs nothing now.
    let state = service.state().await;
    let json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["charges"], serde_json::json!(["order-A"]));
    assert_eq!(
        json["attempts"],
        serde_json::json!([
            "order-A attempt 1",
            "order-A attempt 2",
            "order-A attempt 3",
            "order-A skipped: idempotency key idem-1 already processed",
            // Three deliveries of five attempts each; the gateway counts its tries across them.
            "order-B attempt 1",
            "order-B attempt 2",
            "order-B attempt 3",
            "order-B attempt 4",
            "order-B attempt 5",
            "order-B attempt 6",
            "order-B attempt 7",
            "order-B attempt 8",
            "order-B attempt 9",
            "order-B attempt 10",
            "order-B attempt 11",
            "order-B attempt 12",
            "order-B attempt 13",
            "order-B attempt 14",
            "order-B attempt 15"
        ])
    );
    assert_eq!(
        json["backoff_delays"],
        serde_json::json!([
            0.5, 1.0, // order-A
            0.5, 1.0, 2.0, 4.0, // order-B, delivery 1
            0.5, 1.0, 2.0, 4.0, // delivery 2
            0.5, 1.0, 2.0, 4.0, // delivery 3
        ])
    );
    assert_eq!(
        json["idempotency_store"],
        serde_json::json!({"idem-1": {"order_id": "order-A", "attempts_used": 3}})
    );
    assert_eq!(
        json["dead_letter"],
        serde_json::json!(["order-B key=idem-2 gave up: gateway timeout on order-B (attempt 15)"])
    );
    let letters = RedisDeadLetters::connect(&url, server::DEAD_LETTERS)
        .await
        .unwrap();
    let letters = letters.list().await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = letters[0].1.as_ref().unwrap();
    assert_eq!(letter.key.as_deref(), Some("idem-2"));
    assert_eq!(letter.attempts, 15, "every attempt of every delivery");
    // The third delivery was order-B's last: the broker keeps it in its dead set and has
    // nothing queued or scheduled to deliver again.
    let dead: usize = redis.scard(config.dead_jobs_set()).await.unwrap();
    let queued: usize = redis.llen(config.active_jobs_list()).await.unwrap();
    let scheduled: usize = redis.zcard(config.scheduled_jobs_set()).await.unwrap();
    assert_eq!((dead, queued, scheduled), (1, 0, 0));
}
