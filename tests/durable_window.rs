//! The window, shown with real processes: a worker killed after its job's effect and before the
//! result was stored leaves a claim that lapses with its lease, and the next delivery runs the
//! job again. The effect lands twice when it is a plain write, and once when the job passes its
//! key to a downstream that applies each key once.

mod durable;

use durable::{Downstream, Job, Workers, connect, deliveries, effects, runs};
use jobguard_testkit::redis::RedisServer;
use std::time::Duration;

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    durable::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_effect_and_stored_result_repeats_the_effect_unless_downstream_dedupes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mut workers = Workers::start(&url, "worker", "effect:1,2", 2);
    let plain = Job {
        id: 1,
        downstream: Downstream::Plain,
    };
    let deduped = Job {
        id: 2,
        downstream: Downstream::Dedupe,
    };
    durable::push(&url, &[plain, deduped], 1).await;
    workers.run_until_done(2, Duration::from_secs(60)).await;

    let mut redis = connect(&url).await;
    assert_eq!(workers.kills.len(), 2, "{:?}", workers.kills);
    // Both bodies ran twice: once on the killed worker, once after the lease lapsed (a
    // redelivery that came before it found the key in progress, failed, and was delivered again).
    for job in [plain, deduped] {
        assert_eq!(runs(&mut redis, job.id).await, 2, "{job:?}");
        let seen = deliveries(&mut redis, job.id).await;
        assert_eq!(seen.len(), 2, "{job:?}: {seen:?}");
        assert_eq!(seen[0], 1, "{job:?}: {seen:?}");
    }
    assert_eq!(
        effects(&mut redis, plain.id).await,
        2,
        "a plain effect repeats"
    );
    assert_eq!(
        effects(&mut redis, deduped.id).await,
        1,
        "the downstream applied the key once"
    );
}
