//! Poison jobs and the fence, in one process on the in-memory store under a paused clock: a job
//! whose claims were abandoned `crashes` times is refused with `Error::Poisoned`, dead-lettered
//! once with `GiveUp::Crashed` (with its event and metrics label), never run again, and not
//! retried by `#[retry]`, until an operator forgives its key (`jobguard::idempotency::forgive`,
//! by the job's name and key as its letter gives them), after which it runs and its crashes count
//! from zero; `jobguard::fence()` gives the body its claim's generation at any depth.
//!
//! A worker that dies is played by a claim made directly on the store and never completed or
//! released: its lease lapses, which is all a dead worker leaves behind.

use jobguard::Observer as _;
use jobguard::{
    ClaimOptions, Claimed, Error, Event, GiveUp, MemoryDeadLetters, MemoryStore, Runtime, Store,
    StoreKey,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(5);

fn key(order: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.poison.charge",
        key: order,
    }
}

#[jobguard::idempotent(key = order, scope = "tests.poison.charge", lease = "5s", crashes = 2)]
async fn charge(order: &str, runs: &AtomicU32) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(100)
}

/// A worker that claims `k` with `options` and dies: its claim is never completed nor
/// released, and once its lease has lapsed the next claim counts one crash.
async fn abandon(
    store: &MemoryStore,
    k: StoreKey<'_>,
    worker: &str,
    options: ClaimOptions<'_>,
) -> Claimed {
    let claimed = store.claim(k, worker, options).await.unwrap();
    tokio::time::advance(LEASE).await;
    claimed
}

/// [`abandon`] by a worker of `charge`, whose crash limit is 2.
async fn dies_holding(store: &MemoryStore, order: &str, worker: &str) -> Claimed {
    abandon(
        store,
        key(order),
        worker,
        ClaimOptions::new(LEASE).crashes(2),
    )
    .await
}

/// Collects the dead-letter events.
#[derive(Default)]
struct Seen(Mutex<Vec<(String, GiveUp)>>);

impl jobguard::Observer for Seen {
    fn on_event(&self, event: &Event<'_>) {
        if let Event::DeadLetter(letter) = event {
            self.0
                .lock()
                .unwrap()
                .push((letter.job.clone(), letter.reason));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_abandoned_at_its_crash_limit_is_dead_lettered_once_and_never_runs_again() {
    let store = MemoryStore::new();
    let letters = MemoryDeadLetters::new();
    let seen = Arc::new(Seen::default());
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(letters.clone())
        .observer({
            let seen = seen.clone();
            move |event: &Event<'_>| seen.on_event(event)
        })
        .build();
    let runs = AtomicU32::new(0);
    runtime
        .scope(async {
            assert!(matches!(
                dies_holding(&store, "order-P", "worker-1").await,
                Claimed::Acquired { generation: 1, .. }
            ));
            assert!(matches!(
                dies_holding(&store, "order-P", "worker-2").await,
                Claimed::Acquired {
                    generation: 2,
                    crashes: 1,
                    ..
                }
            ));
            // The third worker finds the second crash: the limit of 2. Refused, dead-lettered.
            assert_eq!(
                charge("order-P", &runs).await,
                Err(Error::Poisoned { crashes: 2 })
            );
            for _ in 0..3 {
                assert_eq!(
                    charge("order-P", &runs).await,
                    Err(Error::Poisoned { crashes: 2 })
                );
            }
        })
        .await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body never ran");
    let letters = letters.letters();
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, GiveUp::Crashed);
    assert_eq!(letter.reason.as_str(), "crashed");
    assert_eq!(letter.job, "tests.poison.charge");
    assert_eq!(letter.key.as_deref(), Some("order-P"));
    assert_eq!(letter.attempts, 2, "the crashed runs");
    assert_eq!(letter.error, Error::Poisoned { crashes: 2 }.to_string());
    assert_eq!(
        *seen.0.lock().unwrap(),
        vec![("tests.poison.charge".to_owned(), GiveUp::Crashed)],
        "the event carries the reason the metrics and tracing views label"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crash_below_the_limit_is_taken_over_and_the_job_runs() {
    let store = MemoryStore::new();
    let runtime = Runtime::builder().store(store.clone()).build();
    let runs = AtomicU32::new(0);
    runtime
        .scope(async {
            dies_holding(&store, "order-Q", "worker-1").await;
            assert_eq!(charge("order-Q", &runs).await, Ok(100));
            assert_eq!(charge("order-Q", &runs).await, Ok(100), "replayed");
        })
        .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[jobguard::idempotent(key = order, scope = "tests.poison.never", lease = "5s", crashes = 0)]
async fn never_poisoned(order: &str) -> Result<Option<u64>, Error> {
    Ok(jobguard::fence())
}

#[tokio::test(start_paused = true)]
async fn crashes_zero_never_poisons() {
    let store = MemoryStore::new();
    let runtime = Runtime::builder().store(store.clone()).build();
    let k = StoreKey {
        scope: "tests.poison.never",
        key: "order-N",
    };
    let options = ClaimOptions::new(LEASE).crashes(0);
    for _ in 0..10 {
        abandon(&store, k, "dies", options).await;
    }
    let fence = runtime.scope(never_poisoned("order-N")).await;
    assert_eq!(fence, Ok(Some(11)), "the eleventh claim of the key");
}

#[jobguard::retry(attempts = 5, base = "1ms", cap = "1ms", jitter = none, on = all)]
#[jobguard::idempotent(key = order, scope = "tests.poison.retried", lease = "5s", crashes = 1)]
async fn retried(order: &str, runs: &AtomicU32) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

/// A runtime whose store holds `key` of `scope` claimed once by a worker that died, and the
/// runtime's dead-letter sink.
async fn after_one_crash(scope: &str, key: &str) -> (Runtime, MemoryDeadLetters) {
    let store = MemoryStore::new();
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(letters.clone())
        .build();
    abandon(
        &store,
        StoreKey { scope, key },
        "dies",
        ClaimOptions::new(LEASE),
    )
    .await;
    (runtime, letters)
}

#[tokio::test(start_paused = true)]
async fn under_retry_a_poisoned_job_is_refused_before_the_loop_with_one_letter() {
    let (runtime, letters) = after_one_crash("tests.poison.retried", "order-R").await;
    let runs = AtomicU32::new(0);
    let got = runtime.scope(retried("order-R", &runs)).await;
    assert_eq!(got, Err(Error::Poisoned { crashes: 1 }));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The claim is checked before the retry loop, which runs inside it: one letter, `crashed`.
    let reasons: Vec<GiveUp> = letters.letters().iter().map(|l| l.reason).collect();
    assert_eq!(reasons, vec![GiveUp::Crashed]);
}

/// The job's own dead-letter sink.
static JOB_LETTERS: std::sync::LazyLock<MemoryDeadLetters> =
    std::sync::LazyLock::new(MemoryDeadLetters::new);

#[jobguard::idempotent(key = order, scope = "tests.poison.own_sink", lease = "5s", crashes = 1)]
#[jobguard::retry(attempts = 2, base = "1ms", cap = "1ms", dead_letter = *JOB_LETTERS)]
async fn with_own_sink(order: &str, runs: &AtomicU32) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

#[tokio::test(start_paused = true)]
async fn the_crash_letter_goes_to_the_jobs_own_sink_like_its_other_letters() {
    let (runtime, runtime_letters) = after_one_crash("tests.poison.own_sink", "order-S").await;
    let runs = AtomicU32::new(0);
    let got = runtime.scope(with_own_sink("order-S", &runs)).await;
    assert_eq!(got, Err(Error::Poisoned { crashes: 1 }));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let reasons: Vec<GiveUp> = JOB_LETTERS.letters().iter().map(|l| l.reason).collect();
    assert_eq!(reasons, vec![GiveUp::Crashed]);
    assert!(
        runtime_letters.letters().is_empty(),
        "nothing in the runtime's sink"
    );
}

#[jobguard::idempotent(key = order, scope = "tests.poison.payload", lease = "5s", crashes = 1)]
#[jobguard::retry(attempts = 2, base = "1ms", cap = "1ms", payload = (order, amount))]
async fn with_payload(order: &str, amount: u64, runs: &AtomicU32) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(amount)
}

#[tokio::test(start_paused = true)]
async fn the_crash_letter_carries_the_jobs_payload_like_its_other_letters() {
    let (runtime, letters) = after_one_crash("tests.poison.payload", "order-P").await;
    let runs = AtomicU32::new(0);
    let got = runtime.scope(with_payload("order-P", 250, &runs)).await;
    assert_eq!(got, Err(Error::Poisoned { crashes: 1 }));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let letter = letters.letters().pop().expect("the crash letter");
    assert_eq!(letter.reason, GiveUp::Crashed);
    assert_eq!(
        letter
            .payload_as::<(String, u64)>()
            .expect("a payload")
            .unwrap(),
        ("order-P".to_owned(), 250),
        "redrivable from the letter, as the retry's letters are"
    );
}

/// What the body saw: the fence at the top, inside a `#[retry]` inside, in a nested function.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct Fences {
    top: Option<u64>,
    retried: Vec<Option<u64>>,
    attempt: Option<u64>,
}

async fn deep() -> Option<u64> {
    tokio::task::yield_now().await;
    jobguard::fence()
}

#[jobguard::retry(attempts = 2, base = "1ms", cap = "1ms", jitter = none, on = all)]
async fn inner(seen: &Mutex<Vec<Option<u64>>>) -> Result<(), Error> {
    let fence = deep().await;
    seen.lock().unwrap().push(fence);
    if seen.lock().unwrap().len() == 1 {
        return Err(Error::Timeout);
    }
    Ok(())
}

#[jobguard::idempotent(key = order, scope = "tests.poison.fence", lease = "5s")]
async fn fenced(order: &str) -> Result<Fences, Error> {
    let top = jobguard::fence();
    let seen = Mutex::new(Vec::new());
    inner(&seen).await?;
    let attempt = jobguard::attempt().and_then(|a| a.fence);
    Ok(Fences {
        top,
        retried: seen.into_inner().unwrap(),
        attempt,
    })
}

#[tokio::test(start_paused = true)]
async fn the_fence_is_the_claims_generation_at_any_depth_and_none_outside() {
    let store = MemoryStore::new();
    let runtime = Runtime::builder().store(store.clone()).build();
    let k = StoreKey {
        scope: "tests.poison.fence",
        key: "order-F",
    };
    // Two claims before: one released (a failed run), one abandoned (a crash).
    store
        .claim(k, "failed", ClaimOptions::new(LEASE))
        .await
        .unwrap();
    store.release(k, "failed").await.unwrap();
    abandon(&store, k, "died", ClaimOptions::new(LEASE)).await;
    assert_eq!(jobguard::fence(), None);
    let got = runtime.scope(fenced("order-F")).await.unwrap();
    assert_eq!(
        got,
        Fences {
            top: Some(3),
            retried: vec![Some(3), Some(3)],
            attempt: Some(3),
        }
    );
    assert_eq!(jobguard::fence(), None, "restored after the call");
}

#[tokio::test(start_paused = true)]
async fn a_forgiven_key_runs_its_job_again_and_counts_its_crashes_from_zero() {
    let store = MemoryStore::new();
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(letters.clone())
        .build();
    let runs = AtomicU32::new(0);
    runtime
        .scope(async {
            dies_holding(&store, "order-F", "worker-1").await;
            dies_holding(&store, "order-F", "worker-2").await;
            assert_eq!(
                charge("order-F", &runs).await,
                Err(Error::Poisoned { crashes: 2 })
            );
            // The operator forgives the key, by the job's name and key from its letter.
            let letter = letters.letters().pop().expect("the crash letter");
            let key = letter.key.as_deref().expect("a key");
            let forgiven = jobguard::idempotency::forgive(&store, &letter.job, key).await;
            assert_eq!(forgiven, Ok(true));
            // Its crashes count from zero again: one more worker dies, and the job still runs.
            assert!(matches!(
                dies_holding(&store, "order-F", "worker-3").await,
                Claimed::Acquired {
                    generation: 3,
                    crashes: 0,
                    ..
                }
            ));
            assert_eq!(charge("order-F", &runs).await, Ok(100));
            assert_eq!(charge("order-F", &runs).await, Ok(100), "replayed");
            assert_eq!(
                jobguard::idempotency::forgive(&store, "tests.poison.charge", "order-F").await,
                Ok(false),
                "a completed record is left as it is"
            );
            assert_eq!(charge("order-F", &runs).await, Ok(100), "still replayed");
        })
        .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(letters.len(), 1, "one letter, from the first refusal");
}

#[jobguard::idempotent(key = order, lease = "5s", crashes = 1)]
async fn default_scoped(order: &str) -> Result<Option<u64>, Error> {
    Ok(jobguard::fence())
}

#[tokio::test(start_paused = true)]
async fn forgive_takes_the_jobs_name_as_its_letter_gives_it() {
    let store = MemoryStore::new();
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(letters.clone())
        .build();
    // The default scope: the module path and the function's name, stored with `.` for `::`.
    let k = StoreKey {
        scope: "idempotent_poison.default_scoped",
        key: "order-D",
    };
    abandon(&store, k, "dies", ClaimOptions::new(LEASE)).await;
    let got = runtime.scope(default_scoped("order-D")).await;
    assert_eq!(got, Err(Error::Poisoned { crashes: 1 }));
    let letter = letters.letters().pop().expect("the crash letter");
    assert_eq!(letter.job, "idempotent_poison::default_scoped");
    let forgiven = jobguard::idempotency::forgive(&store, &letter.job, "order-D").await;
    assert_eq!(forgiven, Ok(true));
    // Through the runtime's store, as an operator's endpoint in the process would.
    let again = runtime
        .scope(async {
            let store = Runtime::current().store().clone();
            jobguard::idempotency::forgive(&store, "idempotent_poison::default_scoped", "order-D")
                .await
        })
        .await;
    assert_eq!(again, Ok(false), "forgiven already");
    assert_eq!(
        runtime.scope(default_scoped("order-D")).await,
        Ok(Some(2)),
        "runs, under a generation after the dead worker's"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crash_letter_the_sink_failed_to_take_is_written_by_a_later_delivery() {
    use jobguard::Delivery;
    // A sink that is down until the test brings it back.
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kept = Arc::new(Mutex::new(Vec::new()));
    let sink = jobguard::dead_letter::from_fn({
        let (up, kept) = (up.clone(), kept.clone());
        move |letter: jobguard::DeadLetter| {
            let written = up.load(Ordering::SeqCst);
            if written {
                kept.lock().unwrap().push(letter);
            }
            async move {
                match written {
                    true => Ok(()),
                    false => Err(Error::Store("the dead-letter stream is down".into())),
                }
            }
        }
    });
    let store = MemoryStore::new();
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(sink)
        .build();
    let runs = AtomicU32::new(0);
    let deliver = async |number: u32| {
        let delivery = Delivery {
            number,
            last: false,
        };
        runtime
            .scope(delivery.scope_settled(charge("order-L", &runs)))
            .await
    };
    dies_holding(&store, "order-L", "worker-1").await;
    dies_holding(&store, "order-L", "worker-2").await;

    // The delivery that finds the key poisoned holds the letter role, but the sink is down:
    // no letter, and the delivery is not settled, so the runner delivers the job again.
    let (result, settled) = deliver(1).await;
    assert_eq!(result, Err(Error::Poisoned { crashes: 2 }));
    assert!(!settled, "no letter was written: not settled");
    // A redelivery while that delivery's lease runs finds the role held: not settled either.
    let (_, settled) = deliver(2).await;
    assert!(!settled);
    assert!(kept.lock().unwrap().is_empty());

    // The sink is back; once the role's lease lapsed, the next delivery writes the letter.
    up.store(true, Ordering::SeqCst);
    tokio::time::advance(LEASE).await;
    let (result, settled) = deliver(3).await;
    assert_eq!(result, Err(Error::Poisoned { crashes: 2 }));
    assert!(settled, "its one letter written: settled");
    // Confirmed: later deliveries are settled without a second letter.
    tokio::time::advance(LEASE).await;
    let (_, settled) = deliver(4).await;
    assert!(settled);
    let letters = kept.lock().unwrap();
    assert_eq!(letters.len(), 1, "one job, one letter: {letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Crashed);
    assert_eq!(letters[0].key.as_deref(), Some("order-L"));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the poison job never ran");
}
