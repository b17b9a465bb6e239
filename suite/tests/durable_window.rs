//! The window, shown with real processes, and the fence that closes half of it.
//!
//! * A worker killed after its job's effect and before the result was stored leaves a claim
//!   that lapses with its lease, and the next delivery runs the job again. The effect lands
//!   twice when it is a plain write, and once when the job passes its key to a downstream that
//!   applies each key once.
//! * A worker paused (`SIGSTOP`, as a GC pause or a stalled VM) after its claim and before its
//!   write loses its lease; the next delivery takes the claim over (a larger generation), writes
//!   and completes. Then the paused worker wakes up and writes too: the effect lands twice when
//!   it is a plain write, and once when the write carries `jobguard::fence()` to a downstream
//!   that refuses a fence smaller than the largest it has seen.

mod durable;

use durable::{
    Downstream, Job, Workers, connect, deliveries, effects, fences, refused, runs, written,
};
use jobguard_testkit::redis::RedisServer;
use std::time::{Duration, Instant};

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
    // A paused worker that wakes up may find its task gone from the broker and stop: it is
    // restarted like a killed one.
    let mut workers = Workers::start(&url, "worker", "effect:1,2;stall:3,4", 4).allow_exits();
    let plain = Job {
        id: 1,
        downstream: Downstream::Plain,
    };
    let deduped = Job {
        id: 2,
        downstream: Downstream::Dedupe,
    };
    let paused_plain = Job {
        id: 3,
        downstream: Downstream::Plain,
    };
    let paused_fenced = Job {
        id: 4,
        downstream: Downstream::Fenced,
    };
    let jobs = [plain, deduped, paused_plain, paused_fenced];
    durable::push(&url, &jobs, 1).await;
    workers
        .run_until_done(jobs.len(), Duration::from_secs(60))
        .await;

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

    // The paused jobs were completed by the worker that took their claims over; the paused
    // workers wake up now and make their late writes.
    for job in [paused_plain, paused_fenced] {
        assert_eq!(written(&mut redis, job.id).await, 1, "{job:?}");
        assert_eq!(effects(&mut redis, job.id).await, 1, "{job:?}");
    }
    assert_eq!(workers.stalled.len(), 2, "{:?}", workers.stalled);
    workers.resume_stalled(&mut redis).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while written(&mut redis, paused_plain.id).await < 2
        || refused(&mut redis, paused_fenced.id).await < 1
    {
        workers.kill_held(&mut redis).await;
        assert!(Instant::now() < deadline, "no late write after 20 s");
        // Polls for the woken workers' writes; they run on their own.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for job in [paused_plain, paused_fenced] {
        assert_eq!(runs(&mut redis, job.id).await, 2, "{job:?}");
    }
    assert_eq!(
        effects(&mut redis, paused_plain.id).await,
        2,
        "the paused worker's late plain write lands: a lease cannot stop it"
    );
    assert_eq!(
        effects(&mut redis, paused_fenced.id).await,
        1,
        "the fenced downstream refused the paused worker's late write"
    );
    assert_eq!(refused(&mut redis, paused_fenced.id).await, 1);
    assert_eq!(
        fences(&mut redis, paused_fenced.id).await,
        [2, 1],
        "the takeover wrote with generation 2, then the paused worker with generation 1"
    );
}
