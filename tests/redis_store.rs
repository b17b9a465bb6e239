//! `RedisStore` at the `Store` trait level, against a private `redis-server` per test: claim,
//! complete and replay, release, renew, lease expiry, the token compare-and-set, fingerprints,
//! corrupt records, key hashing and scope isolation.
//!
//! These run on the real clock: the lease lives in the server, whose clock tokio cannot pause.
//! Where a lease must lapse it is short (300 ms), and the tests poll the server with a deadline
//! rather than sleep for a guessed time.

use jobguard::store::redis::RedisStore;
use jobguard::{Claim, Error, Store, StoreKey};
use jobguard_testkit::redis::RedisServer;
use std::collections::HashSet;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(300);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.redis",
        key,
    }
}

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url()).await.expect("connect")
}

/// Runs a raw command on the store's own connection.
async fn raw<T: redis::FromRedisValue>(store: &RedisStore, cmd: &mut redis::Cmd) -> T {
    cmd.query_async(&mut store.manager())
        .await
        .expect("raw command")
}

async fn pttl(store: &RedisStore, k: StoreKey<'_>) -> i64 {
    raw(store, redis::cmd("PTTL").arg(RedisStore::redis_key(k))).await
}

#[tokio::test]
async fn a_claim_is_exclusive_and_a_completed_record_replays() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("order-A");
    assert_eq!(store.claim(k, "t1", None, LONG).await, Ok(Claim::Acquired));
    let Ok(Claim::InProgress { retry_in }) = store.claim(k, "t2", None, LONG).await else {
        panic!("a second claim must find the first in progress");
    };
    assert!(
        retry_in > Duration::from_secs(58) && retry_in <= LONG,
        "{retry_in:?}"
    );
    assert!((1..=60_000).contains(&pttl(&store, k).await));

    store
        .complete(k, "t1", br#"{"v":1,"ok":7}"#, DAY)
        .await
        .unwrap();
    for token in ["t1", "t2", "t3"] {
        assert_eq!(
            store.claim(k, token, None, LONG).await,
            Ok(Claim::Completed(br#"{"v":1,"ok":7}"#.to_vec()))
        );
    }
    // The record is kept for the TTL, not the lease.
    let ttl = pttl(&store, k).await;
    assert!(ttl > 86_000_000 && ttl <= 86_400_000, "{ttl}");
    // Binary records survive unchanged.
    let b = key("binary");
    let bytes: Vec<u8> = (0..=255).collect();
    assert_eq!(store.claim(b, "t", None, LONG).await, Ok(Claim::Acquired));
    store.complete(b, "t", &bytes, DAY).await.unwrap();
    assert_eq!(
        store.claim(b, "u", None, LONG).await,
        Ok(Claim::Completed(bytes))
    );
}

#[tokio::test]
async fn release_frees_the_key_only_for_its_holder() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    assert_eq!(store.claim(k, "t1", None, LONG).await, Ok(Claim::Acquired));
    store.release(k, "intruder").await.unwrap();
    // Nor a token that the holder's starts with, or one that starts with the holder's.
    for other in ["t", "t1:", "t10", ""] {
        store.release(k, other).await.unwrap();
        assert_eq!(store.renew(k, other, LONG).await, Err(Error::LeaseLost));
        assert_eq!(
            store.complete(k, other, b"r", DAY).await,
            Err(Error::LeaseLost)
        );
    }
    assert!(matches!(
        store.claim(k, "t2", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    store.release(k, "t1").await.unwrap();
    assert_eq!(pttl(&store, k).await, -2, "the key is gone");
    assert_eq!(store.claim(k, "t2", None, LONG).await, Ok(Claim::Acquired));
    // Releasing a key nobody holds is not an error.
    store.release(key("never-claimed"), "t").await.unwrap();
}

#[tokio::test]
async fn renew_extends_the_lease_only_for_its_holder() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    assert_eq!(store.claim(k, "t1", None, SHORT).await, Ok(Claim::Acquired));
    assert!(pttl(&store, k).await <= 300);
    store.renew(k, "t1", LONG).await.unwrap();
    assert!(pttl(&store, k).await > 59_000);
    assert_eq!(store.renew(k, "t2", SHORT).await, Err(Error::LeaseLost));
    assert!(
        pttl(&store, k).await > 59_000,
        "a stranger's renew changes nothing"
    );
    assert_eq!(
        store.renew(key("absent"), "t1", LONG).await,
        Err(Error::LeaseLost)
    );
}

/// Claims `k` until it is acquired; panics after `within`. Returns when it was acquired.
async fn claim_when_free(store: &RedisStore, k: StoreKey<'_>, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        match store.claim(k, "successor", None, LONG).await {
            Ok(Claim::Acquired) => return Instant::now(),
            Ok(Claim::InProgress { retry_in }) => {
                assert!(Instant::now() < deadline, "still held after {within:?}");
                // Wait for as long as the server says the lease has left, a little at a time.
                tokio::time::sleep(retry_in.min(Duration::from_millis(20))).await;
            }
            other => panic!("unexpected claim: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_lease_lapses_after_its_duration_and_not_before() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    let before = Instant::now();
    assert_eq!(store.claim(k, "t1", None, SHORT).await, Ok(Claim::Acquired));
    let Ok(Claim::InProgress { retry_in }) = store.claim(k, "t2", None, SHORT).await else {
        panic!("held");
    };
    assert!(
        retry_in <= SHORT && retry_in > Duration::ZERO,
        "{retry_in:?}"
    );
    let acquired = claim_when_free(&store, k, Duration::from_secs(5)).await;
    let held_for = acquired - before;
    // Redis expires at millisecond precision: allow 1 ms of rounding.
    assert!(held_for >= SHORT - Duration::from_millis(1), "{held_for:?}");
    assert!(held_for < SHORT + Duration::from_secs(2), "{held_for:?}");
}

#[tokio::test]
async fn a_stale_token_can_neither_complete_release_nor_renew_its_successors_claim() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    assert_eq!(
        store.claim(k, "stale", None, SHORT).await,
        Ok(Claim::Acquired)
    );
    claim_when_free(&store, k, Duration::from_secs(5)).await; // "successor" holds it now

    assert_eq!(
        store.complete(k, "stale", b"stale result", DAY).await,
        Err(Error::LeaseLost)
    );
    assert_eq!(store.renew(k, "stale", DAY).await, Err(Error::LeaseLost));
    store.release(k, "stale").await.unwrap();
    // The successor's claim is untouched: still held, with its own lease.
    assert!(matches!(
        store.claim(k, "third", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    assert!(pttl(&store, k).await > 59_000);
    store.renew(k, "successor", LONG).await.unwrap();
    store
        .complete(k, "successor", b"result", DAY)
        .await
        .unwrap();

    // Once completed, no token holds a claim: not even the one that completed it.
    for token in ["stale", "successor"] {
        assert_eq!(
            store.complete(k, token, b"overwrite", DAY).await,
            Err(Error::LeaseLost)
        );
        assert_eq!(store.renew(k, token, SHORT).await, Err(Error::LeaseLost));
        store.release(k, token).await.unwrap();
    }
    assert_eq!(
        store.claim(k, "reader", None, LONG).await,
        Ok(Claim::Completed(b"result".to_vec()))
    );
    assert_eq!(
        store.complete(key("absent"), "stale", b"x", DAY).await,
        Err(Error::LeaseLost)
    );
}

#[tokio::test]
async fn a_differing_fingerprint_is_key_reused_and_a_missing_one_never_mismatches() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    assert_eq!(
        store.claim(k, "t1", Some("fp-a"), LONG).await,
        Ok(Claim::Acquired)
    );
    // While claimed:
    assert_eq!(
        store.claim(k, "t2", Some("fp-b"), LONG).await,
        Ok(Claim::KeyReused)
    );
    assert!(matches!(
        store.claim(k, "t2", Some("fp-a"), LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    assert!(matches!(
        store.claim(k, "t2", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    // Once completed, the fingerprint is kept with the record:
    store.complete(k, "t1", b"r", DAY).await.unwrap();
    assert_eq!(
        store.claim(k, "t2", Some("fp-b"), LONG).await,
        Ok(Claim::KeyReused)
    );
    assert_eq!(
        store.claim(k, "t2", Some("fp-a"), LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    assert_eq!(
        store.claim(k, "t2", None, LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    // A record stored without a fingerprint matches any.
    let n = key("no-fp");
    assert_eq!(store.claim(n, "t1", None, LONG).await, Ok(Claim::Acquired));
    store.complete(n, "t1", b"r", DAY).await.unwrap();
    assert_eq!(
        store.claim(n, "t2", Some("fp-z"), LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    // A fingerprint that reads like the "none" marker is still a fingerprint.
    let m = key("marker-fp");
    assert_eq!(
        store.claim(m, "t1", Some("n"), LONG).await,
        Ok(Claim::Acquired)
    );
    assert_eq!(
        store.claim(m, "t2", Some("1:n"), LONG).await,
        Ok(Claim::KeyReused)
    );
    // An empty fingerprint is a fingerprint, not an absent one.
    let e = key("empty-fp");
    assert_eq!(
        store.claim(e, "t1", Some(""), LONG).await,
        Ok(Claim::Acquired)
    );
    assert_eq!(
        store.claim(e, "t2", Some("x"), LONG).await,
        Ok(Claim::KeyReused)
    );
}

#[tokio::test]
async fn a_record_that_cannot_be_decoded_is_corrupt_and_never_a_panic() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let rk = |k: &str| RedisStore::redis_key(key(k));
    let set = |name: &str, value: &[u8]| redis::cmd("SET").arg(rk(name)).arg(value).clone();
    let cases: Vec<(&str, redis::Cmd)> = vec![
        ("garbage", set("garbage", b"garbage")),
        ("an empty string", set("empty", b"")),
        (
            "a hash",
            redis::cmd("HSET").arg(rk("hash")).arg(&["v", "1"]).clone(),
        ),
        (
            "a list",
            redis::cmd("RPUSH").arg(rk("list")).arg("x").clone(),
        ),
        ("a future version", set("v2", b"jg2/dn{}")),
        ("an unknown state", set("state", b"jg1/xn")),
        ("a claim without a token", set("no-token", b"jg1/cn")),
        (
            "a token longer than the record",
            set("short", b"jg1/c99:tok"),
        ),
        ("a malformed fingerprint", set("bad-fp", b"jg1/d7:fp{}")),
        (
            "trailing bytes after a claim",
            set("trailing", b"jg1/c3:tokn!"),
        ),
        ("a claim without an expiry", set("forever", b"jg1/c3:tokn")),
    ];
    let names = [
        "garbage", "empty", "hash", "list", "v2", "state", "no-token", "short", "bad-fp",
        "trailing", "forever",
    ];
    for ((what, mut cmd), name) in cases.into_iter().zip(names) {
        let _: redis::Value = raw(&store, &mut cmd).await;
        let k = key(name);
        let got = store.claim(k, "t", None, LONG).await;
        assert!(matches!(got, Err(Error::Corrupt(_))), "{what}: {got:?}");
        // The token operations treat it as not held, and leave it alone.
        assert_eq!(
            store.complete(k, "t", b"r", DAY).await,
            Err(Error::LeaseLost),
            "{what}"
        );
        assert_eq!(
            store.renew(k, "t", LONG).await,
            Err(Error::LeaseLost),
            "{what}"
        );
        store.release(k, "t").await.unwrap();
        let exists: i64 = raw(&store, redis::cmd("EXISTS").arg(rk(name))).await;
        assert_eq!(
            exists, 1,
            "{what}: left in place for an operator to inspect"
        );
    }
    let Err(Error::Corrupt(why)) = store.claim(key("v2"), "t", None, LONG).await else {
        unreachable!()
    };
    assert!(why.contains("version 2"), "{why}");
}

/// Pairs that a careless `scope:key` join or a hash of only some keys would collide.
fn tricky_pairs() -> Vec<(String, String)> {
    let long = "x".repeat(201);
    let long_digest_lookalike = format!(
        "#sha256:{}",
        RedisStore::redis_key(StoreKey {
            scope: "s",
            key: &long
        })
        .rsplit(':')
        .next()
        .unwrap()
    );
    let mut pairs: Vec<(&str, String)> = vec![
        ("a", "b:c".into()),
        ("a:b", "c".into()),
        ("a%3Ab", "c".into()),
        ("a", "%3Ab:c".into()),
        ("s", "".into()),
        ("s", " ".into()),
        ("s", "  ".into()),
        ("s", "\t".into()),
        ("s", "\0".into()),
        ("s", "#".into()),
        ("s", "##".into()),
        ("s", "#sha256:".into()),
        ("s", long.clone()),
        ("s", long[..200].into()),
        ("s", long_digest_lookalike),
        ("s", "café".into()),
        ("s", "cafe".into()),
        ("s", "k".into()),
        ("s2", "k".into()),
        ("", "s:k".into()),
        ("s", "k ".into()),
        ("s", "k\n".into()),
        ("s", "K".into()),
    ];
    // The hex of a hashed key, written as a plain key.
    let hex = RedisStore::redis_key(StoreKey {
        scope: "s",
        key: " ",
    });
    pairs.push((
        "s",
        hex.rsplit(':')
            .next()
            .unwrap()
            .trim_start_matches('#')
            .into(),
    ));
    pairs.into_iter().map(|(s, k)| (s.to_owned(), k)).collect()
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
async fn hashed_keys_and_scopes_are_isolated_on_the_server() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let pairs = tricky_pairs();
    // Every pair is claimed independently: none finds another's claim.
    for (scope, key) in &pairs {
        let k = StoreKey { scope, key };
        assert_eq!(
            store.claim(k, "t", None, LONG).await,
            Ok(Claim::Acquired),
            "({scope:?}, {key:?})"
        );
    }
    let keys: Vec<String> = raw(&store, redis::cmd("KEYS").arg("jobguard:*")).await;
    assert_eq!(keys.len(), pairs.len());
    // Long and non-printable keys are stored hashed, and only those.
    for k in &keys {
        let tail = k.splitn(3, ':').nth(2).unwrap();
        assert!(
            tail.len() <= 200 && tail.bytes().all(|b| b.is_ascii_graphic()),
            "{k:?}"
        );
    }
    // Completing one scope's key leaves the other scope's alone.
    let one = StoreKey {
        scope: "s",
        key: "k",
    };
    let two = StoreKey {
        scope: "s2",
        key: "k",
    };
    store.complete(one, "t", b"one", DAY).await.unwrap();
    assert_eq!(
        store.claim(one, "u", None, LONG).await,
        Ok(Claim::Completed(b"one".to_vec()))
    );
    assert!(matches!(
        store.claim(two, "u", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    let long = "x".repeat(5000);
    let hashed = StoreKey {
        scope: "s",
        key: &long,
    };
    assert_eq!(
        store.claim(hashed, "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.complete(hashed, "t", b"long", DAY).await.unwrap();
    assert_eq!(
        store.claim(hashed, "u", None, LONG).await,
        Ok(Claim::Completed(b"long".to_vec()))
    );
}

#[tokio::test]
async fn a_clone_shares_the_connection_and_an_unreachable_url_is_a_store_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let copy = store.clone();
    assert_eq!(
        store.claim(key("k"), "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    assert!(matches!(
        copy.claim(key("k"), "u", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    let port = server.port();
    drop((store, copy, server));
    let down = RedisStore::connect(&format!("redis://127.0.0.1:{port}/")).await;
    assert!(matches!(down, Err(Error::Store(_))), "{down:?}");
    let bad = RedisStore::connect("not a url").await;
    assert!(matches!(bad, Err(Error::Store(_))), "{bad:?}");
}
