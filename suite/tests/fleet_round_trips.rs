//! What a shared breaker costs Redis, counted by the server (`INFO commandstats`): a success
//! sends nothing, and a failure one script (`EVALSHA`), whose answer the call waits for.

use jobguard::{CircuitBreaker, RedisStore};
use jobguard_testkit::redis::RedisServer;
use std::collections::BTreeMap;
use std::time::Duration;

static GATEWAY: CircuitBreaker = CircuitBreaker::new(u32::MAX, Duration::from_secs(30));

#[jobguard::retry(attempts = 1, breaker = GATEWAY)]
async fn call(fail: bool) -> Result<(), jobguard::Error> {
    match fail {
        true => Err(jobguard::Error::Timeout),
        false => Ok(()),
    }
}

/// The server's count of calls of each command since the last reset, without `info` and
/// `config` (the counting itself).
async fn commands(
    connection: &mut jobguard::store::redis::RedisConnection,
) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(connection)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("info") && !name.starts_with("config"))
                .then(|| (name.to_owned(), calls))
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_success_costs_no_round_trip_and_a_failure_one_script() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    GATEWAY.share(&store, "gateway").await.unwrap();
    let mut connection = store.connection();
    // The first failure loads the script (`NOSCRIPT`, then `SCRIPT LOAD`).
    let _ = call(true).await;
    call(false).await.unwrap(); // the fleet's count goes back to 0, in the background
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let count: Option<u64> = redis::cmd("HGET")
            .arg("jobguard:{breaker:gateway}")
            .arg("count")
            .query_async(&mut connection)
            .await
            .unwrap();
        if count == Some(0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the success was not reported"
        );
        tokio::task::yield_now().await;
    }
    commands(&mut connection).await;

    for _ in 0..1000 {
        call(false).await.unwrap();
    }
    assert_eq!(
        commands(&mut connection).await,
        BTreeMap::new(),
        "1000 successes"
    );

    for _ in 0..100 {
        assert_eq!(call(true).await, Err(jobguard::Error::Timeout));
    }
    let counted = commands(&mut connection).await;
    assert_eq!(counted.get("evalsha"), Some(&100), "{counted:?}");
    assert_eq!(
        counted.get("evalsha").copied(),
        counted.get("hincrby").copied()
    );
}
