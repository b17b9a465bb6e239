//! Durable steps on `MemoryStore`: replay across `#[retry]` attempts and redeliveries,
//! occurrences in a loop, fencing, bad input, events, and a step outside a job.

use jobguard::store::{StepKey, StoreKey};
use jobguard::{ClaimOptions, Claimed, Event, MemoryStore, Runtime, Store, Transient};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Transient)]
enum ShopError {
    #[transient]
    Timeout,
    Declined,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<jobguard::Error> for ShopError {
    fn from(e: jobguard::Error) -> Self {
        ShopError::Jobguard(e)
    }
}

/// Counts each effect, and fails the receipt the first `receipt_failures` times.
#[derive(Default)]
struct Shop {
    effects: Mutex<HashMap<String, u32>>,
    receipt_failures: Mutex<u32>,
}

impl Shop {
    fn failing_receipts(n: u32) -> Self {
        Shop {
            receipt_failures: Mutex::new(n),
            ..Shop::default()
        }
    }
    fn did(&self, effect: &str) {
        *self
            .effects
            .lock()
            .unwrap()
            .entry(effect.into())
            .or_default() += 1;
    }
    fn count(&self, effect: &str) -> u32 {
        self.effects
            .lock()
            .unwrap()
            .get(effect)
            .copied()
            .unwrap_or(0)
    }
}

#[jobguard::step(name = "capture.v1")]
async fn capture(shop: &Shop, order: &str) -> Result<String, ShopError> {
    shop.did("capture");
    Ok(format!("payment-{order}"))
}

#[jobguard::step]
async fn reserve(shop: &Shop, sku: &str) -> Result<u32, ShopError> {
    shop.did(&format!("reserve {sku}"));
    Ok(7)
}

#[jobguard::step]
async fn receipt(shop: &Shop, payment: &str) -> Result<String, ShopError> {
    let mut failures = shop.receipt_failures.lock().unwrap();
    if *failures > 0 {
        *failures -= 1;
        return Err(ShopError::Timeout);
    }
    shop.did("receipt");
    Ok(format!("receipt for {payment}"))
}

#[jobguard::idempotent(key = order, scope = "shop.checkout")]
#[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms")]
async fn checkout(shop: &Shop, order: &str) -> Result<String, ShopError> {
    let payment = capture(shop, order).await?;
    reserve(shop, "sku-1").await?;
    receipt(shop, &payment).await
}

fn observed() -> (Runtime, Arc<Mutex<Vec<String>>>, MemoryStore) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let store = MemoryStore::new();
    let runtime = Runtime::builder()
        .store(store.clone())
        .observer(move |e: &Event<'_>| match e {
            Event::StepRecorded {
                step, occurrence, ..
            } => sink
                .lock()
                .unwrap()
                .push(format!("recorded {step}#{occurrence}")),
            Event::StepReplayed {
                step, occurrence, ..
            } => sink
                .lock()
                .unwrap()
                .push(format!("replayed {step}#{occurrence}")),
            _ => {}
        })
        .build();
    (runtime, seen, store)
}

#[tokio::test(start_paused = true)]
async fn a_retry_around_the_job_replays_the_steps_before_the_failure() {
    let (runtime, seen, _) = observed();
    let shop = Shop::failing_receipts(2);
    let done = runtime.scope(checkout(&shop, "order-1")).await.unwrap();
    assert_eq!(done, "receipt for payment-order-1");
    assert_eq!(shop.count("capture"), 1);
    assert_eq!(shop.count("reserve sku-1"), 1);
    assert_eq!(shop.count("receipt"), 1);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "recorded capture.v1#1",
            "recorded reserve#1",
            "replayed capture.v1#1",
            "replayed reserve#1",
            "replayed capture.v1#1",
            "replayed reserve#1",
            "recorded receipt#1",
        ]
    );
    // Completed: a redelivery replays the job's result, and no step.
    seen.lock().unwrap().clear();
    let again = runtime.scope(checkout(&shop, "order-1")).await.unwrap();
    assert_eq!(again, done);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_redelivery_after_a_failed_run_resumes_at_the_first_unrecorded_step() {
    let (runtime, _, _) = observed();
    // Three attempts fail at the receipt: the job's error is handed back, its claim released.
    let shop = Shop::failing_receipts(3);
    assert!(matches!(
        runtime.scope(checkout(&shop, "order-2")).await,
        Err(ShopError::Timeout)
    ));
    // The redelivery: the capture and the reservation replay, the receipt runs.
    runtime.scope(checkout(&shop, "order-2")).await.unwrap();
    assert_eq!(shop.count("capture"), 1);
    assert_eq!(shop.count("reserve sku-1"), 1);
    assert_eq!(shop.count("receipt"), 1);
}

#[jobguard::idempotent(key = order, scope = "shop.lines")]
async fn reserve_lines(shop: &Shop, order: &str, fail: bool) -> Result<Vec<u32>, ShopError> {
    let mut reserved = Vec::new();
    for sku in ["a", "b", "a"] {
        reserved.push(reserve(shop, sku).await?);
    }
    if fail {
        return Err(ShopError::Timeout);
    }
    Ok(reserved)
}

#[tokio::test(start_paused = true)]
async fn each_call_of_one_name_in_a_run_is_its_own_occurrence() {
    let (runtime, seen, _) = observed();
    let shop = Shop::default();
    assert!(
        runtime
            .scope(reserve_lines(&shop, "o", true))
            .await
            .is_err()
    );
    let lines = runtime.scope(reserve_lines(&shop, "o", false)).await;
    assert_eq!(lines.unwrap(), [7, 7, 7]);
    // Three occurrences recorded once each; the second run replayed all three.
    assert_eq!(shop.count("reserve a"), 2);
    assert_eq!(shop.count("reserve b"), 1);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "recorded reserve#1",
            "recorded reserve#2",
            "recorded reserve#3",
            "replayed reserve#1",
            "replayed reserve#2",
            "replayed reserve#3",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_err_is_not_recorded_and_runs_again() {
    #[jobguard::step]
    async fn declined(shop: &Shop) -> Result<(), ShopError> {
        shop.did("declined");
        Err(ShopError::Declined)
    }
    #[jobguard::idempotent(key = order, scope = "shop.declined")]
    async fn job(shop: &Shop, order: &str) -> Result<(), ShopError> {
        declined(shop).await
    }
    let shop = Shop::default();
    let store = MemoryStore::new();
    let runtime = Runtime::builder().store(store.clone()).build();
    for _ in 0..2 {
        assert!(matches!(
            runtime.scope(job(&shop, "o")).await,
            Err(ShopError::Declined)
        ));
    }
    assert_eq!(shop.count("declined"), 2);
    let key = StoreKey {
        scope: "shop.declined",
        key: "o",
    };
    assert!(store.steps(key).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn outside_a_job_a_step_runs_every_time_and_records_nothing() {
    let shop = Shop::default();
    capture(&shop, "o").await.unwrap();
    capture(&shop, "o").await.unwrap();
    assert_eq!(shop.count("capture"), 2);
}

#[tokio::test(start_paused = true)]
async fn retry_on_a_step_retries_that_step_alone() {
    // `#[step]` above `#[retry]`: the retries are one occurrence, and one record.
    #[jobguard::step]
    #[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms")]
    async fn flaky(shop: &Shop) -> Result<u32, ShopError> {
        shop.did("flaky");
        match shop.count("flaky") {
            1 | 2 => Err(ShopError::Timeout),
            n => Ok(n),
        }
    }
    // `#[retry]` above `#[step]`: the same.
    #[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms")]
    #[jobguard::step]
    async fn flaky_too(shop: &Shop) -> Result<u32, ShopError> {
        shop.did("flaky_too");
        match shop.count("flaky_too") {
            1 => Err(ShopError::Timeout),
            n => Ok(n),
        }
    }
    #[jobguard::idempotent(key = order, scope = "shop.flaky")]
    async fn job(shop: &Shop, order: &str, fail: bool) -> Result<(u32, u32), ShopError> {
        shop.did("job");
        let one = flaky(shop).await?;
        let two = flaky_too(shop).await?;
        if fail {
            return Err(ShopError::Timeout);
        }
        Ok((one, two))
    }
    let (runtime, seen, _) = observed();
    let shop = Shop::default();
    assert!(runtime.scope(job(&shop, "o", true)).await.is_err());
    assert_eq!(runtime.scope(job(&shop, "o", false)).await.unwrap(), (3, 2));
    assert_eq!(shop.count("job"), 2);
    assert_eq!(shop.count("flaky"), 3);
    assert_eq!(shop.count("flaky_too"), 2);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "recorded flaky#1",
            "recorded flaky_too#1",
            "replayed flaky#1",
            "replayed flaky_too#1",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_step_after_a_takeover_is_refused_and_records_nothing() {
    #[jobguard::step]
    async fn slow(shop: &Shop, store: &MemoryStore) -> Result<Option<u64>, ShopError> {
        let fence = jobguard::fence();
        // This worker stalls past its lease; another takes the job over meanwhile.
        tokio::time::advance(Duration::from_secs(2)).await;
        let key = StoreKey {
            scope: "shop.zombie",
            key: "o",
        };
        let options = ClaimOptions::new(Duration::from_secs(30));
        let taken = store.claim(key, "successor", options).await?;
        assert!(matches!(taken, Claimed::Acquired { generation: 2, .. }));
        shop.did("slow");
        Ok(fence)
    }
    #[jobguard::idempotent(key = order, scope = "shop.zombie", lease = "1s")]
    async fn job(shop: &Shop, store: &MemoryStore, order: &str) -> Result<(), ShopError> {
        slow(shop, store).await?;
        shop.did("after");
        Ok(())
    }
    let store = MemoryStore::new();
    let runtime = Runtime::builder().store(store.clone()).build();
    let shop = Shop::default();
    let ran = runtime.scope(job(&shop, &store, "o")).await;
    assert!(
        matches!(ran, Err(ShopError::Jobguard(jobguard::Error::LeaseLost))),
        "{ran:?}"
    );
    assert_eq!(shop.count("slow"), 1);
    assert_eq!(shop.count("after"), 0, "the job stops at the refused step");
    let key = StoreKey {
        scope: "shop.zombie",
        key: "o",
    };
    assert!(store.steps(key).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_fence_is_read_inside_a_step() {
    #[jobguard::step]
    async fn fenced() -> Result<Option<u64>, ShopError> {
        Ok(jobguard::fence())
    }
    #[jobguard::idempotent(key = order, scope = "shop.fenced")]
    async fn job(order: &str) -> Result<Option<u64>, ShopError> {
        fenced().await
    }
    let runtime = Runtime::builder().store(MemoryStore::new()).build();
    assert_eq!(runtime.scope(job("o")).await.unwrap(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn an_undecodable_record_fails_the_step_closed_naming_the_key_and_the_step() {
    #[jobguard::idempotent(key = order, scope = "shop.corrupt")]
    async fn job(shop: &Shop, order: &str) -> Result<String, ShopError> {
        capture(shop, order).await
    }
    let store = MemoryStore::new();
    let key = StoreKey {
        scope: "shop.corrupt",
        key: "o-9",
    };
    let options = ClaimOptions::new(Duration::from_secs(30));
    store.claim(key, "earlier", options).await.unwrap();
    let step = StepKey {
        name: "capture.v1",
        occurrence: 1,
    };
    store
        .record_step(key, "earlier", step, b"not json")
        .await
        .unwrap();
    store.release(key, "earlier").await.unwrap();

    let runtime = Runtime::builder().store(store.clone()).build();
    let shop = Shop::default();
    let Err(ShopError::Jobguard(jobguard::Error::Corrupt(why))) =
        runtime.scope(job(&shop, "o-9")).await
    else {
        panic!("expected Error::Corrupt");
    };
    assert!(why.contains("capture.v1") && why.contains("o-9"), "{why}");
    assert_eq!(shop.count("capture"), 0, "the step did not run");
}

#[tokio::test(start_paused = true)]
async fn a_name_over_the_limit_is_refused_before_the_step_runs() {
    #[jobguard::idempotent(key = order, scope = "shop.long")]
    async fn job(shop: &Shop, order: &str) -> Result<(), ShopError> {
        let name = "n".repeat(jobguard::store::MAX_STEP_NAME + 1);
        jobguard::step(&name, async {
            shop.did("long");
            Ok::<_, ShopError>(())
        })
        .await
    }
    let runtime = Runtime::builder().store(MemoryStore::new()).build();
    let shop = Shop::default();
    let ran = runtime.scope(job(&shop, "o")).await;
    assert!(
        matches!(ran, Err(ShopError::Jobguard(jobguard::Error::Config(_)))),
        "{ran:?}"
    );
    assert_eq!(shop.count("long"), 0);
}

#[tokio::test(start_paused = true)]
async fn forget_and_forgive_drop_the_steps() {
    let store = MemoryStore::new();
    let key = StoreKey {
        scope: "shop.checkout",
        key: "o-3",
    };
    let runtime = Runtime::builder().store(store.clone()).build();
    let shop = Shop::failing_receipts(3);
    assert!(runtime.scope(checkout(&shop, "o-3")).await.is_err());
    assert_eq!(store.steps(key).await.unwrap().len(), 2);
    assert!(store.forget(key).await.unwrap());
    assert!(store.steps(key).await.unwrap().is_empty());
    // The next run runs every step again.
    runtime.scope(checkout(&shop, "o-3")).await.unwrap();
    assert_eq!(shop.count("capture"), 2);
}
