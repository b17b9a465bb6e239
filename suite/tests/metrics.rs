//! The `metrics` integration as a Prometheus exporter renders it: every jobguard metric once,
//! with the right `# TYPE`, no `_total_total` under either naming mode, and the values a
//! scenario leaves (attempts, retries, dead letters by reason, replays, in-progress once a call,
//! results not stored, claims that failed, breaker transitions and state, dropped letters); and letters a sink
//! refused, counted once each by job.

use jobguard::dead_letter::SinkFuture;
use jobguard::observe::metrics as names;
use jobguard::{
    CircuitBreaker, ClaimOptions, Claimed, DeadLetter, DeadLetterSink, MemoryDeadLetters,
    MemoryStore, Runtime, Store, StoreKey,
};
use jobguard_testkit::gateway::GatewayError;
use jobguard_testkit::prometheus::{samples, types};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

#[jobguard::idempotent(key = order_id, scope = "payments.charge")]
#[jobguard::retry(attempts = 5, base = "500ms", jitter = none)]
async fn charge(order_id: &str, calls: &AtomicU32, fail: u32) -> Result<u64, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= fail {
        return Err(GatewayError::Timeout);
    }
    Ok(100)
}

#[jobguard::retry(attempts = 5, base = "500ms", jitter = none)]
async fn decline() -> Result<(), GatewayError> {
    Err(GatewayError::Declined)
}

#[jobguard::idempotent(key = order_id, scope = "payments.slow", in_progress = fail)]
async fn slow(order_id: &str, gate: &Notify) -> Result<u64, GatewayError> {
    gate.notified().await;
    Ok(1)
}

#[jobguard::idempotent(key = order_id, scope = "payments.queued", in_progress = wait("10s"))]
async fn queued(order_id: &str, gate: &Notify) -> Result<u64, GatewayError> {
    gate.notified().await;
    Ok(2)
}

/// `NaN`, which JSON cannot keep: the result is not stored to replay.
#[jobguard::idempotent(key = order_id, scope = "payments.ratio")]
async fn ratio(order_id: &str) -> Result<f64, GatewayError> {
    Ok(f64::NAN)
}

#[jobguard::step]
async fn capture(order_id: &str) -> Result<u64, GatewayError> {
    Ok(order_id.len() as u64)
}

/// A job with one step, failing after it when `fail`.
#[jobguard::idempotent(key = order_id, scope = "payments.steps")]
async fn stepped(order_id: &str, fail: bool) -> Result<u64, GatewayError> {
    let captured = capture(order_id).await?;
    if fail {
        return Err(GatewayError::Declined);
    }
    Ok(captured)
}

/// Never runs: its store is out of reach, so the claim fails closed.
#[jobguard::idempotent(key = order_id, scope = "payments.unreachable")]
async fn unreachable(order_id: &str) -> Result<u64, GatewayError> {
    unreachable!("the claim of {order_id} failed: the body does not run")
}

/// Runs the scenario with `recorder` as this thread's recorder.
async fn scenario(recorder: &PrometheusRecorder) {
    let _local = metrics::set_default_local_recorder(recorder);
    jobguard::observe::metrics::describe();
    // A breaker of this run's own: its transitions are raised only when its state changes, so
    // two tests tripping and resetting one shared breaker at once would each see only some.
    let gateway = CircuitBreaker::new(3, Duration::from_secs(30)).named("gateway");
    let letters = MemoryDeadLetters::with_capacity(1);
    let runtime = Runtime::builder()
        .store(MemoryStore::new())
        .dead_letters(letters.clone())
        .build();
    runtime
        .scope(async {
            // order-A: two timeouts, then success (3 attempts, 2 retries); then a replay.
            let a = AtomicU32::new(0);
            charge("order-A", &a, 2).await.unwrap();
            charge("order-A", &a, 2).await.unwrap();
            // order-B: five timeouts, exhausted (5 attempts, 4 retries, one dead letter).
            let b = AtomicU32::new(0);
            assert!(charge("order-B", &b, 99).await.is_err());
            // A permanent failure: one attempt, one dead letter; the 1-letter sink drops one.
            assert!(decline().await.is_err());
            // A claim held by a running call: the second call is in progress.
            let gate = Notify::new();
            let (first, second) = tokio::join!(slow("order-S", &gate), async {
                let second = slow("order-S", &gate).await;
                gate.notify_one();
                second
            });
            assert!(first.is_ok());
            assert!(matches!(
                second,
                Err(GatewayError::Jobguard(jobguard::Error::InProgress))
            ));
            // A call that waits for another's run looks many times, and is counted once.
            let gate = Notify::new();
            let (first, second, ()) =
                tokio::join!(queued("order-Q", &gate), queued("order-Q", &gate), async {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    gate.notify_one();
                });
            assert_eq!((first.unwrap(), second.unwrap()), (2, 2));
            // A step recorded by a failed run, replayed by the next.
            assert!(stepped("order-T", true).await.is_err());
            assert_eq!(stepped("order-T", false).await.unwrap(), 7);
            // A result that cannot be kept to replay.
            assert!(ratio("order-R").await.unwrap().is_nan());
            // A store out of reach: the claim fails, and the job does not run.
            let down = jobguard_testkit::faulty::Faulty::default();
            down.down.store(true, Ordering::SeqCst);
            let unreachable_store = Runtime::builder().store(down).build();
            assert!(matches!(
                unreachable_store.scope(unreachable("order-U")).await,
                Err(GatewayError::Jobguard(jobguard::Error::Store(_)))
            ));
            // The breaker opens, then closes.
            gateway.trip();
            gateway.reset();
        })
        .await;
    assert_eq!(letters.dropped(), 1);
}

fn expected_types() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        (names::ATTEMPTS, "counter"),
        (names::RETRIES, "counter"),
        (names::DEAD_LETTERED, "counter"),
        (names::REPLAYS, "counter"),
        (names::STEPS_REPLAYED, "counter"),
        (names::IN_PROGRESS, "counter"),
        (names::STORE_FAILED, "counter"),
        (names::CLAIM_FAILED, "counter"),
        (names::BREAKER_TRANSITIONS, "counter"),
        (names::BREAKER_STATE, "gauge"),
        (names::DEAD_LETTERS_DROPPED, "counter"),
    ])
}

fn assert_rendered(rendered: &str) {
    assert!(!rendered.contains("_total_total"), "{rendered}");
    assert_eq!(types(rendered), expected_types(), "{rendered}");
    for name in expected_types().keys() {
        let help = format!("# HELP {name} ");
        assert_eq!(
            rendered.matches(&help).count(),
            1,
            "{name}'s help:\n{rendered}"
        );
    }
    let samples = samples(rendered);
    let expected = BTreeMap::from([
        (r#"jobguard_attempts_total{job="payments.charge"}"#, "8"),
        (r#"jobguard_attempts_total{job="metrics::decline"}"#, "1"),
        (r#"jobguard_retries_total{job="payments.charge"}"#, "6"),
        (
            r#"jobguard_dead_lettered_total{job="payments.charge",reason="exhausted"}"#,
            "1",
        ),
        (
            r#"jobguard_dead_lettered_total{job="metrics::decline",reason="permanent"}"#,
            "1",
        ),
        (r#"jobguard_replays_total{job="payments.charge"}"#, "1"),
        (r#"jobguard_replays_total{job="payments.queued"}"#, "1"),
        (
            r#"jobguard_steps_replayed_total{job="payments.steps"}"#,
            "1",
        ),
        (r#"jobguard_in_progress_total{job="payments.slow"}"#, "1"),
        (r#"jobguard_in_progress_total{job="payments.queued"}"#, "1"),
        (r#"jobguard_store_failed_total{job="payments.ratio"}"#, "1"),
        (
            r#"jobguard_claim_failed_total{job="payments.unreachable"}"#,
            "1",
        ),
        (
            r#"jobguard_breaker_transitions_total{breaker="gateway",to="open"}"#,
            "1",
        ),
        (
            r#"jobguard_breaker_transitions_total{breaker="gateway",to="closed"}"#,
            "1",
        ),
        (r#"jobguard_breaker_state{breaker="gateway"}"#, "0"),
        (r#"jobguard_dead_letters_dropped_total{sink="memory"}"#, "1"),
    ]);
    assert_eq!(samples, expected, "{rendered}");
}

#[tokio::test(start_paused = true)]
async fn the_prometheus_exporter_renders_each_metric_once_with_its_type_and_values() {
    let recorder = PrometheusBuilder::new().build_recorder();
    scenario(&recorder).await;
    assert_rendered(&recorder.handle().render());
}

#[tokio::test(start_paused = true)]
async fn recommended_naming_adds_no_second_total_suffix() {
    let recorder = PrometheusBuilder::new()
        .with_recommended_naming(true)
        .build_recorder();
    scenario(&recorder).await;
    assert_rendered(&recorder.handle().render());
}

#[tokio::test(start_paused = true)]
async fn the_breaker_gauge_follows_the_state() {
    static FLAKY: CircuitBreaker = CircuitBreaker::new(1, Duration::from_secs(10)).named("flaky");
    let recorder = PrometheusBuilder::new().build_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let runtime = Runtime::builder().build();
    let gauge = || {
        let rendered = recorder.handle().render();
        samples(&rendered)[r#"jobguard_breaker_state{breaker="flaky"}"#].to_owned()
    };
    runtime
        .scope(async {
            FLAKY.trip();
            assert_eq!(gauge(), "1");
            tokio::time::advance(Duration::from_secs(10)).await;
            assert_eq!(FLAKY.state(), jobguard::BreakerState::HalfOpen);
            assert_eq!(gauge(), "2");
            FLAKY.reset();
            assert_eq!(gauge(), "0");
        })
        .await;
}

/// A sink that refuses every letter, as a Redis sink whose server is down does.
#[derive(Default)]
struct Refusing {
    sent: AtomicU32,
}

impl DeadLetterSink for Refusing {
    fn send(&self, _letter: DeadLetter) -> SinkFuture<'_> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(jobguard::Error::Store("queue unreachable".into())) })
    }
}

#[jobguard::idempotent(key = order_id, scope = "payments.poisoned", lease = "5s", crashes = 1)]
async fn poisoned(order_id: &str) -> Result<u64, jobguard::Error> {
    Ok(order_id.len() as u64)
}

#[tokio::test(start_paused = true)]
async fn a_letter_the_sink_refuses_is_counted_as_lost_once_by_job() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    jobguard::observe::metrics::describe();
    let sink = Arc::new(Refusing::default());
    let store = MemoryStore::new();
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(sink.clone())
        .build();
    // A worker claims the poison job's key and dies: the next claim dead-letters it.
    let key = StoreKey {
        scope: "payments.poisoned",
        key: "order-P",
    };
    let options = ClaimOptions::new(Duration::from_secs(5)).crashes(1);
    assert!(matches!(
        store.claim(key, "dead worker", options).await,
        Ok(Claimed::Acquired { .. })
    ));
    tokio::time::advance(Duration::from_secs(5)).await;
    runtime
        .scope(async {
            // Two permanent failures, one exhausted job and the poison job: four letters, all
            // refused. The jobs still fail with their own errors.
            assert!(matches!(decline().await, Err(GatewayError::Declined)));
            assert!(matches!(decline().await, Err(GatewayError::Declined)));
            let calls = AtomicU32::new(0);
            assert!(matches!(
                charge("order-L", &calls, 99).await,
                Err(GatewayError::Timeout)
            ));
            assert_eq!(
                poisoned("order-P").await,
                Err(jobguard::Error::Poisoned { crashes: 1 })
            );
            // A success sends no letter and loses none.
            let calls = AtomicU32::new(0);
            charge("order-M", &calls, 0).await.unwrap();
        })
        .await;
    assert_eq!(sink.sent.load(Ordering::SeqCst), 4);

    let rendered = recorder.handle().render();
    assert_eq!(types(&rendered)[names::DEAD_LETTERS_LOST], "counter");
    assert_eq!(
        rendered
            .matches(&format!("# HELP {} ", names::DEAD_LETTERS_LOST))
            .count(),
        1,
        "{rendered}"
    );
    let lost: BTreeMap<_, _> = samples(&rendered)
        .into_iter()
        .filter(|(name, _)| name.starts_with(names::DEAD_LETTERS_LOST))
        .collect();
    assert_eq!(
        lost,
        BTreeMap::from([
            (
                r#"jobguard_dead_letters_lost_total{job="metrics::decline"}"#,
                "2"
            ),
            (
                r#"jobguard_dead_letters_lost_total{job="payments.charge"}"#,
                "1"
            ),
            (
                r#"jobguard_dead_letters_lost_total{job="payments.poisoned"}"#,
                "1"
            ),
        ]),
        "{rendered}"
    );
    // The give-ups themselves are counted as ever; the lost ones on top of them.
    let samples = samples(&rendered);
    assert_eq!(
        samples[r#"jobguard_dead_lettered_total{job="metrics::decline",reason="permanent"}"#],
        "2"
    );
    assert_eq!(
        samples[r#"jobguard_dead_lettered_total{job="payments.poisoned",reason="crashed"}"#],
        "1"
    );
}
