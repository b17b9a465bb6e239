//! A worker process killed with `SIGKILL` after a checkout's reserve step: the job's
//! redelivery, on another worker process, replays the recorded capture and reservation and
//! resumes at the receipt. Each effect happens once.

mod steps;

use jobguard_testkit::redis::RedisServer;
use std::time::Duration;
use steps::{Order, Point, Workers, connect, count, list, until_count};

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    steps::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_reservation_is_resumed_at_the_receipt() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mut redis = connect(&url).await;
    let mut workers = Workers::start(&url, "worker", 2);
    let id = 1;
    steps::push(
        &url,
        Order {
            id,
            point: Point::AfterReserve,
        },
    )
    .await;

    let killed = workers
        .held(&mut redis, "after-reserve", Duration::from_secs(30))
        .await;
    workers.kill(killed);
    until_count(&mut redis, "receipts", id, 1, Duration::from_secs(30)).await;

    assert_eq!(count(&mut redis, "captured", id).await, 1);
    assert_eq!(count(&mut redis, "reserve_requests", id).await, 1);
    assert_eq!(count(&mut redis, "receipts", id).await, 1);
    let runs = list(&mut redis, "runs", id).await;
    let replays = list(&mut redis, "replays", id).await;
    // The killed worker ran capture and reserve; another process replayed them and ran the
    // receipt.
    let killed = killed.to_string();
    let step = |note: &String| note.split(' ').nth(1).unwrap_or_default().to_owned();
    let by = |note: &String| note.split(' ').next().unwrap_or_default().to_owned();
    assert_eq!(
        runs.iter().map(step).collect::<Vec<_>>(),
        ["capture.v1", "reserve.v1", "receipt.v1"]
    );
    assert_eq!(by(&runs[0]), killed);
    assert_eq!(by(&runs[1]), killed);
    assert_ne!(
        by(&runs[2]),
        killed,
        "the receipt ran on another worker process"
    );
    assert_eq!(
        replays.iter().map(step).collect::<Vec<_>>(),
        ["capture.v1", "reserve.v1"]
    );
    assert!(
        replays.iter().all(|note| by(note) == by(&runs[2])),
        "{replays:?}"
    );
}
