//! `RedisStore` at the `Store` trait level, against a private `redis-server` per test: the store
//! conformance suite (claim, complete and replay, release, renew, lease expiry, the token
//! compare-and-set, fingerprints, key hashing and scope isolation, racing claims and
//! deliveries; `jobguard_testkit::conformance`), then what only Redis has: corrupt records, the
//! key scheme, and an unreachable URL.
//!
//! These run on the real clock: the lease lives in the server, whose clock tokio cannot pause.
//! Where a lease must lapse it is short (300 ms), and the tests poll the server with a deadline
//! rather than sleep for a guessed time.

use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::conformance;

use conformance::{RedisBackend, tricky_pairs};
use jobguard::store::redis::RedisStore;
use jobguard::{Error, StoreKey};
use jobguard_testkit::redis::RedisServer;
use std::collections::HashSet;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.redis",
        key,
    }
}

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url()).await.expect("connect")
}

/// A fresh server and a store on it; `None` (skipped) without `redis-server`.
async fn single_node() -> Option<RedisBackend<RedisServer>> {
    let server = RedisServer::start()?;
    let store = connect(&server).await;
    Some(RedisBackend {
        guard: server,
        store,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_conformance_suite_passes_on_redis() {
    let Some(backend) = single_node().await else {
        return;
    };
    let server = std::sync::Arc::new(backend.guard);
    let store = backend.store;
    jobguard::testing::check_backend(|| async {
        let backend = RedisBackend {
            guard: server.clone(),
            store: store.clone(),
        };
        backend.clear().await;
        backend
    })
    .await;
}

#[tokio::test]
async fn a_record_that_cannot_be_decoded_is_corrupt_and_never_a_panic() {
    let Some(backend) = single_node().await else {
        return;
    };
    conformance::a_record_that_cannot_be_decoded_is_corrupt_and_never_a_panic(&backend.store).await;
}

#[tokio::test]
async fn records_of_the_first_layout_are_read() {
    let Some(backend) = single_node().await else {
        return;
    };
    conformance::records_of_the_first_layout_are_read(&backend.store).await;
}

#[test]
fn no_two_distinct_scope_key_pairs_share_a_redis_key() {
    let pairs = tricky_pairs();
    let mut seen = HashSet::new();
    for (scope, key) in &pairs {
        let rk = RedisStore::redis_key(StoreKey { scope, key });
        assert!(rk.starts_with("jobguard:"));
        assert!(
            seen.insert(rk.clone()),
            "({scope:?}, {key:?}) collides at {rk:?}"
        );
    }
    // And over every short key from a small alphabet that covers the special bytes, in two scopes.
    let alphabet = ["a", ":", "#", " ", "%", "\u{e9}", "\t"];
    let mut all = HashSet::new();
    let mut count = 0;
    for scope in ["p", "p.q", "", "%"] {
        for a in alphabet {
            for b in alphabet {
                for c in ["", "a", "#", ":"] {
                    let key = format!("{a}{b}{c}");
                    let rk = RedisStore::redis_key(StoreKey { scope, key: &key });
                    count += 1;
                    assert!(all.insert(rk), "({scope:?}, {key:?}) collides");
                }
            }
        }
    }
    assert_eq!(all.len(), count);
}

#[tokio::test]
async fn a_clone_shares_the_connection_and_an_unreachable_url_is_a_store_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let copy = store.clone();
    assert_eq!(
        store.claim_plain(key("k"), "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    assert!(matches!(
        copy.claim_plain(key("k"), "u", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    let port = server.port();
    drop((store, copy, server));
    let down = RedisStore::connect(&format!("redis://127.0.0.1:{port}/")).await;
    assert!(matches!(down, Err(Error::Store(_))), "{down:?}");
    let bad = RedisStore::connect("not a url").await;
    assert!(matches!(bad, Err(Error::Store(_))), "{bad:?}");
}
