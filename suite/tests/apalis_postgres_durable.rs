//! Durable jobs on apalis-postgres 1.0 under `GuardLayer`, with `PgStore` in the same database
//! (a private `postgres`), and real worker processes (this test binary run again, see
//! `brokers/mod.rs`) on a queue of each test's own. apalis-postgres counts a task's attempts in
//! its row, re-fetches a `Failed` task while its attempts are below its `max_attempts`, and
//! re-enqueues the tasks of a worker whose heartbeat stopped (2 s here) with one more attempt:
//!
//! * a worker SIGKILLed after the job's result was stored and before apalis's ack: the task is
//!   re-enqueued (its attempt counted), the next worker replays the stored result, the task ends
//!   `Done`, and the effect lands once;
//! * a job that aborts its worker every time it runs: it runs 3 times (`crashes = 3`), then the
//!   next delivery is refused as poisoned and dead-letters the job once (`crashed`); the layer
//!   marks the task `Killed`, which apalis-postgres never fetches again;
//! * a job failing with a transient error on every attempt: handed back to apalis (`Failed`) on
//!   each delivery but the last (`max_attempts`), then dead-lettered once, on the last, with
//!   every attempt of every delivery counted, and `Killed`.
//!
//! Without `postgres` or `redis-server` (the workers' notes and dead letters) the tests skip,
//! unless `JOBGUARD_REQUIRE_POSTGRES=1` / `JOBGUARD_REQUIRE_REDIS=1`.

mod brokers;

use brokers::apalis_postgres::{migrate, push, status, tasks};
use brokers::crash::jobs;
use brokers::{ATTEMPTS, Behaviour, Job, Kind, Setup, Workers, count, deliveries, numbered};
use jobguard::GiveUp;
use jobguard_testkit::broker::unique_name;
use jobguard_testkit::postgres::PgServer;
use jobguard_testkit::redis::RedisServer;
use sqlx::PgPool;
use std::time::Duration;

/// The worker role: runs only when a test below starts this binary as a worker.
#[test]
fn worker() {
    brokers::worker_if_asked();
}

/// The test's private Postgres (migrated) and Redis, or `None` (skipped).
async fn setup(what: &str, max_attempts: u32) -> Option<(Setup, PgPool, PgServer, RedisServer)> {
    let postgres = PgServer::start()?;
    let redis = RedisServer::start()?;
    let pool = migrate(&postgres.url()).await;
    let setup = Setup {
        kind: Kind::ApalisPostgres,
        url: postgres.url(),
        name: unique_name(what),
        limit: max_attempts,
        redis: redis.url(),
    };
    Some((setup, pool, postgres, redis))
}

/// Whether every task of the queue has the status `expected` gives its job.
async fn statuses(pool: &PgPool, queue: &str, expected: impl Fn(&Job) -> &'static str) -> bool {
    let tasks = tasks(pool, queue).await;
    !tasks.is_empty() && tasks.iter().all(|(job, status, _)| status == expected(job))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_stored_result_and_before_the_ack_is_replayed_on_redelivery() {
    let Some((setup, pool, _postgres, _redis)) = setup("killed", 5).await else {
        return;
    };
    let jobs = jobs(0..8, None);
    let crash = "acked:2,5";
    let mut workers = Workers::start(&setup, "worker", crash, 2);
    push(&pool, &setup, &jobs).await;

    let queue = setup.name.clone();
    workers
        .until(Duration::from_secs(60), "every task done", async |_| {
            statuses(&pool, &queue, |_| "Done").await
        })
        .await;

    let mut redis = brokers::connect(&setup.redis).await;
    for job in &jobs {
        let id = job.id;
        assert_eq!(
            count(&mut redis, "effect", id).await,
            1,
            "job {id}'s effect"
        );
        assert_eq!(count(&mut redis, "runs", id).await, 1, "job {id}'s runs");
    }
    let mut kills = workers.kills.clone();
    kills.sort();
    assert_eq!(kills, brokers::parse_crashes(crash));
    for (_, id) in &kills {
        // Re-enqueued with its attempt counted: the replay came on delivery 2.
        assert_eq!(
            deliveries(&mut redis, *id).await,
            numbered(2, 0),
            "job {id}"
        );
    }
    assert!(brokers::letters(&setup.redis).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_kills_its_worker_every_time_is_dead_lettered_once_after_three_crashes() {
    const POISON: u32 = 3;
    let Some((setup, pool, _postgres, _redis)) = setup("poison", 5).await else {
        return;
    };
    let jobs = jobs(0..6, Some((POISON, Behaviour::Abort)));
    let mut workers = Workers::start(&setup, "worker", "", 2).allow_exits();
    push(&pool, &setup, &jobs).await;

    let queue = setup.name.clone();
    workers
        .until(
            Duration::from_secs(60),
            "the poison task killed and the others done",
            async |_| {
                statuses(&pool, &queue, |job| match job.id {
                    POISON => "Killed",
                    _ => "Done",
                })
                .await
            },
        )
        .await;

    let mut redis = brokers::connect(&setup.redis).await;
    assert_eq!(count(&mut redis, "runs", POISON).await, 3);
    assert!(workers.exits >= 3, "{} workers aborted", workers.exits);
    // Each crash re-enqueued the task with one more attempt: the fourth delivery was refused.
    assert_eq!(deliveries(&mut redis, POISON).await, numbered(4, 0));
    for job in jobs.iter().filter(|j| j.id != POISON) {
        assert_eq!(
            count(&mut redis, "effect", job.id).await,
            1,
            "job {}",
            job.id
        );
    }
    let letters = brokers::letters(&setup.redis).await;
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Crashed);
    assert_eq!(letters[0].key.as_deref(), Some("3"));
    assert_eq!(letters[0].attempts, 3);
    // `Killed` is final: apalis-postgres fetches only `Pending` and retryable `Failed` tasks.
    assert_eq!(
        status(&pool, &setup.name, POISON).await.as_deref(),
        Some("Killed")
    );
    assert_eq!(count(&mut redis, "runs", POISON).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_on_every_delivery_is_handed_back_until_the_last_then_dead_lettered_once() {
    const MAX_ATTEMPTS: u32 = 3;
    let Some((setup, pool, _postgres, _redis)) = setup("failing", MAX_ATTEMPTS).await else {
        return;
    };
    let job = Job {
        id: 1,
        behaviour: Behaviour::Fail,
    };
    let mut workers = Workers::start(&setup, "worker", "", 1);
    push(&pool, &setup, &[job]).await;

    let queue = setup.name.clone();
    workers
        .until(Duration::from_secs(60), "the task killed", async |_| {
            statuses(&pool, &queue, |_| "Killed").await
        })
        .await;

    let mut redis = brokers::connect(&setup.redis).await;
    assert_eq!(
        deliveries(&mut redis, 1).await,
        numbered(MAX_ATTEMPTS, MAX_ATTEMPTS)
    );
    assert_eq!(count(&mut redis, "runs", 1).await, MAX_ATTEMPTS * ATTEMPTS);
    let letters = brokers::letters(&setup.redis).await;
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
    assert_eq!(letters[0].attempts, MAX_ATTEMPTS * ATTEMPTS);
    assert_eq!(letters[0].error, "timeout");
    let tasks = tasks(&pool, &setup.name).await;
    assert_eq!(tasks.len(), 1);
    assert_eq!((tasks[0].1.as_str(), tasks[0].2), ("Killed", 3));
}
