//! `Runtime::shutdown(grace)`: waits for the claims jobs under the runtime hold to be completed
//! or released, up to the grace period; a job dropped at the end of its grace has its claim
//! released (written before `shutdown` returns), so the next claimer counts no crash. Under a
//! paused clock, on a store whose releases take a second.

use jobguard::{ClaimOptions, Claimed, Error, Runtime, Store, StoreKey};
use jobguard_testkit::faulty::Faulty;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::oneshot;

/// A `MemoryStore` whose releases take a second, as a store across a network would.
fn slow_release() -> Faulty {
    let store = Faulty::default();
    store.slow_release.store(true, Ordering::SeqCst);
    store
}

/// Holds its claim until `go` is sent.
#[jobguard::idempotent(key = order, scope = "shutdown.charge", lease = "30s")]
async fn charge(order: &str, go: oneshot::Receiver<()>) -> Result<u32, Error> {
    let _ = go.await;
    Ok(7)
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_the_jobs_in_flight_within_its_grace() {
    let runtime = Runtime::builder().store(slow_release()).build();
    let (go, wait) = oneshot::channel();
    let scoped = runtime.clone();
    let job = tokio::spawn(async move { scoped.scope(charge("order-A", wait)).await });
    tokio::task::yield_now().await;
    assert_eq!(runtime.held_claims(), 1);
    // The job outlasts a short grace: one claim still held.
    assert_eq!(runtime.shutdown(Duration::from_secs(2)).await, Err(1));
    // It finishes within a longer one.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = go.send(());
    });
    assert_eq!(runtime.shutdown(Duration::from_secs(20)).await, Ok(()));
    assert_eq!(job.await.unwrap(), Ok(7));
    assert_eq!(runtime.held_claims(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_job_dropped_at_the_end_of_its_grace_is_released_before_shutdown_returns() {
    let store = slow_release();
    let runtime = Runtime::builder().store(store.clone()).build();
    let (_go, wait) = oneshot::channel();
    let scoped = runtime.clone();
    let job = tokio::spawn(async move { scoped.scope(charge("order-A", wait)).await });
    tokio::task::yield_now().await;
    // The grace is over: the worker drops what still runs.
    job.abort();
    assert!(job.await.unwrap_err().is_cancelled());
    // The release takes a second; shutdown waits for it.
    let start = tokio::time::Instant::now();
    assert_eq!(runtime.shutdown(Duration::from_secs(5)).await, Ok(()));
    assert!(start.elapsed() >= Duration::from_secs(1));
    // The key is free, and the next claim counts no crash.
    let key = StoreKey {
        scope: "shutdown.charge",
        key: "order-A",
    };
    let claimed = store
        .claim(key, "next", ClaimOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        matches!(claimed, Claimed::Acquired { crashes: 0, .. }),
        "{claimed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_nothing_held_returns_at_once() {
    let runtime = Runtime::builder().build();
    let start = tokio::time::Instant::now();
    assert_eq!(runtime.shutdown(Duration::from_secs(30)).await, Ok(()));
    assert_eq!(start.elapsed(), Duration::ZERO);
}
