//! A worker process killed with `SIGKILL` after a checkout's reserve step: the job's
//! redelivery, on another worker process, replays the recorded capture and reservation and
//! resumes at the receipt. Each effect happens once.

mod steps;

use jobguard_testkit::redis::RedisServer;
use std::time::Duration;
use steps::{Order, Point, Workers, connect, count, list, until_count, until_len};

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
    until_len(&mut redis, "runs", id, 3, Duration::from_secs(30)).await;
    until_len(&mut redis, "replays", id, 2, Duration::from_secs(30)).await;

    assert_eq!(count(&mut redis, "captured", id).await, 1);
    assert_eq!(count(&mut redis, "reserve_requests", id).await, 1);
    assert_eq!(count(&mut redis, "receipts", id).await, 1);
    // The notes, `pid step`, are written by tasks the observer spawns: in any order.
    let notes = async |redis: &mut _, name| {
        let mut notes: Vec<(String, String)> = (list(redis, name, id).await.iter())
            .map(|note| {
                let (pid, step) = note.split_once(' ').expect("pid step");
                (step.to_owned(), pid.to_owned())
            })
            .collect();
        notes.sort();
        notes
    };
    // The killed worker ran capture and reserve; another process replayed them and ran the
    // receipt.
    let killed = killed.to_string();
    let runs = notes(&mut redis, "runs").await;
    let steps: Vec<&str> = runs.iter().map(|(step, _)| step.as_str()).collect();
    assert_eq!(steps, ["capture.v1", "receipt.v1", "reserve.v1"]);
    let resumed = runs[1].1.clone();
    assert_ne!(resumed, killed, "the receipt ran on another worker process");
    assert_eq!(
        (runs[0].1.as_str(), runs[2].1.as_str()),
        (&*killed, &*killed)
    );
    let replays = notes(&mut redis, "replays").await;
    assert_eq!(
        replays,
        [
            ("capture.v1".to_owned(), resumed.clone()),
            ("reserve.v1".to_owned(), resumed)
        ]
    );
}
