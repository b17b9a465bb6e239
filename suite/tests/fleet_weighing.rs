//! One worker's burst of failures is weighed against the fleet's successes, by each breaker's
//! own rule. Two breakers of this process shared under one name stand for two workers.
//!
//! - Failures in a row: a success on the other worker resets the fleet's count, so two bursts
//!   of two failures do not open a breaker of three.
//! - Failure rate: one worker's window full of failures against the other's full of successes
//!   is half the fleet's calls, under a ratio of 0.75.

use jobguard::{BreakerState, CircuitBreaker, RedisStore};
use jobguard_testkit::redis::RedisServer;
use redis::AsyncCommands;
use std::time::{Duration, Instant};

static BURSTY: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(30));
static STEADY: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(30));
static BURSTY_RATE: CircuitBreaker =
    CircuitBreaker::failure_rate(0.75, 10, Duration::from_secs(30));
static STEADY_RATE: CircuitBreaker =
    CircuitBreaker::failure_rate(0.75, 10, Duration::from_secs(30));

/// Waits until the fleet's `count` of failures for `name` is `count`.
async fn fleet_count(redis: &mut redis::aio::ConnectionManager, name: &str, count: u64) {
    let key = format!("jobguard:{{breaker:{name}}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Option<u64> = redis.hget(&key, "count").await.unwrap();
        if now == Some(count) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet's count is {now:?}, not {count}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One call through `breaker` that fails, its report awaited as the retry engine awaits it.
async fn fail(breaker: &'static CircuitBreaker) {
    #[jobguard::retry(attempts = 1, breaker = breaker)]
    async fn call(breaker: &'static CircuitBreaker) -> Result<(), jobguard::Error> {
        let _ = breaker;
        Err(jobguard::Error::Timeout)
    }
    let _ = call(breaker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_one_worker_is_weighed_against_the_others_successes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut redis = redis::aio::ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap();
    for (breaker, name) in [
        (&BURSTY, "row"),
        (&STEADY, "row"),
        (&BURSTY_RATE, "rate"),
        (&STEADY_RATE, "rate"),
    ] {
        breaker.share(&store, name).await.unwrap();
    }

    // In a row: 2 failures, then the other worker's success resets the fleet's count.
    fail(&BURSTY).await;
    fail(&BURSTY).await;
    fleet_count(&mut redis, "row", 2).await;
    // The steady worker's next success, once it has heard of the count, resets it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        STEADY.acquire().unwrap().success();
        let count: Option<u64> = redis.hget("jobguard:{breaker:row}", "count").await.unwrap();
        if count == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the success did not reset the count"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    fail(&BURSTY).await;
    fail(&BURSTY).await;
    assert_eq!(
        BURSTY.state(),
        BreakerState::Closed,
        "two and two are not three in a row"
    );
    fail(&BURSTY).await;
    assert_eq!(
        BURSTY.state(),
        BreakerState::Open,
        "three in a row across the fleet"
    );

    // Rate: a window of 10 successes on the steady worker.
    for _ in 0..10 {
        STEADY_RATE.acquire().unwrap().success();
    }
    fail(&BURSTY_RATE).await;
    // The steady worker goes on succeeding; once it has heard that the fleet counts a failure,
    // its next success hands its window over.
    let key = "jobguard:{breaker:rate}";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        STEADY_RATE.acquire().unwrap().success();
        let windows: Vec<String> = redis.hkeys(key).await.unwrap();
        if windows.iter().filter(|k| k.starts_with("w:")).count() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the steady window was not handed over"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for _ in 0..9 {
        fail(&BURSTY_RATE).await;
    }
    assert_eq!(
        BURSTY_RATE.state(),
        BreakerState::Closed,
        "10 failures of 20 calls: half, under 0.75"
    );
}
