//! A retry budget of 10% shared by four worker processes: three make 50 calls each that
//! succeed, the fourth makes 50 whose first attempts all fail. Its retries are funded by the
//! whole fleet's calls, and stay within 10% of the fleet's calls plus the floor; with budgets of
//! their own, it gets only its own 10% and the floor.

mod fleet;

use fleet::{FLOOR, Fleet, RATIO};
use redis::AsyncCommands;
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const JOBS: u32 = 50;

/// The worker role: runs only when a test below starts this binary as a worker.
#[test]
fn worker() {
    fleet::worker_if_asked();
}

/// Runs the healthy workers' calls, then the failing worker's; returns its retries granted
/// and refused.
async fn unbalanced(fleet: &mut Fleet, shared: Option<&str>) -> (u64, u64) {
    fleet.gateway("up").await;
    for id in 1..WORKERS {
        fleet
            .send(id, &format!("budget {} {JOBS}", id as u32 * 1000))
            .await;
    }
    for id in 1..WORKERS {
        assert_eq!(fleet.reply(id).await, format!("done {JOBS} 0"));
    }
    if let Some(url) = shared {
        // The healthy workers hand their deposits over once a slot (a second): wait until the
        // fleet holds them all (150 calls × 0.1 retry, in thousandths).
        let mut redis = fleet::connect(url).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let slots: Vec<i64> = redis
                .hvals("jobguard:{retry_budget:gateway}")
                .await
                .unwrap();
            if slots.iter().sum::<i64>() >= 15_000 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "deposits not handed over: {slots:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    fleet.gateway("first").await;
    let calls_before = fleet.count("calls").await;
    let reply = fleet.ask(0, &format!("budget 0 {JOBS}")).await;
    let words: Vec<u64> = reply
        .split(' ')
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect();
    let (ok, gave_up) = (words[0], words[1]);
    let retries = fleet.count("calls").await - calls_before - u64::from(JOBS);
    assert_eq!(ok, retries, "each retry granted succeeded");
    assert_eq!(gave_up, u64::from(JOBS) - retries, "each refusal gave up");
    (retries, gave_up)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_budget_holds_the_fleet_s_retries_to_its_ratio_of_the_fleet_s_calls() {
    let Some(mut fleet) = Fleet::start(WORKERS, "budget").await else {
        return;
    };
    let url = fleet.redis.url();
    let (retries, refused) = unbalanced(&mut fleet, Some(&url)).await;
    let calls = u64::from(JOBS) * WORKERS as u64;
    let bound = (RATIO * calls as f64) as u64 + FLOOR;
    let own = (RATIO * f64::from(JOBS)) as u64 + FLOOR;
    println!(
        "shared: {retries} retries ({refused} refused) for {calls} calls across the fleet: \
         bound {bound}; a budget of its own would allow {own}"
    );
    assert!(retries <= bound, "{retries} retries > {bound}");
    assert!(
        retries > own,
        "{retries} retries: the other workers' calls funded none"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unshared_budgets_fund_a_worker_s_retries_from_its_own_calls_only() {
    let Some(mut fleet) = Fleet::start(WORKERS, "").await else {
        return;
    };
    let (retries, _) = unbalanced(&mut fleet, None).await;
    let own = (RATIO * f64::from(JOBS)) as u64 + FLOOR;
    println!("unshared: {retries} retries, its own 10% and the floor: {own}");
    assert!(retries <= own, "{retries} > {own}");
}
