//! A permanent failure in a checkout's receipt step dead-letters the job; once the mail server
//! is fixed, a redrive of the letter replays the recorded capture and reservation and sends the
//! receipt: the payment is not captured again.

mod steps;

use jobguard::{GiveUp, RedisDeadLetters};
use jobguard_testkit::redis::RedisServer;
use redis::AsyncCommands;
use std::time::{Duration, Instant};
use steps::{Order, Point, Workers, connect, count, list, until_len};

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    steps::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_after_the_fix_resumes_at_the_receipt() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mut redis = connect(&url).await;
    let letters = RedisDeadLetters::connect(&url, steps::DEAD_LETTERS)
        .await
        .unwrap();
    let workers = Workers::start(&url, "worker", 1);
    let id = 2;
    steps::push(
        &url,
        Order {
            id,
            point: Point::MailBroken,
        },
    )
    .await;

    let deadline = Instant::now() + Duration::from_secs(30);
    let (letter_id, letter) = loop {
        if let Some((letter_id, Ok(letter))) = letters.list().await.unwrap().pop() {
            break (letter_id, letter);
        }
        assert!(Instant::now() < deadline, "no dead letter");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(workers);
    assert_eq!(letter.reason, GiveUp::Permanent);
    assert_eq!(letter.key.as_deref(), Some("2"));
    assert_eq!(count(&mut redis, "captured", id).await, 1);
    assert_eq!(count(&mut redis, "reserve_requests", id).await, 1);
    assert_eq!(count(&mut redis, "receipts", id).await, 0);

    // The fix, then the redrive, from this process.
    let _: () = redis.set("mail:fixed", 1).await.unwrap();
    steps::use_redis(connect(&url).await);
    let runtime = steps::runtime(&url).await;
    let redriven = runtime
        .scope(letters.redrive(&letter_id, |letter| async move {
            let order: Order =
                serde_json::from_value(letter.payload.expect("the order")).expect("an order");
            steps::checkout(order).await
        }))
        .await;
    assert!(matches!(redriven, Ok(true)), "{redriven:?}");
    assert!(letters.is_empty().await.unwrap(), "the letter is removed");
    until_len(&mut redis, "replays", id, 2, Duration::from_secs(30)).await;

    assert_eq!(
        count(&mut redis, "captured", id).await,
        1,
        "not captured again"
    );
    assert_eq!(count(&mut redis, "reserve_requests", id).await, 1);
    assert_eq!(count(&mut redis, "receipts", id).await, 1);
    let mut replays = list(&mut redis, "replays", id).await;
    replays.sort(); // written by tasks the observer spawns: in any order
    let pid = std::process::id().to_string();
    assert_eq!(
        replays,
        [format!("{pid} capture.v1"), format!("{pid} reserve.v1")],
        "the redrive replayed the capture and the reservation"
    );
}
