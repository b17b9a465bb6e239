//! `#[idempotent]` semantics on the in-memory store, under a paused clock: a key held elsewhere
//! (`fail` and `wait`), the lease (renewal, a crashed holder, cancellation, panic, loss), fail
//! closed, the stored-result write failing, fingerprints, corrupt records, TTL and scopes.

use jobguard::testing::{Claim, PlainClaim};
use jobguard::{Error, Event, MemoryStore, Runtime, Store, StoreKey};
use jobguard_testkit::faulty::Faulty;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

type Result<T> = std::result::Result<T, Error>;

/// Counts body runs; optionally holds the body until released.
#[derive(Default)]
struct Work {
    runs: AtomicU32,
    gate: Mutex<Option<oneshot::Receiver<()>>>,
    started: Notify,
}

impl Work {
    fn gated() -> (Arc<Work>, oneshot::Sender<()>) {
        let (tx, rx) = oneshot::channel();
        let work = Arc::new(Work {
            gate: Mutex::new(Some(rx)),
            ..Work::default()
        });
        (work, tx)
    }
    async fn run(&self, value: u32) -> Result<u32> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.started.notify_one();
        let gate = self.gate.lock().unwrap().take();
        if let Some(gate) = gate {
            let _ = gate.await;
        }
        Ok(value)
    }
    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

#[jobguard::idempotent(key = key)]
async fn fail_fast(work: &Work, key: &str, value: u32) -> Result<u32> {
    work.run(value).await
}

#[jobguard::idempotent(key = key, in_progress = wait("10s"))]
async fn waits(work: &Work, key: &str, value: u32) -> Result<u32> {
    work.run(value).await
}

#[jobguard::idempotent(key = key, lease = "30s")]
async fn leased(work: &Work, key: &str, value: u32) -> Result<u32> {
    work.run(value).await
}

#[jobguard::idempotent(key = key, ttl = "1h")]
async fn short_ttl(work: &Work, key: &str, value: u32) -> Result<u32> {
    work.run(value).await
}

#[jobguard::idempotent(key = order_id, fingerprint = amount)]
async fn fingerprinted(work: &Work, order_id: &str, amount: u32) -> Result<u32> {
    work.run(amount).await
}

#[jobguard::idempotent(key = key)]
async fn panics(key: &str) -> Result<u32> {
    let _ = key;
    panic!("the job's own bug");
}

mod elsewhere {
    use super::*;
    #[jobguard::idempotent(key = key)]
    pub async fn fail_fast(work: &Work, key: &str, value: u32) -> Result<u32> {
        work.run(value).await
    }
}

/// A runtime on `store`, and a log of the idempotency events.
fn runtime(store: impl Store + 'static) -> (Runtime, Arc<Mutex<Vec<String>>>, Arc<Notify>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let released = Arc::new(Notify::new());
    let (seen, rel) = (log.clone(), released.clone());
    let rt = Runtime::builder()
        .store(store)
        .observer(move |e: &Event<'_>| {
            let line = match e {
                Event::Claimed { .. } => "claimed",
                Event::Replayed { .. } => "replayed",
                Event::InProgress { .. } => "in progress",
                Event::Released { .. } => {
                    rel.notify_one();
                    "released"
                }
                Event::LeaseLost { .. } => "lease lost",
                Event::StoreFailed { .. } => "store failed",
                Event::ClaimFailed { .. } => "claim failed",
                _ => return,
            };
            seen.lock().unwrap().push(line.to_owned());
        })
        .build();
    (rt, log, released)
}

#[tokio::test(start_paused = true)]
async fn a_key_held_elsewhere_fails_fast_with_in_progress_which_is_transient() {
    let (rt, log, _) = runtime(MemoryStore::new());
    let (work, open) = Work::gated();
    let first = tokio::spawn(
        rt.clone()
            .scope_owned(fail_fast_owned(work.clone(), "k", 1)),
    );
    work.started.notified().await;
    let second = rt.scope(fail_fast(&work, "k", 2)).await;
    assert_eq!(second, Err(Error::InProgress));
    assert_eq!(
        jobguard::Transient::verdict(&Error::InProgress),
        jobguard::Verdict::Retry
    );
    open.send(()).unwrap();
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(work.runs(), 1);
    assert_eq!(
        rt.scope(fail_fast(&work, "k", 3)).await,
        Ok(1),
        "replays the first result"
    );
    assert_eq!(*log.lock().unwrap(), ["claimed", "in progress", "replayed"]);
}

#[tokio::test(start_paused = true)]
async fn wait_replays_the_first_runs_result_or_gives_up_after_its_limit() {
    let (rt, _, _) = runtime(MemoryStore::new());
    let (work, open) = Work::gated();
    let first = tokio::spawn(rt.clone().scope_owned(waits_owned(work.clone(), "k", 1)));
    work.started.notified().await;
    let second = tokio::spawn(rt.clone().scope_owned(waits_owned(work.clone(), "k", 2)));
    tokio::time::sleep(Duration::from_secs(3)).await; // the first job takes 3s of (paused) time
    open.send(()).unwrap();
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(second.await.unwrap(), Ok(1), "waited, then replayed");
    assert_eq!(work.runs(), 1);

    let (work, _held) = Work::gated();
    let holder = tokio::spawn(rt.clone().scope_owned(waits_owned(work.clone(), "k2", 1)));
    work.started.notified().await;
    let start = tokio::time::Instant::now();
    assert_eq!(
        rt.scope(waits(&work, "k2", 2)).await,
        Err(Error::InProgress)
    );
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    holder.abort();
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_renewed_while_the_work_runs() {
    let store = MemoryStore::new();
    let (rt, _, _) = runtime(store.clone());
    let (work, open) = Work::gated();
    let job = tokio::spawn(rt.clone().scope_owned(leased_owned(work.clone(), "k", 1)));
    work.started.notified().await;
    tokio::time::sleep(Duration::from_secs(95)).await; // three leases' worth
    let key = StoreKey {
        scope: scope_of("leased"),
        key: "k",
    };
    assert!(matches!(
        store
            .claim_plain(key, "other", None, Duration::from_secs(1))
            .await,
        Ok(Claim::InProgress { .. })
    ));
    open.send(()).unwrap();
    assert_eq!(job.await.unwrap(), Ok(1));
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holder_blocks_the_key_for_one_lease_and_no_longer() {
    let store = MemoryStore::new();
    let (rt, _, _) = runtime(store.clone());
    let key = StoreKey {
        scope: scope_of("leased"),
        key: "k",
    };
    // A worker claimed the key and died without cleanup.
    assert_eq!(
        store
            .claim_plain(key, "dead-worker", None, Duration::from_secs(30))
            .await,
        Ok(Claim::Acquired)
    );
    let work = Work::default();
    tokio::time::sleep(Duration::from_millis(29_999)).await;
    assert_eq!(
        rt.scope(leased(&work, "k", 1)).await,
        Err(Error::InProgress)
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(rt.scope(leased(&work, "k", 1)).await, Ok(1));
    assert_eq!(work.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_job_releases_its_claim() {
    let (rt, log, released) = runtime(MemoryStore::new());
    let (work, _never) = Work::gated();
    let job = tokio::spawn(
        rt.clone()
            .scope_owned(fail_fast_owned(work.clone(), "k", 1)),
    );
    work.started.notified().await;
    job.abort();
    released.notified().await;
    let fresh = Work::default();
    assert_eq!(
        rt.scope(fail_fast(&fresh, "k", 2)).await,
        Ok(2),
        "the redelivery runs"
    );
    assert_eq!(*log.lock().unwrap(), ["claimed", "released", "claimed"]);
}

/// On a store that answers without waiting (the embedded default), the claim of a cancelled
/// call is released as the call is dropped: a redelivery right after it runs, with nothing in
/// between to let a release task run.
#[tokio::test(start_paused = true)]
async fn a_job_cancelled_by_a_timeout_is_free_for_the_next_delivery_at_once() {
    let (rt, log, _) = runtime(MemoryStore::new());
    let (work, _never) = Work::gated();
    let cut =
        tokio::time::timeout(Duration::from_millis(5), rt.scope(fail_fast(&work, "k", 1))).await;
    assert!(cut.is_err(), "the gated work never finishes: {cut:?}");
    let fresh = Work::default();
    assert_eq!(
        rt.scope(fail_fast(&fresh, "k", 2)).await,
        Ok(2),
        "the redelivery runs, not InProgress"
    );
    assert_eq!(*log.lock().unwrap(), ["claimed", "released", "claimed"]);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_job_releases_its_claim() {
    let (rt, _, released) = runtime(MemoryStore::new());
    let job = tokio::spawn(rt.clone().scope_owned(async { panics("k").await }));
    assert!(job.await.unwrap_err().is_panic());
    released.notified().await;
    let key = StoreKey {
        scope: scope_of("panics"),
        key: "k",
    };
    assert_eq!(
        rt.store()
            .claim_plain(key, "next", None, Duration::from_secs(1))
            .await,
        Ok(Claim::Acquired)
    );
}

#[tokio::test(start_paused = true)]
async fn a_completion_whose_lease_was_lost_is_lease_lost() {
    let store = Faulty::default();
    let (rt, log, _) = runtime(store.clone());
    store.lose_lease.store(true, Ordering::SeqCst);
    let work = Work::default();
    assert_eq!(
        rt.scope(fail_fast(&work, "k", 1)).await,
        Err(Error::LeaseLost)
    );
    assert_eq!(work.runs(), 1);
    assert_eq!(*log.lock().unwrap(), ["claimed", "lease lost"]);
}

/// A lease the heartbeat finds lost is one `LeaseLost`, not a second when the result's write is
/// refused for the same reason.
#[tokio::test(start_paused = true)]
async fn a_lease_lost_while_the_job_ran_is_raised_once() {
    let store = Faulty::default();
    let (rt, log, _) = runtime(store.clone());
    store.lose_lease.store(true, Ordering::SeqCst);
    let (work, gate) = Work::gated();
    let job = tokio::spawn(rt.clone().scope_owned(leased_owned(work.clone(), "k", 1)));
    work.started.notified().await;
    // Past a third of the 30 s lease: the heartbeat's renewal is refused.
    tokio::time::sleep(Duration::from_secs(11)).await;
    gate.send(()).unwrap();
    assert_eq!(job.await.unwrap(), Err(Error::LeaseLost));
    assert_eq!(*log.lock().unwrap(), ["claimed", "lease lost"]);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_fails_closed_and_the_body_never_runs() {
    let store = Faulty::default();
    let (rt, log, _) = runtime(store.clone());
    store.down.store(true, Ordering::SeqCst);
    let work = Work::default();
    assert!(matches!(
        rt.scope(fail_fast(&work, "k", 1)).await,
        Err(Error::Store(_))
    ));
    assert_eq!(work.runs(), 0);
    assert_eq!(
        *log.lock().unwrap(),
        ["claim failed"],
        "raised once, and nothing else"
    );
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(
        rt.scope(fail_fast(&work, "k", 1)).await,
        Ok(1),
        "recovers with the store"
    );
    assert_eq!(
        log.lock().unwrap().last().map(String::as_str),
        Some("claimed")
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_result_write_is_retried_then_reported_and_the_value_still_returned() {
    let store = Faulty::default();
    let (rt, log, _) = runtime(store.clone());
    store.complete_fails.store(2, Ordering::SeqCst);
    let work = Work::default();
    assert_eq!(rt.scope(fail_fast(&work, "a", 1)).await, Ok(1));
    assert_eq!(
        rt.scope(fail_fast(&work, "a", 9)).await,
        Ok(1),
        "the third write landed: replayed"
    );
    store.complete_fails.store(100, Ordering::SeqCst);
    assert_eq!(
        rt.scope(fail_fast(&work, "b", 2)).await,
        Ok(2),
        "the side effect happened: Ok"
    );
    assert_eq!(
        log.lock().unwrap().last().map(String::as_str),
        Some("store failed")
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_key_with_other_arguments_is_key_reused() {
    let (rt, _, _) = runtime(MemoryStore::new());
    let work = Work::default();
    assert_eq!(
        rt.scope(fingerprinted(&work, "order-A", 100)).await,
        Ok(100)
    );
    assert_eq!(
        rt.scope(fingerprinted(&work, "order-A", 100)).await,
        Ok(100)
    );
    assert_eq!(
        rt.scope(fingerprinted(&work, "order-A", 999)).await,
        Err(Error::KeyReused)
    );
    assert_eq!(work.runs(), 1);
    // Under a job runner the refusal settles the delivery: delivering the job again would only
    // be refused again while the key's record stands. A replay and a new key settle nothing.
    let delivery = jobguard::Delivery {
        number: 1,
        last: false,
    };
    let (reused, settled) = rt
        .scope(delivery.scope_settled(fingerprinted(&work, "order-A", 999)))
        .await;
    assert_eq!((reused, settled), (Err(Error::KeyReused), true));
    let (replayed, settled) = rt
        .scope(delivery.scope_settled(fingerprinted(&work, "order-A", 100)))
        .await;
    assert_eq!((replayed, settled), (Ok(100), false));
    assert_eq!(work.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_key_reused_against_a_live_claim_does_not_settle_the_delivery() {
    let store = MemoryStore::new();
    let (rt, _, _) = runtime(store.clone());
    let (work, go) = Work::gated();
    let running = tokio::spawn({
        let (rt, work) = (rt.clone(), work.clone());
        async move { rt.scope(fingerprinted(&work, "order-L", 100)).await }
    });
    work.started.notified().await;
    // Another job's arguments under the key while the first run holds it: refused, but that
    // run may yet fail and release the key, so a runner may deliver this job again.
    let other = Work::default();
    let delivery = jobguard::Delivery {
        number: 1,
        last: false,
    };
    let (reused, settled) = rt
        .scope(delivery.scope_settled(fingerprinted(&other, "order-L", 999)))
        .await;
    assert_eq!((reused, settled), (Err(Error::KeyReused), false));
    go.send(()).unwrap();
    assert_eq!(running.await.unwrap(), Ok(100));
    assert_eq!(other.runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_record_is_corrupt_not_a_panic() {
    let store = MemoryStore::new();
    let (rt, _, _) = runtime(store.clone());
    let key = StoreKey {
        scope: scope_of("fail_fast"),
        key: "k",
    };
    for garbage in [
        &b"not json"[..],
        br#"{"v":99,"ok":1}"#,
        br#"{"v":1,"ok":"a string"}"#,
    ] {
        store
            .claim_plain(key, "t", None, Duration::from_secs(1))
            .await
            .unwrap();
        store
            .complete(key, "t", garbage, Duration::from_secs(5))
            .await
            .unwrap();
        let work = Work::default();
        match rt.scope(fail_fast(&work, "k", 1)).await {
            // The error names the record's key, so an operator can find it.
            Err(Error::Corrupt(why)) => assert!(
                why.contains(&format!("key \"k\" of {:?}", key.scope)),
                "{why}"
            ),
            other => panic!("{garbage:?}: {other:?}"),
        }
        assert_eq!(work.runs(), 0);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_result_is_replayed_for_its_ttl_then_the_key_runs_again() {
    let (rt, _, _) = runtime(MemoryStore::new());
    let work = Work::default();
    assert_eq!(rt.scope(short_ttl(&work, "k", 1)).await, Ok(1));
    tokio::time::sleep(Duration::from_secs(3599)).await;
    assert_eq!(rt.scope(short_ttl(&work, "k", 2)).await, Ok(1));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rt.scope(short_ttl(&work, "k", 3)).await, Ok(3));
}

#[tokio::test(start_paused = true)]
async fn two_functions_keyed_by_the_same_value_never_collide() {
    let (rt, _, _) = runtime(MemoryStore::new());
    let work = Work::default();
    assert_eq!(rt.scope(fail_fast(&work, "k", 1)).await, Ok(1));
    assert_eq!(rt.scope(elsewhere::fail_fast(&work, "k", 2)).await, Ok(2));
    assert_eq!(work.runs(), 2);
}

/// The default scope of a function in this file.
fn scope_of(name: &str) -> &'static str {
    Box::leak(format!("{}.{name}", module_path!().replace("::", ".")).into_boxed_str())
}

// Owned wrappers, so a job can be spawned.
async fn fail_fast_owned(work: Arc<Work>, key: &'static str, value: u32) -> Result<u32> {
    fail_fast(&work, key, value).await
}
async fn waits_owned(work: Arc<Work>, key: &'static str, value: u32) -> Result<u32> {
    waits(&work, key, value).await
}
async fn leased_owned(work: Arc<Work>, key: &'static str, value: u32) -> Result<u32> {
    leased(&work, key, value).await
}

trait ScopeOwned {
    fn scope_owned<F: std::future::Future + Send + 'static>(
        self,
        fut: F,
    ) -> impl std::future::Future<Output = F::Output> + Send + 'static
    where
        F::Output: Send;
}

impl ScopeOwned for Runtime {
    #[allow(clippy::manual_async_fn)] // the `Send + 'static` bound needs the explicit form
    fn scope_owned<F: std::future::Future + Send + 'static>(
        self,
        fut: F,
    ) -> impl std::future::Future<Output = F::Output> + Send + 'static
    where
        F::Output: Send,
    {
        async move { self.scope(fut).await }
    }
}
