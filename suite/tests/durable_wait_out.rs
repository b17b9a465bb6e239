//! A delivery under a job runner that finds its key claimed waits out the claim's lease instead
//! of spending the delivery on `InProgress`: a dead holder's claim lapses within the wait and
//! the delivery takes it over and runs the job (the crash counted); a live holder's result
//! arriving during the wait is replayed; a live holder that keeps renewing past the wait hands
//! the delivery back. Outside a runner, `InProgress` comes at once, as before. On the in-memory
//! store, under a paused clock.

use jobguard::testing::PlainClaim;
use jobguard::{Delivery, Error, MemoryStore, Runtime, Store, StoreKey};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(10);
const KEY: StoreKey<'static> = StoreKey {
    scope: "durable.wait",
    key: "order-A",
};
const DELIVERY: Delivery = Delivery {
    number: 2,
    last: false,
};

#[jobguard::idempotent(key = order, scope = "durable.wait", lease = "10s")]
async fn charge(order: &str, runs: &AtomicU32) -> Result<u32, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(7)
}

/// A runtime on a fresh store whose key is held by a worker that claimed it `held_for` ago and
/// then died (it never renews).
async fn held_by_a_dead_worker(held_for: Duration) -> (Runtime, MemoryStore) {
    let store = MemoryStore::new();
    store
        .claim_plain(KEY, "dead-worker", None, LEASE)
        .await
        .unwrap();
    tokio::time::advance(held_for).await;
    (Runtime::builder().store(store.clone()).build(), store)
}

#[tokio::test(start_paused = true)]
async fn a_delivery_waits_out_a_dead_holder_s_lease_then_runs_the_job() {
    let runs = AtomicU32::new(0);
    let (runtime, _store) = held_by_a_dead_worker(Duration::from_secs(3)).await;
    let start = tokio::time::Instant::now();
    let got = runtime
        .scope(DELIVERY.scope(charge("order-A", &runs)))
        .await;
    assert_eq!(got, Ok(7));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // It waited for the rest of the lease (7 s), not the whole of it again.
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(7) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn outside_a_runner_a_held_key_is_in_progress_at_once() {
    let runs = AtomicU32::new(0);
    let (runtime, _store) = held_by_a_dead_worker(Duration::from_secs(3)).await;
    let start = tokio::time::Instant::now();
    assert_eq!(
        runtime.scope(charge("order-A", &runs)).await,
        Err(Error::InProgress)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_live_holder_s_result_arriving_during_the_wait_is_replayed() {
    let runs = AtomicU32::new(0);
    let (runtime, store) = held_by_a_dead_worker(Duration::ZERO).await;
    let finisher = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let record = br#"{"v":1,"ok":7}"#;
        finisher
            .complete(KEY, "dead-worker", record, Duration::from_secs(3600))
            .await
            .expect("the holder completes its claim");
    });
    let got = runtime
        .scope(DELIVERY.scope(charge("order-A", &runs)))
        .await;
    assert_eq!(got, Ok(7), "the holder's result, replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the job did not run again");
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_keeps_renewing_hands_the_delivery_back_after_the_wait() {
    let runs = AtomicU32::new(0);
    let (runtime, store) = held_by_a_dead_worker(Duration::ZERO).await;
    let renewer = store.clone();
    let renewing = tokio::spawn(async move {
        loop {
            tokio::time::sleep(LEASE / 3).await;
            renewer.renew(KEY, "dead-worker", LEASE).await.unwrap();
        }
    });
    let start = tokio::time::Instant::now();
    let got = runtime
        .scope(DELIVERY.scope(charge("order-A", &runs)))
        .await;
    renewing.abort();
    assert_eq!(got, Err(Error::InProgress));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // One lease's wait, then handed back.
    let waited = start.elapsed();
    assert!(
        waited >= LEASE && waited < LEASE + Duration::from_secs(2),
        "{waited:?}"
    );
}
