//! A breaker and a retry budget shared through a Redis Cluster (3 masters, 3 replicas). Two
//! breakers of this process shared under one name stand for two workers: failures through one
//! open the other, the transition published on the master of the breaker's slot and heard
//! through the seed node the other subscribed to. Each one's keys are one hash in one slot.

use jobguard::{BreakerState, CircuitBreaker, RedisStore, RetryBudget};
use jobguard_testkit::cluster::{RedisCluster, key_slot};
use jobguard_testkit::gateway::GatewayError;
use std::time::{Duration, Instant};

static ONE: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(30)).named("one");
static OTHER: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(30)).named("other");
static RETRIES: RetryBudget = RetryBudget::new(0.5, 0, Duration::from_secs(10));

#[jobguard::retry(attempts = 1, breaker = ONE)]
async fn down() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 2, base = "1ms", jitter = none, retry_budget = RETRIES)]
async fn flaky(first: &std::sync::atomic::AtomicBool) -> Result<(), GatewayError> {
    match first.swap(false, std::sync::atomic::Ordering::SeqCst) {
        true => Err(GatewayError::Timeout),
        false => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_and_a_budget_are_shared_through_a_cluster() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let store = RedisStore::connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster");
    ONE.share(&store, "gateway").await.unwrap();
    OTHER.share(&store, "gateway").await.unwrap();
    RETRIES.share(&store, "gateway").await.unwrap();
    assert!(matches!(
        ONE.share(&store, "gateway").await,
        Err(jobguard::Error::Config(_))
    ));

    for _ in 0..3 {
        assert_eq!(down().await, Err(GatewayError::Timeout));
    }
    assert_eq!(
        ONE.state(),
        BreakerState::Open,
        "the third failure opened it"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while OTHER.state() != BreakerState::Open {
        assert!(
            Instant::now() < deadline,
            "the opening did not reach the other breaker"
        );
        tokio::task::yield_now().await;
    }

    // Half a retry per call, and no floor: the first call's retry is refused, the second's
    // granted by the two calls' deposits, handed to the fleet.
    let first = std::sync::atomic::AtomicBool::new(true);
    assert_eq!(
        flaky(&first).await,
        Err(GatewayError::Timeout),
        "0.5: no retry yet"
    );
    let first = std::sync::atomic::AtomicBool::new(true);
    assert_eq!(flaky(&first).await, Ok(()), "0.5 + 0.5: one retry");

    // One hash each, each in one slot, on the master that serves it.
    for key in [
        "jobguard:{breaker:gateway}",
        "jobguard:{retry_budget:gateway}",
    ] {
        let slot = key_slot(key.as_bytes());
        let tag = &key[key.find('{').unwrap() + 1..key.find('}').unwrap()];
        assert_eq!(slot, key_slot(tag.as_bytes()));
        let mut connection = store.connection();
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(kind, "hash", "{key}");
    }
}
