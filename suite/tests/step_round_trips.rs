//! Durable steps on a real `redis-server`, counted in round trips (the server's `INFO
//! commandstats`, one script call a round trip): a step costs one round trip to record and none
//! to replay, and a job resumed with k recorded steps costs one round trip, its claim, before
//! its first new step.

use jobguard::{RedisStore, Runtime};
use jobguard_testkit::redis::{RedisServer, script_calls};
use redis::aio::ConnectionManager;

#[jobguard::step]
async fn effect(n: u32) -> Result<u32, jobguard::Error> {
    Ok(n)
}

/// `k` steps, then, when `more`, one new step whose body reads the script calls so far; fails
/// at the end when `fail`.
#[jobguard::idempotent(key = key, scope = "trips.job")]
async fn job(
    key: &str,
    k: u32,
    more: Option<&ConnectionManager>,
    fail: bool,
) -> Result<Option<u64>, jobguard::Error> {
    for n in 0..k {
        effect(n).await?;
    }
    let mut seen = None;
    if let Some(redis) = more {
        let mut redis = redis.clone();
        seen = jobguard::step("new", async move {
            Ok::<_, jobguard::Error>(script_calls(&mut redis).await)
        })
        .await
        .map(Some)?;
    }
    if fail {
        return Err(jobguard::Error::Timeout);
    }
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_to_record_none_to_replay_and_one_claim_to_resume() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mut redis = ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap();
    let runtime = Runtime::builder()
        .store(RedisStore::connect(&url).await.unwrap())
        .build();
    // Every script loaded once (a first call finds NOSCRIPT and sends the script).
    runtime.scope(job("warm", 1, None, true)).await.unwrap_err();
    runtime.scope(job("warm", 1, None, false)).await.unwrap();

    // A first run records k = 5 steps and fails: a claim, 5 records, a release.
    let before = script_calls(&mut redis).await;
    runtime
        .scope(job("order", 5, None, true))
        .await
        .unwrap_err();
    assert_eq!(script_calls(&mut redis).await - before, 1 + 5 + 1);

    // The next run replays the 5 steps: its claim is the one round trip before its first new
    // step; then that step's record and the completion.
    let before = script_calls(&mut redis).await;
    let seen = runtime
        .scope(job("order", 5, Some(&redis), false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        seen - before,
        1,
        "the claim, and no round trip for the 5 replays"
    );
    assert_eq!(script_calls(&mut redis).await - before, 1 + 1 + 1);
}
