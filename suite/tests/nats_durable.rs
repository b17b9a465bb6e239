//! Durable jobs on the machine's NATS JetStream, with real worker processes (this test binary
//! run again, see `brokers/mod.rs`) on a work-queue stream and durable pull consumer of each
//! test's own (`ack_wait` 2 s), and a private `redis-server` as the store the workers share:
//!
//! * a worker SIGKILLed after the job's result was stored and before its ack: the server
//!   delivers the job again once `ack_wait` lapses (counting the dead worker's delivery), the
//!   next worker replays the stored result, and the effect lands once;
//! * a job that aborts its worker every time it runs: it runs 3 times (`crashes = 3`), then the
//!   next delivery is refused as poisoned, dead-letters the job once (`crashed`) and terminates
//!   it, and it never runs again;
//! * a job failing with a transient error on every attempt: handed back (`-NAK`) on each
//!   delivery but the last (`max_deliver`), then dead-lettered once, on the last, with every
//!   attempt of every delivery counted, and terminated.
//!
//! Without NATS or `redis-server` the tests skip, unless `JOBGUARD_REQUIRE_NATS=1` /
//! `JOBGUARD_REQUIRE_REDIS=1`.

mod brokers;

use brokers::nats::Stream;
use brokers::{ATTEMPTS, Behaviour, Job, Kind, Setup, Workers, count, deliveries, numbered};
use jobguard::{Delivery, GiveUp};
use jobguard_testkit::broker::{Broker, unique_name};
use jobguard_testkit::redis::RedisServer;
use std::time::{Duration, Instant};

/// The worker role: runs only when a test below starts this binary as a worker.
#[test]
fn worker() {
    brokers::worker_if_asked();
}

/// The test's stream on the machine's NATS and its private Redis, or `None` (skipped).
fn setup(what: &str, limit: u32) -> Option<(Setup, RedisServer)> {
    let url = Broker::Nats.url()?;
    let redis = RedisServer::start()?;
    let setup = Setup {
        kind: Kind::Nats,
        url,
        name: unique_name(what),
        limit,
        redis: redis.url(),
    };
    Some((setup, redis))
}

fn jobs(ids: std::ops::Range<u32>, odd: Option<(u32, Behaviour)>) -> Vec<Job> {
    ids.map(|id| Job {
        id,
        behaviour: match odd {
            Some((odd, behaviour)) if odd == id => behaviour,
            _ => Behaviour::Effect,
        },
    })
    .collect()
}

/// Polls until the stream holds no message and its consumer has none pending, or 10 s passed;
/// returns what is left.
async fn drained(stream: &Stream) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = stream.left().await;
        if left == (0, 0) || Instant::now() > deadline {
            return left;
        }
        // The server drops a message from a work queue as it processes its ack: poll it.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_stored_result_and_before_the_ack_is_replayed_on_redelivery() {
    let Some((setup, _redis)) = setup("killed", 5) else {
        return;
    };
    let stream = Stream::create(&setup).await;
    let jobs = jobs(0..12, None);
    let crash = "acked:2,7,11";
    let mut workers = Workers::start(&setup, "worker", crash, 2);
    stream.publish(&jobs).await;

    let ids: Vec<u32> = jobs.iter().map(|j| j.id).collect();
    workers
        .until(Duration::from_secs(60), "every job acked", async |redis| {
            for id in &ids {
                if count(redis, "acked", *id).await == 0 {
                    return false;
                }
            }
            true
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
        // The dead worker's delivery counts (its ack_wait lapsed): the replay came on delivery 2,
        // and was acked.
        assert_eq!(
            deliveries(&mut redis, *id).await,
            numbered(2, 0),
            "job {id}"
        );
        assert_eq!(count(&mut redis, "acked", *id).await, 1, "job {id}");
    }
    assert!(brokers::letters(&setup.redis).await.is_empty());
    assert_eq!(drained(&stream).await, (0, 0));
    drop(workers);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_kills_its_worker_every_time_is_dead_lettered_once_after_three_crashes() {
    const POISON: u32 = 3;
    let Some((setup, _redis)) = setup("poison", 5) else {
        return;
    };
    let stream = Stream::create(&setup).await;
    let jobs = jobs(0..6, Some((POISON, Behaviour::Abort)));
    let mut workers = Workers::start(&setup, "worker", "", 2).allow_exits();
    stream.publish(&jobs).await;

    let ids: Vec<u32> = jobs.iter().map(|j| j.id).collect();
    workers
        .until(
            Duration::from_secs(60),
            "the poison job settled and the others acked",
            async |redis| {
                for id in &ids {
                    let counter = if *id == POISON { "settled" } else { "acked" };
                    if count(redis, counter, *id).await == 0 {
                        return false;
                    }
                }
                true
            },
        )
        .await;

    let mut redis = brokers::connect(&setup.redis).await;
    // Three runs, each killing its worker; the fourth delivery was refused, and terminated.
    assert_eq!(count(&mut redis, "runs", POISON).await, 3);
    assert!(workers.exits >= 3, "{} workers aborted", workers.exits);
    assert_eq!(deliveries(&mut redis, POISON).await, numbered(4, 0));
    assert_eq!(count(&mut redis, "settled", POISON).await, 1);
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
    assert_eq!(letters[0].job, "brokers.effect");
    assert_eq!(letters[0].key.as_deref(), Some("3"));
    assert_eq!(letters[0].attempts, 3);
    // Terminated: nothing left in the stream or to deliver, and no fourth run.
    assert_eq!(drained(&stream).await, (0, 0));
    assert_eq!(count(&mut redis, "runs", POISON).await, 3);
    drop(workers);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_on_every_delivery_is_handed_back_until_the_last_then_dead_lettered_once() {
    const MAX_DELIVER: u32 = 3;
    let Some((setup, _redis)) = setup("failing", MAX_DELIVER) else {
        return;
    };
    let stream = Stream::create(&setup).await;
    let job = Job {
        id: 1,
        behaviour: Behaviour::Fail,
    };
    let mut workers = Workers::start(&setup, "worker", "", 1);
    stream.publish(&[job]).await;

    workers
        .until(Duration::from_secs(60), "the job settled", async |redis| {
            count(redis, "settled", 1).await == 1
        })
        .await;

    let mut redis = brokers::connect(&setup.redis).await;
    let deliveries = deliveries(&mut redis, 1).await;
    // `max_deliver` 3: three deliveries, the third the last.
    assert_eq!(deliveries, numbered(MAX_DELIVER, MAX_DELIVER));
    assert_eq!(
        deliveries.last(),
        Some(&Delivery {
            number: 3,
            last: true
        })
    );
    assert_eq!(count(&mut redis, "handed", 1).await, MAX_DELIVER - 1);
    assert_eq!(count(&mut redis, "runs", 1).await, MAX_DELIVER * ATTEMPTS);
    let letters = brokers::letters(&setup.redis).await;
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
    assert_eq!(letters[0].attempts, MAX_DELIVER * ATTEMPTS);
    assert_eq!(letters[0].error, "timeout");
    // Terminated with its letter: gone from the stream, not delivered again.
    assert_eq!(drained(&stream).await, (0, 0));
    drop(workers);
    stream.delete().await;
}
