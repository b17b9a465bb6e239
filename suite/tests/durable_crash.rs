//! Real worker processes on apalis's Redis storage, killed with SIGKILL mid-job and restarted:
//! 300 jobs, each pushed three times, all complete, and each job's effect lands exactly once.
//!
//! The workers are this test binary run again (see `durable/mod.rs`); the kills happen at the
//! crash points the issue of a real deployment would see: with the claim held before the
//! effect, and after the result was stored but before the broker heard of it. A job killed
//! before its effect runs again on its next delivery, not its last. A kill between the effect
//! and the stored result is the window `durable_window.rs` shows.

mod durable;

use durable::{Downstream, Job, Workers, connect, effects};
use jobguard_testkit::redis::RedisServer;
use std::time::Duration;

const JOBS: u32 = 300;
const PUSHES: usize = 3;

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    durable::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_lose_no_job_and_repeat_no_effect() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let crash = "before:17,121,230;acked:58,170,288";
    let mut workers = Workers::start(&url, "worker", crash, 3);

    let jobs: Vec<Job> = (0..JOBS)
        .map(|id| Job {
            id,
            downstream: Downstream::Plain,
        })
        .collect();
    durable::push(&url, &jobs, PUSHES).await;
    workers
        .run_until_done(jobs.len() * PUSHES, Duration::from_secs(90))
        .await;

    let mut redis = connect(&url).await;
    for job in &jobs {
        assert_eq!(effects(&mut redis, job.id).await, 1, "job {}", job.id);
    }
    let mut kills = workers.kills.clone();
    kills.sort();
    let mut expected = durable::parse_crashes(crash);
    expected.sort();
    assert_eq!(kills, expected, "every crash point killed its worker once");
    for (point, id) in &kills {
        // Killed before the effect: the effect ran once, on the next worker. Killed before the
        // ack: the next delivery replayed the stored result.
        let runs = durable::runs(&mut redis, *id).await;
        assert_eq!(
            runs, 1,
            "job {id}, killed at {point}, reached its effect {runs} times"
        );
        if point == "before" {
            // The body ran twice, both times on delivery 1: the delivery after the kill waited
            // out the dead worker's lease and ran the job, rather than being handed back
            // `InProgress` (which apalis would count, making the run's number 2).
            let seen = durable::deliveries(&mut redis, *id).await;
            assert_eq!(seen, [1, 1], "job {id}'s runs, by delivery");
        }
    }
    let dead: usize = redis::AsyncCommands::scard(&mut redis, durable::config().dead_jobs_set())
        .await
        .unwrap();
    assert_eq!(dead, 0, "no task was given up by the broker");
}
