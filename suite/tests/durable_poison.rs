//! A poison job with real processes: a job whose body aborts its worker process every time it
//! runs, among jobs that do not. The store counts each abandoned claim; after 3 crashes (the
//! default `crashes = 3`) the next delivery is refused with `Error::Poisoned`, the job is
//! dead-lettered once with `crashed`, the other jobs finish, and the body never runs a fourth
//! time.
//!
//! The workers are this test binary run again (see `durable/mod.rs`), restarted by the harness
//! each time one aborts; apalis-redis re-enqueues the dead worker's task once its heartbeat is
//! missed (2 s), and the next claim takes the lapsed claim (a 2 s lease) over.

mod durable;

use durable::{Downstream, Job, Workers, connect, effects, runs};
use jobguard::{GiveUp, RedisDeadLetters};
use jobguard_testkit::redis::RedisServer;
use redis::AsyncCommands;
use std::time::{Duration, Instant};

const JOBS: u32 = 12;
const POISON: u32 = 5;

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    durable::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_aborts_its_worker_is_dead_lettered_after_three_crashes_and_never_runs_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mut workers = Workers::start(&url, "worker", &format!("abort:{POISON}"), 2).allow_exits();
    let jobs: Vec<Job> = (0..JOBS)
        .map(|id| Job {
            id,
            downstream: Downstream::Plain,
        })
        .collect();
    durable::push(&url, &jobs, 1).await;

    // Every task reaches its end at the broker: the others done, the poison one dead (the
    // poisoned job's refusal settles it: `GuardLayer` marks the task `Killed`, which apalis does not
    // deliver again).
    let mut redis = connect(&url).await;
    let config = durable::config();
    let deadline = Instant::now() + Duration::from_secs(40);
    let (done, dead) = loop {
        workers.kill_held(&mut redis).await;
        let done: usize = redis.scard(config.done_jobs_set()).await.unwrap();
        let dead: usize = redis.scard(config.dead_jobs_set()).await.unwrap();
        if done + dead >= jobs.len() {
            break (done, dead);
        }
        assert!(
            Instant::now() < deadline,
            "{done} done and {dead} dead of {JOBS} after 40 s; {} aborts, {} runs of the poison job",
            workers.exits,
            runs(&mut redis, POISON).await
        );
        // Polls the broker's progress; the workers run on their own.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((done, dead), (JOBS as usize - 1, 1));

    // The poison job ran three times, each run killing its worker, and not a fourth: the task
    // is dead at the broker, so no delivery can come after this.
    assert_eq!(runs(&mut redis, POISON).await, 3);
    assert_eq!(effects(&mut redis, POISON).await, 0);
    assert!(workers.exits >= 3, "{} workers aborted", workers.exits);
    for job in jobs.iter().filter(|j| j.id != POISON) {
        assert_eq!(effects(&mut redis, job.id).await, 1, "job {}", job.id);
    }

    let letters = RedisDeadLetters::connect(&url, durable::DEAD_LETTERS)
        .await
        .unwrap()
        .list()
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    let letter = letters[0].1.as_ref().unwrap();
    assert_eq!(letter.reason, GiveUp::Crashed);
    assert_eq!(letter.job, "durable.effect");
    assert_eq!(letter.key.as_deref(), Some(POISON.to_string().as_str()));
    assert_eq!(letter.attempts, 3);
    assert_eq!(
        letter.error,
        jobguard::Error::Poisoned { crashes: 3 }.to_string()
    );
}
