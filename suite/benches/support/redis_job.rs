//! What the Redis store benchmarks (`redis_store`, `redis_cluster`) share: one idempotent job's
//! store traffic, a flush between contenders, and the median of a round's rates. Included with
//! `#[path]`.

use jobguard::store::redis::RedisStore;
use jobguard::testing::{Claim, PlainClaim};
use jobguard::{Store, StoreKey};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);
/// Short, so the keys the benchmark writes do not pile up in memory.
const TTL: Duration = Duration::from_secs(30);
/// What `#[idempotent]` stores for a small `Ok` value.
const RECORD: &[u8] = br#"{"v":1,"ok":{"order_id":"order-123456","attempts_used":1}}"#;

/// The next fresh key's number, shared by every contender that writes keys.
pub static NEXT: AtomicU64 = AtomicU64::new(0);

/// One idempotent job's store traffic: claim a fresh key, then complete it.
pub async fn job(store: &RedisStore) {
    let key = format!("job-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let key = StoreKey {
        scope: "bench.charge",
        key: &key,
    };
    let claim = store
        .claim_plain(key, "token-0123456789abcdef", None, LEASE)
        .await;
    assert_eq!(claim, Ok(Claim::Acquired));
    store
        .complete(key, "token-0123456789abcdef", RECORD, TTL)
        .await
        .unwrap();
}

/// Empties the server (every master, on a cluster) between contenders.
pub fn flush(rt: &tokio::runtime::Runtime, store: &RedisStore) {
    rt.block_on(async {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut store.connection())
            .await
            .unwrap();
    });
}

/// The median of a round's rates.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
