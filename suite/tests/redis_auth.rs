//! `RedisStore` authenticating through the URL: `requirepass` (`redis://:PASSWORD@host/`) and
//! an ACL user limited to the store's keys (`redis://USER:PASSWORD@host/`).

use jobguard::store::redis::RedisStore;
use jobguard::testing::{Claim, PlainClaim};
use jobguard::{Error, Store, StoreKey};
use jobguard_testkit::redis::{Options, RedisServer};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.redis_auth",
        key,
    }
}

/// A store that cannot authenticate fails with `Error::Store`, at connect or at its first call.
async fn fails_to_authenticate(url: &str) {
    match RedisStore::connect(url).await {
        Err(Error::Store(_)) => {}
        Err(other) => panic!("{url}: {other:?}"),
        Ok(store) => {
            let got = store.claim_plain(key("k"), "t", None, LEASE).await;
            assert!(matches!(got, Err(Error::Store(_))), "{url}: {got:?}");
        }
    }
}

#[tokio::test]
async fn a_password_in_the_url_authenticates_and_a_wrong_or_missing_one_fails() {
    let Some(server) = RedisServer::start_with(Options {
        password: Some("s3cret-pw".into()),
        ..Options::default()
    }) else {
        return;
    };
    let url = server.url();
    assert!(url.starts_with("redis://:s3cret-pw@127.0.0.1:"), "{url}");
    let store = RedisStore::connect(&url).await.unwrap();
    assert_eq!(
        store.claim_plain(key("k"), "t", None, LEASE).await,
        Ok(Claim::Acquired)
    );

    let port = server.port();
    fails_to_authenticate(&format!("redis://127.0.0.1:{port}/")).await;
    fails_to_authenticate(&format!("redis://:wrong@127.0.0.1:{port}/")).await;
}

#[tokio::test]
async fn an_acl_user_limited_to_jobguard_keys_runs_the_store() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let admin = RedisStore::connect(&server.url()).await.unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "jobs", "on", ">jobs-pw", "~jobguard:*", "+@all"])
        .query_async(&mut admin.connection())
        .await
        .unwrap();
    let url = format!("redis://jobs:jobs-pw@127.0.0.1:{}/", server.port());
    let store = RedisStore::connect(&url).await.unwrap();
    let k = key("k");
    assert_eq!(
        store.claim_plain(k, "t", None, LEASE).await,
        Ok(Claim::Acquired)
    );
    store.renew(k, "t", LEASE).await.unwrap();
    store.complete(k, "t", b"r", LEASE).await.unwrap();
    assert_eq!(
        store.claim_plain(k, "u", None, LEASE).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    // The user really is limited: a key outside the store's prefix is refused.
    let outside: redis::RedisResult<()> = redis::cmd("SET")
        .arg(&["elsewhere", "x"])
        .query_async(&mut store.connection())
        .await;
    assert!(outside.is_err());
    fails_to_authenticate(&format!("redis://jobs:nope@127.0.0.1:{}/", server.port())).await;
}
