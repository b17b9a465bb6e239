//! The Redis side of the store conformance suite: [`RedisBackend`], a `RedisStore` (one server
//! or a cluster) as a [`Backend`] of `jobguard::testing` that can say what the server keeps,
//! and the checks only Redis needs (records of the first layout, values that do not decode).

use jobguard::store::redis::{RedisConnection, RedisStore};
pub use jobguard::testing::*;
use jobguard::{ClaimOptions, Claimed, Error, Store, StoreKey};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(300);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// A [`RedisStore`] (one server or a cluster) as a backend, holding `guard` (the server or
/// the cluster) for as long as it lives.
pub struct RedisBackend<G> {
    /// What keeps the server up: a `RedisServer`, a `RedisCluster`, or `()`.
    pub guard: G,
    /// The store under test.
    pub store: RedisStore,
}

impl<G: Send + Sync> RedisBackend<G> {
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut connection: RedisConnection = self.store.connection();
        cmd.query_async(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
    }

    /// Forgets every key, so that the next check starts empty.
    pub async fn clear(&self) {
        let _: () = self.query(&redis::cmd("FLUSHALL")).await;
    }
}

impl<G: Send + Sync> Backend for RedisBackend<G> {
    type Store = RedisStore;

    fn store(&self) -> RedisStore {
        self.store.clone()
    }

    async fn pttl(&self, key: StoreKey<'_>) -> Option<i64> {
        Some(
            self.query(redis::cmd("PTTL").arg(RedisStore::redis_key(key)))
                .await,
        )
    }

    async fn keys(&self) -> Option<Vec<String>> {
        // On a cluster, `KEYS` runs on every master and the replies are joined.
        Some(self.query(redis::cmd("KEYS").arg("jobguard:*")).await)
    }
}

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.conformance",
        key,
    }
}

/// Records in the layout of version 1 (written by a build before claims were counted) are still
/// read: a completed one replays, and a claim, which expires with its lease, is in progress while
/// it lasts and free after. A build of version 1 reads the completed records this one writes.
/// Redis only: it writes the values with raw commands.
pub async fn records_of_the_first_layout_are_read(store: &RedisStore) {
    let raw = async |cmd: &redis::Cmd| -> redis::Value {
        cmd.query_async(&mut store.connection())
            .await
            .expect("raw command")
    };
    let done = key("v1-done");
    raw(redis::cmd("SET")
        .arg(RedisStore::redis_key(done))
        .arg(&b"jg1/d4:fp-a{\"v\":1,\"ok\":7}"[..])
        .arg("PX")
        .arg(60_000))
    .await;
    assert_eq!(
        store.claim_plain(done, "t", Some("fp-a"), LONG).await,
        Ok(Claim::Completed(br#"{"v":1,"ok":7}"#.to_vec()))
    );
    assert_eq!(
        store.claim_plain(done, "t", Some("fp-b"), LONG).await,
        Ok(Claim::KeyReused)
    );
    let held = key("v1-claim");
    raw(redis::cmd("SET")
        .arg(RedisStore::redis_key(held))
        .arg("jg1/c3:oldn")
        .arg("PX")
        .arg(SHORT.as_millis() as u64))
    .await;
    let Ok(Claim::InProgress { retry_in }) = store.claim_plain(held, "t", None, LONG).await else {
        panic!("a version 1 claim is live while it lasts");
    };
    assert!(retry_in <= SHORT, "{retry_in:?}");
    // An old worker's claim cannot be completed by a token of this build's, nor the reverse.
    assert_eq!(
        store.complete(held, "old", b"x", DAY).await,
        Err(Error::LeaseLost)
    );
    let options = ClaimOptions::new(LONG);
    let got = claimed_when_free(store, held, "t", options, Duration::from_secs(5)).await;
    assert_eq!(
        got,
        Claimed::Acquired {
            generation: 1,
            crashes: 0,
            attempts: 1,
            steps: Some(Vec::new()),
        },
        "an expired version 1 claim leaves the key free, its crash uncounted"
    );
    // What this build writes for a completed job is the first layout, which old builds read.
    store.complete(held, "t", b"{}", DAY).await.unwrap();
    let value: Vec<u8> = match raw(redis::cmd("GET").arg(RedisStore::redis_key(held))).await {
        redis::Value::BulkString(v) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(value, b"jg1/dn{}");
}

/// A Redis value that is not a record (another type, another version, a malformed field, a
/// claim without an expiry) is `Error::Corrupt` for `claim`, "not held" for the token
/// operations, never forgiven, and left in place. Redis only: it writes the values with raw commands.
pub async fn a_record_that_cannot_be_decoded_is_corrupt_and_never_a_panic(store: &RedisStore) {
    let raw = async |cmd: &mut redis::Cmd| -> redis::Value {
        cmd.query_async(&mut store.connection())
            .await
            .expect("raw command")
    };
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
        ("a future version", set("v3", b"jg3/dn{}")),
        ("a completed record in version 2", set("v2d", b"jg2/dn{}")),
        (
            "a version 2 claim without its numbers",
            set("v2c", b"jg2/c3:tokn"),
        ),
        (
            "a version 2 claim with a bad lease end",
            set("v2e", b"jg2/c3:tokn1:0:soon"),
        ),
        (
            "a released key without its crash count",
            set("v2f", b"jg2/f1"),
        ),
        ("a poisoned key with extra bytes", set("v2p", b"jg2/p1:3!")),
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
        "garbage", "empty", "hash", "list", "v3", "v2d", "v2c", "v2e", "v2f", "v2p", "state",
        "no-token", "short", "bad-fp", "trailing", "forever",
    ];
    for ((what, mut cmd), name) in cases.into_iter().zip(names) {
        raw(&mut cmd).await;
        let k = key(name);
        // A lookup never reads a result out of it: nothing, or the same refusal in words.
        let looked = store.lookup(k).await;
        assert!(
            matches!(looked, Ok(None) | Err(Error::Corrupt(_))),
            "{what}: {looked:?}"
        );
        let got = store.claim_plain(k, "t", None, LONG).await;
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
        // Nothing is forgiven out of it: refused, or nothing to forgive (a version-1 claim or
        // completed record, which `forgive` leaves alone unread).
        let forgiven = store.forgive(k).await;
        assert!(
            matches!(forgiven, Ok(false) | Err(Error::Corrupt(_))),
            "{what}: {forgiven:?}"
        );
        let exists = raw(redis::cmd("EXISTS").arg(rk(name))).await;
        assert_eq!(
            exists,
            redis::Value::Int(1),
            "{what}: left in place for an operator to inspect"
        );
    }
    let Err(Error::Corrupt(why)) = store.claim_plain(key("v3"), "t", None, LONG).await else {
        unreachable!()
    };
    assert!(why.contains("version 3"), "{why}");
    // A completed record whose fingerprint cannot be read, or a value of another type, is a
    // refusal of the lookup too.
    for name in ["bad-fp", "hash", "list"] {
        let looked = store.lookup(key(name)).await;
        assert!(
            matches!(looked, Err(Error::Corrupt(_))),
            "{name}: {looked:?}"
        );
    }
}
