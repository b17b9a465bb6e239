//! The `tracing` integration, seen by a capturing subscriber: one span per job call with `job`,
//! `key` and the current `attempt`; the body's own events inside it; events for a retry, a
//! give-up, a replay and breaker transitions; and the runtime's error reports at error level.

use jobguard::{BreakerState, CircuitBreaker, MemoryDeadLetters, MemoryStore, Runtime};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = BTreeMap<String, String>;

/// One captured event: its level, target, message, fields, and the spans it was in
/// (outermost first) with their fields at that moment.
#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    target: String,
    message: String,
    fields: Fields,
    spans: Vec<(String, Fields)>,
}

impl Captured {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// The innermost `job` span's fields.
    fn job_span(&self) -> Option<&Fields> {
        self.spans
            .iter()
            .rev()
            .find(|(name, _)| name == jobguard::observe::tracing::SPAN)
            .map(|(_, fields)| fields)
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

impl Capture {
    fn events(&self) -> Vec<Captured> {
        self.0.lock().unwrap().clone()
    }

    fn with_message(&self, message: &str) -> Vec<Captured> {
        self.events()
            .into_iter()
            .filter(|e| e.message == message)
            .collect()
    }
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        values.record(&mut Visitor(ext.get_mut::<Fields>().unwrap()));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|s| {
                        let fields = s.extensions().get::<Fields>().cloned().unwrap_or_default();
                        (s.name().to_owned(), fields)
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            message,
            fields,
            spans,
        });
    }
}

/// A capturing subscriber for this thread, until the guard drops.
fn capture() -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    (capture, tracing::subscriber::set_default(subscriber))
}

fn runtime() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .store(MemoryStore::new())
        .dead_letters(letters.clone())
        .build();
    (runtime, letters)
}

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout(u32),
    Declined,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout(n) => write!(f, "gateway timeout (attempt {n})"),
            GatewayError::Declined => f.write_str("card declined"),
            GatewayError::Jobguard(e) => write!(f, "{e}"),
        }
    }
}

#[jobguard::idempotent(key = order_id, scope = "tests.charge")]
#[jobguard::retry(attempts = 5, base = "500ms", jitter = none)]
async fn charge(order_id: &str, calls: &AtomicU32, fail: u32) -> Result<String, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    tracing::info!(n, "calling the gateway");
    if n <= fail {
        return Err(GatewayError::Timeout(n));
    }
    Ok(format!("receipt for {order_id}"))
}

#[jobguard::retry(attempts = 5, base = "500ms", jitter = none)]
async fn decline() -> Result<(), GatewayError> {
    Err(GatewayError::Declined)
}

#[tokio::test(start_paused = true)]
async fn each_call_runs_in_one_span_with_job_key_and_the_current_attempt() {
    let (events, _guard) = capture();
    let (runtime, _) = runtime();
    let calls = AtomicU32::new(0);
    let receipt = runtime.scope(charge("order-A", &calls, 2)).await.unwrap();
    assert_eq!(receipt, "receipt for order-A");

    let body = events.with_message("calling the gateway");
    assert_eq!(body.len(), 3, "{body:#?}");
    for (i, event) in body.iter().enumerate() {
        let span = event
            .job_span()
            .expect("the body runs inside the job's span");
        assert_eq!(span["job"], "tests.charge");
        assert_eq!(span["key"], "order-A");
        assert_eq!(
            span["attempt"],
            (i + 1).to_string(),
            "attempt recorded as it changes"
        );
        assert_eq!(event.field("n"), Some((i + 1).to_string().as_str()));
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_an_info_event_in_the_span_with_the_delay_and_the_error() {
    let (events, _guard) = capture();
    let (runtime, _) = runtime();
    let calls = AtomicU32::new(0);
    runtime.scope(charge("order-R", &calls, 2)).await.unwrap();

    let retries = events.with_message("retrying");
    assert_eq!(retries.len(), 2, "{retries:#?}");
    for (i, (retry, delay)) in retries.iter().zip(["500ms", "1s"]).enumerate() {
        let n = (i + 1).to_string();
        assert_eq!(retry.level, Level::INFO);
        assert_eq!(retry.target, "jobguard");
        assert_eq!(retry.field("attempt"), Some(n.as_str()));
        assert_eq!(retry.field("delay"), Some(delay));
        assert_eq!(
            retry.field("error"),
            Some(format!("gateway timeout (attempt {n})").as_str())
        );
        let span = retry.job_span().expect("in the job's span");
        assert_eq!(
            (span["job"].as_str(), span["key"].as_str()),
            ("tests.charge", "order-R")
        );
        assert_eq!(span["attempt"], n);
    }
}

#[tokio::test(start_paused = true)]
async fn a_give_up_is_a_warning_in_the_span_with_reason_attempts_and_error() {
    let (events, _guard) = capture();
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    assert!(runtime.scope(charge("order-B", &calls, 99)).await.is_err());
    assert!(runtime.scope(decline()).await.is_err());

    let gave_up = events.with_message("gave up");
    assert_eq!(gave_up.len(), 2, "{gave_up:#?}");
    let exhausted = &gave_up[0];
    assert_eq!(exhausted.level, Level::WARN);
    assert_eq!(exhausted.field("reason"), Some("exhausted"));
    assert_eq!(exhausted.field("attempts"), Some("5"));
    assert_eq!(
        exhausted.field("error"),
        Some("gateway timeout (attempt 5)")
    );
    let span = exhausted.job_span().expect("in the job's span");
    assert_eq!(
        (span["job"].as_str(), span["key"].as_str()),
        ("tests.charge", "order-B")
    );

    let permanent = &gave_up[1];
    assert_eq!(permanent.field("reason"), Some("permanent"));
    assert_eq!(permanent.field("attempts"), Some("1"));
    let span = permanent.job_span().expect("in the job's span");
    assert_eq!(span["job"], "tracing::decline");
    assert!(
        !span.contains_key("key"),
        "a job without a key has no key field"
    );
    assert_eq!(letters.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_replay_is_an_info_event_with_scope_and_key() {
    let (events, _guard) = capture();
    let (runtime, _) = runtime();
    let calls = AtomicU32::new(0);
    runtime.scope(charge("order-P", &calls, 0)).await.unwrap();
    assert!(events.with_message("replayed").is_empty());
    runtime.scope(charge("order-P", &calls, 0)).await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the redelivery is a replay"
    );

    let replayed = events.with_message("replayed");
    assert_eq!(replayed.len(), 1, "{replayed:#?}");
    assert_eq!(replayed[0].level, Level::INFO);
    assert_eq!(replayed[0].field("scope"), Some("tests.charge"));
    assert_eq!(replayed[0].field("key"), Some("order-P"));
}

static GATEWAY: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(30)).named("gateway");

#[tokio::test(start_paused = true)]
async fn breaker_transitions_are_events_warning_when_it_opens() {
    let (events, _guard) = capture();
    let (runtime, _) = runtime();
    runtime
        .scope(async {
            GATEWAY.trip();
            assert_eq!(GATEWAY.state(), BreakerState::Open);
            GATEWAY.reset();
        })
        .await;

    let transitions = events.with_message("breaker transition");
    let seen: Vec<_> = transitions
        .iter()
        .map(|e| {
            (
                e.level,
                e.field("breaker").unwrap(),
                e.field("from").unwrap(),
                e.field("to").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (Level::WARN, "gateway", "closed", "open"),
            (Level::INFO, "gateway", "open", "closed"),
        ]
    );
}

/// The letter a "dead letter was lost" line carries, read back from its record (the format a
/// Redis stream keeps, `"v"` included) with the stream's own decoder.
fn lost_letter(message: &str) -> jobguard::DeadLetter {
    let (_, record) = message
        .split_once("the letter: ")
        .expect("the letter in the line");
    assert!(record.starts_with(r#"{"v":1,"#), "{record}");
    let letter = jobguard::dead_letter::decode(record.as_bytes()).expect("the letter's record");
    assert_eq!(
        jobguard::dead_letter::from_log(message).as_ref(),
        Ok(&letter)
    );
    letter
}

#[tokio::test(start_paused = true)]
async fn a_lost_dead_letter_is_reported_at_error_level() {
    let (events, _guard) = capture();
    let sink = jobguard::dead_letter::from_fn(|_letter| async {
        Err(jobguard::Error::Store("queue unreachable".into()))
    });
    let runtime = Runtime::builder().dead_letters(sink).build();
    let result = runtime.scope(decline()).await;
    assert!(
        matches!(result, Err(GatewayError::Declined)),
        "the job's own error is returned"
    );

    let errors: Vec<_> = events
        .events()
        .into_iter()
        .filter(|e| e.level == Level::ERROR)
        .collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].target, "jobguard");
    // The target names jobguard; the message does not say it again.
    assert!(
        errors[0].message.starts_with("job tracing::decline"),
        "{}",
        errors[0].message
    );
    assert!(
        errors[0]
            .message
            .contains("tracing::decline gave up (permanent) but its dead letter was lost"),
        "{}",
        errors[0].message
    );
    assert!(errors[0].message.contains("queue unreachable"));
    // The letter itself is in the line, as JSON, so that it can still be read back.
    let letter = lost_letter(&errors[0].message);
    assert_eq!(letter.job, "tracing::decline");
    assert_eq!(letter.reason, jobguard::GiveUp::Permanent);
    assert_eq!(letter.error, "card declined");
    // And the event's own line, once, in the job's span, naming the job and the sink's error.
    let lost = events.with_message("dead letter lost");
    assert_eq!(lost.len(), 1, "{lost:#?}");
    assert_eq!(lost[0].level, Level::WARN);
    assert_eq!(lost[0].field("job"), Some("tracing::decline"));
    assert_eq!(lost[0].field("reason"), Some("permanent"));
    assert_eq!(lost[0].field("attempts"), Some("1"));
    assert_eq!(
        lost[0].field("error"),
        Some("store unavailable: queue unreachable")
    );
    assert_eq!(
        lost[0]
            .job_span()
            .and_then(|s| s.get("job"))
            .map(String::as_str),
        Some("tracing::decline")
    );
}

#[jobguard::idempotent(key = order, scope = "tests.tracing.poisoned", lease = "5s", crashes = 1)]
async fn poisoned(order: &str) -> Result<u64, jobguard::Error> {
    Ok(order.len() as u64)
}

#[tokio::test(start_paused = true)]
async fn a_crash_letter_the_sink_did_not_take_is_logged_whole() {
    use jobguard::{ClaimOptions, Claimed, Store, StoreKey};
    let (events, _guard) = capture();
    let store = MemoryStore::new();
    let sink = jobguard::dead_letter::from_fn(|_letter| async {
        Err(jobguard::Error::Store("queue unreachable".into()))
    });
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(sink)
        .build();
    // A worker claims the key and dies: its lease lapses, and the next claim counts the crash.
    let key = StoreKey {
        scope: "tests.tracing.poisoned",
        key: "order-9",
    };
    let options = ClaimOptions::new(Duration::from_secs(5)).crashes(1);
    assert!(matches!(
        store.claim(key, "dead worker", options).await,
        Ok(Claimed::Acquired { .. })
    ));
    tokio::time::advance(Duration::from_secs(5)).await;

    let result = runtime.scope(poisoned("order-9")).await;
    assert_eq!(result, Err(jobguard::Error::Poisoned { crashes: 1 }));
    // Refused for good, and the store reports the first refusal only once: the log line is the
    // letter's one record.
    assert_eq!(
        runtime.scope(poisoned("order-9")).await,
        Err(jobguard::Error::Poisoned { crashes: 1 })
    );
    let lost: Vec<_> = events
        .events()
        .into_iter()
        .filter(|e| e.level == Level::ERROR && e.message.contains("dead letter was lost"))
        .collect();
    assert_eq!(lost.len(), 1, "{lost:#?}");
    let letter = lost_letter(&lost[0].message);
    assert_eq!(letter.job, "tests.tracing.poisoned");
    assert_eq!(letter.key.as_deref(), Some("order-9"));
    assert_eq!(letter.reason, jobguard::GiveUp::Crashed);
}

#[jobguard::idempotent(key = order, scope = "tests.tracing.survivor", lease = "5s", crashes = 3)]
async fn survivor(order: &str) -> Result<u64, jobguard::Error> {
    Ok(order.len() as u64)
}

#[tokio::test(start_paused = true)]
async fn a_takeover_of_a_dead_worker_s_claim_and_a_poison_letter_are_said_with_job_and_key() {
    use jobguard::{ClaimOptions, Claimed, Store, StoreKey};
    let (events, _guard) = capture();
    let store = MemoryStore::new();
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(letters.clone())
        .build();
    // A worker claims the key and dies: the next call takes its claim over, counting a crash.
    let key = StoreKey {
        scope: "tests.tracing.survivor",
        key: "order-7",
    };
    let options = ClaimOptions::new(Duration::from_secs(5)).crashes(3);
    assert!(matches!(
        store.claim(key, "dead worker", options).await,
        Ok(Claimed::Acquired { .. })
    ));
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(runtime.scope(survivor("order-7")).await, Ok(7));
    let said: Vec<_> = events
        .events()
        .into_iter()
        .filter(|e| e.level == Level::WARN && e.message.contains("died holding it"))
        .collect();
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(
        said[0].message.contains("tests.tracing.survivor")
            && said[0].message.contains("order-7")
            && said[0].message.contains("1 crash(es) counted")
            && said[0].message.contains("(poisoned at 3)"),
        "{}",
        said[0].message
    );

    // A poison job's letter (the guard's, outside any retry span) names its job and key.
    let key = StoreKey {
        scope: "tests.tracing.poisoned",
        key: "order-8",
    };
    let options = ClaimOptions::new(Duration::from_secs(5)).crashes(1);
    assert!(matches!(
        store.claim(key, "dead worker", options).await,
        Ok(Claimed::Acquired { .. })
    ));
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(
        runtime.scope(poisoned("order-8")).await,
        Err(jobguard::Error::Poisoned { crashes: 1 })
    );
    let gave_up: Vec<_> = events
        .events()
        .into_iter()
        .filter(|e| e.message == "gave up")
        .collect();
    assert_eq!(gave_up.len(), 1, "{gave_up:#?}");
    assert_eq!(
        gave_up[0].fields.get("job").map(String::as_str),
        Some("tests.tracing.poisoned")
    );
    assert_eq!(
        gave_up[0].fields.get("key").map(String::as_str),
        Some("order-8")
    );
    assert_eq!(letters.letters().len(), 1);
}

#[jobguard::step(name = "capture.v1")]
async fn traced_capture() -> Result<u32, jobguard::Error> {
    tracing::info!("capturing");
    Ok(7)
}

#[jobguard::idempotent(key = order, scope = "shop.traced")]
async fn traced_checkout(order: &str, fail: bool) -> Result<u32, jobguard::Error> {
    let paid = traced_capture().await?;
    if fail {
        return Err(jobguard::Error::Timeout);
    }
    Ok(paid)
}

#[tokio::test(flavor = "current_thread")]
async fn a_step_runs_in_a_span_of_its_own_and_its_replay_is_an_event() {
    let (capture, _guard) = capture();
    let (runtime, _) = runtime();
    assert!(runtime.scope(traced_checkout("o-1", true)).await.is_err());
    assert_eq!(runtime.scope(traced_checkout("o-1", false)).await, Ok(7));

    let ran = capture.with_message("capturing");
    assert_eq!(ran.len(), 1, "the second run replayed the step");
    let (name, fields) = ran[0].spans.last().expect("inside the step's span");
    assert_eq!(name, jobguard::observe::tracing::STEP_SPAN);
    assert_eq!(fields.get("job").map(String::as_str), Some("shop.traced"));
    assert_eq!(fields.get("key").map(String::as_str), Some("o-1"));
    assert_eq!(fields.get("step").map(String::as_str), Some("capture.v1"));
    assert_eq!(fields.get("occurrence").map(String::as_str), Some("1"));
    let recorded = capture.with_message("step recorded");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].level, Level::DEBUG);
    let replayed = capture.with_message("step replayed");
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].level, Level::INFO);
    assert_eq!(replayed[0].field("step"), Some("capture.v1"));
}
