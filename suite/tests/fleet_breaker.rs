//! Four worker processes × 50 jobs against a gateway that is down and then recovers. With the
//! breaker shared through Redis, the gateway sees the breaker's threshold of failures (plus the
//! calls already on their way when it opened) and one probe per cooldown across the fleet;
//! unshared, each worker must fail its own threshold first. After the recovery every job
//! completes.
//!
//! The outage is driven by the test, not by the clock: the gateway is down until the fleet's
//! breaker has re-opened after two failed probes (its hash's epoch, read in Redis), and then the
//! test brings it up.

mod fleet;

use fleet::{Fleet, THRESHOLD};
use redis::AsyncCommands;
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const JOBS: u32 = 50;

/// The worker role: runs only when a test below starts this binary as a worker.
#[test]
fn worker() {
    fleet::worker_if_asked();
}

/// Starts every worker on its 50 jobs, and returns once the gateway is down and counting.
async fn run_jobs(fleet: &mut Fleet) {
    for id in 0..WORKERS {
        fleet
            .send(id, &format!("breaker {} {JOBS}", id as u32 * 1000))
            .await;
    }
}

async fn every_job_completes(fleet: &mut Fleet) {
    for id in 0..WORKERS {
        assert_eq!(fleet.reply(id).await, "done", "worker {id}");
    }
    let calls = fleet.count("calls").await;
    let failures = fleet.count("failures").await;
    assert_eq!(
        calls - failures,
        u64::from(JOBS) * WORKERS as u64,
        "every job succeeded once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_breaker_lets_the_fleet_fail_its_threshold_and_one_probe_per_cooldown() {
    let Some(mut fleet) = Fleet::start(WORKERS, "breaker").await else {
        return;
    };
    fleet.gateway("down").await;
    run_jobs(&mut fleet).await;

    // Open (epoch 1), half-open and re-opened twice (epochs 2 to 5): two probes failed.
    let mut redis = fleet::connect(&fleet.redis.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let epoch: Option<u64> = redis
            .hget("jobguard:{breaker:gateway}", "epoch")
            .await
            .unwrap();
        if epoch.unwrap_or(0) >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet's breaker did not cycle"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let failures_while_down = fleet.count("failures").await;
    let epoch_at_recovery: u64 = redis
        .hget("jobguard:{breaker:gateway}", "epoch")
        .await
        .unwrap();
    fleet.gateway("up").await;
    every_job_completes(&mut fleet).await;

    // Each failed probe is one open → half-open → open cycle: two epochs.
    let probes = (epoch_at_recovery - 1) / 2;
    let in_flight = WORKERS as u64 - 1;
    println!(
        "shared: the gateway saw {failures_while_down} failures: threshold {THRESHOLD}, \
         {probes} failed probes, at most {in_flight} calls in flight at the opening"
    );
    assert!(
        failures_while_down <= THRESHOLD + in_flight + probes,
        "{failures_while_down} failures > {THRESHOLD} + {in_flight} in flight + {probes} probes"
    );
    assert_eq!(
        fleet.count("failures").await,
        failures_while_down,
        "no failure after the recovery"
    );
    let state: String = redis
        .hget("jobguard:{breaker:gateway}", "state")
        .await
        .unwrap();
    assert_eq!(state, "closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unshared_breakers_each_fail_their_own_threshold() {
    let Some(mut fleet) = Fleet::start(WORKERS, "").await else {
        return;
    };
    fleet.gateway("down").await;
    run_jobs(&mut fleet).await;
    // Every worker has to trip its own breaker: the gateway sees each one's threshold.
    let own = THRESHOLD * WORKERS as u64;
    let failures = fleet
        .wait_for_count("failures", own, Duration::from_secs(30))
        .await;
    println!(
        "unshared: the gateway saw {failures} failures before the recovery (each worker's {THRESHOLD})"
    );
    assert!(failures >= own);
    fleet.gateway("up").await;
    every_job_completes(&mut fleet).await;
}
