//! The three crash scenarios every consumer-loop broker must pass (`rabbitmq_durable.rs`,
//! `nats_durable.rs`), written once over [`TestQueue`]:
//!
//! * [`killed_before_the_ack`]: a worker SIGKILLed after the job's result was stored and before
//!   its ack: the broker delivers the job again (counting the dead worker's delivery), the next
//!   worker replays the stored result, and the effect lands once;
//! * [`poisoned`]: a job that aborts its worker every time it runs: it runs 3 times
//!   (`crashes = 3`), then the next delivery is refused as poisoned, dead-letters the job once
//!   (`crashed`) and settles it with the broker, and it never runs again;
//! * [`failing_on_every_delivery`]: a job failing with a transient error on every attempt: handed
//!   back on each delivery but the last, then dead-lettered once, on the last, with every attempt
//!   of every delivery counted, and settled with the broker.
//!
//! Each skips (returns) when its broker or `redis-server` is missing.

use super::{
    ATTEMPTS, Behaviour, Job, Kind, Setup, Workers, connect, count, deliveries, letters, numbered,
    parse_crashes,
};
use jobguard::{Delivery, GiveUp};
use jobguard_testkit::broker::{Broker, unique_name};
use jobguard_testkit::redis::RedisServer;
use std::time::{Duration, Instant};

/// A queue (or stream) of the test's own on a broker, with what the scenarios ask of it.
pub trait TestQueue: Sized {
    /// The broker.
    const BROKER: Broker;
    /// Which worker loop consumes it.
    const KIND: Kind;

    /// The broker's limit setting that gives a job `deliveries` deliveries in all.
    fn limit(deliveries: u32) -> u32;

    /// Declares the queue `setup.name` with the limit `setup.limit`.
    async fn create(setup: &Setup) -> Self;

    /// Publishes each job, and waits for the broker to confirm it stored it.
    async fn publish(&self, jobs: &[Job]);

    /// What is left: messages the broker still holds for delivery, and messages it set aside
    /// (RabbitMQ's parked queue; NATS: those its consumer has yet to deliver).
    async fn left(&self) -> (u64, u64);

    /// Deletes the queue, and what belongs to it.
    async fn delete(self);
}

/// The test's queue on `Q`'s broker, and its private Redis, or `None` (skipped).
fn setup<Q: TestQueue>(what: &str, deliveries: u32) -> Option<(Setup, RedisServer)> {
    let url = Q::BROKER.url()?;
    let redis = RedisServer::start()?;
    let setup = Setup {
        kind: Q::KIND,
        url,
        name: unique_name(what),
        limit: Q::limit(deliveries),
        redis: redis.url(),
    };
    Some((setup, redis))
}

/// Jobs `ids`, each with the effect once, but for `odd`'s, which behaves as it says.
pub fn jobs(ids: std::ops::Range<u32>, odd: Option<(u32, Behaviour)>) -> Vec<Job> {
    ids.map(|id| Job {
        id,
        behaviour: match odd {
            Some((odd, behaviour)) if odd == id => behaviour,
            _ => Behaviour::Effect,
        },
    })
    .collect()
}

/// Polls until nothing is left in the queue, or 10 s passed; returns what is left. The broker
/// settles an ack after answering it (a quorum queue through its log, a work-queue stream as
/// it processes the ack), so a check right after the last ack could still see the message.
async fn drained<Q: TestQueue>(queue: &Q) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = queue.left().await;
        if left == (0, 0) || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker SIGKILLed after the job's result was stored and before the ack: the job is
/// replayed on its redelivery, and its effect lands once.
pub async fn killed_before_the_ack<Q: TestQueue>() {
    let Some((setup, _redis)) = setup::<Q>("killed", 5) else {
        return;
    };
    let queue = Q::create(&setup).await;
    let jobs = jobs(0..12, None);
    let crash = "acked:2,7,11";
    let mut workers = Workers::start(&setup, "worker", crash, 2);
    queue.publish(&jobs).await;

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

    let mut redis = connect(&setup.redis).await;
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
    assert_eq!(kills, parse_crashes(crash));
    for (_, id) in &kills {
        // The dead worker's delivery counts (the broker took it back unacknowledged): the
        // replay came on delivery 2, and was acked.
        assert_eq!(
            deliveries(&mut redis, *id).await,
            numbered(2, 0),
            "job {id}"
        );
        assert_eq!(count(&mut redis, "acked", *id).await, 1, "job {id}");
    }
    assert!(letters(&setup.redis).await.is_empty());
    assert_eq!(drained(&queue).await, (0, 0));
    drop(workers);
    queue.delete().await;
}

/// A job that kills its worker every time: dead-lettered once after three crashes, settled with
/// the broker, and never run a fourth time.
pub async fn poisoned<Q: TestQueue>() {
    const POISON: u32 = 3;
    let Some((setup, _redis)) = setup::<Q>("poison", 5) else {
        return;
    };
    let queue = Q::create(&setup).await;
    let jobs = jobs(0..6, Some((POISON, Behaviour::Abort)));
    let mut workers = Workers::start(&setup, "worker", "", 2).allow_exits();
    queue.publish(&jobs).await;

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

    let mut redis = connect(&setup.redis).await;
    // Three runs, each killing its worker; the fourth delivery was refused, and settled.
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
    let letters = letters(&setup.redis).await;
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Crashed);
    assert_eq!(letters[0].job, "brokers.effect");
    assert_eq!(letters[0].key.as_deref(), Some("3"));
    assert_eq!(letters[0].attempts, 3);
    // Settled: nothing left to deliver or set aside, and no fourth run.
    assert_eq!(drained(&queue).await, (0, 0));
    assert_eq!(count(&mut redis, "runs", POISON).await, 3);
    drop(workers);
    queue.delete().await;
}

/// A job failing on every attempt: handed back on every delivery but the last, then
/// dead-lettered once with every attempt counted, and settled with the broker.
pub async fn failing_on_every_delivery<Q: TestQueue>() {
    const DELIVERIES: u32 = 3;
    let Some((setup, _redis)) = setup::<Q>("failing", DELIVERIES) else {
        return;
    };
    let queue = Q::create(&setup).await;
    let job = Job {
        id: 1,
        behaviour: Behaviour::Fail,
    };
    let mut workers = Workers::start(&setup, "worker", "", 1);
    queue.publish(&[job]).await;

    workers
        .until(Duration::from_secs(60), "the job settled", async |redis| {
            count(redis, "settled", 1).await == 1
        })
        .await;

    let mut redis = connect(&setup.redis).await;
    let deliveries = deliveries(&mut redis, 1).await;
    assert_eq!(deliveries, numbered(DELIVERIES, DELIVERIES));
    assert_eq!(
        deliveries.last(),
        Some(&Delivery {
            number: DELIVERIES,
            last: true
        })
    );
    assert_eq!(count(&mut redis, "handed", 1).await, DELIVERIES - 1);
    assert_eq!(count(&mut redis, "runs", 1).await, DELIVERIES * ATTEMPTS);
    let letters = letters(&setup.redis).await;
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
    assert_eq!(letters[0].attempts, DELIVERIES * ATTEMPTS);
    assert_eq!(letters[0].error, "timeout");
    // Settled with its letter: not set aside by the broker, not delivered again.
    assert_eq!(drained(&queue).await, (0, 0));
    drop(workers);
    queue.delete().await;
}
