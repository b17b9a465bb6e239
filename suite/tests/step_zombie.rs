//! A zombie: a worker process paused with `SIGSTOP` inside a checkout's reserve step (its
//! effect made, its record not yet written) past its lease. Another worker takes the job over,
//! replays the capture and finishes it; the paused worker wakes with `SIGCONT`, and its step's
//! write is refused: it records nothing, the job's effects stay once each, and the zombie's
//! failed run writes no dead letter (the job is its successor's, which completed it).

mod steps;

use jobguard::RedisDeadLetters;
use jobguard_testkit::redis::RedisServer;
use std::time::Duration;
use steps::{Order, Point, Workers, connect, count, list, until_count, until_len};

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    steps::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_wakes_to_a_refused_step_write() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mut redis = connect(&url).await;
    let workers = Workers::start(&url, "worker", 2);
    let id = 3;
    steps::push(
        &url,
        Order {
            id,
            point: Point::InReserve,
        },
    )
    .await;

    let zombie = workers
        .held(&mut redis, "in-reserve", Duration::from_secs(30))
        .await;
    workers.pause(zombie);
    // Its lease (2 s) lapses; the broker hands the job to the other worker, which finishes it.
    until_count(&mut redis, "receipts", id, 1, Duration::from_secs(30)).await;

    workers.wake(&mut redis, zombie, id).await;
    // Counted once the zombie's call returned its error, its give-up done.
    until_count(&mut redis, "lease_lost", id, 1, Duration::from_secs(30)).await;
    let letters = RedisDeadLetters::connect(&url, steps::DEAD_LETTERS)
        .await
        .unwrap();
    assert!(
        letters.is_empty().await.unwrap(),
        "a zombie writes no letter: {:?}",
        letters.list().await.unwrap()
    );
    until_len(&mut redis, "runs", id, 3, Duration::from_secs(30)).await;

    assert_eq!(count(&mut redis, "captured", id).await, 1);
    assert_eq!(
        count(&mut redis, "reserved", id).await,
        1,
        "one reservation applied"
    );
    assert_eq!(count(&mut redis, "receipts", id).await, 1);
    // The notes, `pid step`, are written by tasks the observer spawns: in any order. The
    // zombie recorded its capture and nothing after it; the successor the rest.
    let zombie = zombie.to_string();
    let mut runs: Vec<(String, bool)> = (list(&mut redis, "runs", id).await.iter())
        .map(|note| {
            let (pid, step) = note.split_once(' ').expect("pid step");
            (step.to_owned(), pid == zombie)
        })
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            ("capture.v1".to_owned(), true),
            ("receipt.v1".to_owned(), false),
            ("reserve.v1".to_owned(), false)
        ]
    );
    let replays = list(&mut redis, "replays", id).await;
    assert!(
        replays.iter().all(|note| !note.starts_with(&zombie)),
        "{replays:?}"
    );
    assert_eq!(
        count(&mut redis, "reserve_requests", id).await,
        2,
        "the zombie's reservation, and the successor's (answered, not applied)"
    );
}
