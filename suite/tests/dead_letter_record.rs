//! What a dead letter records beyond the last error: the bounded history of the last attempts'
//! errors (oldest dropped), and the job's payload, serialized only when the job gives up.

use jobguard::{DeadLetter, GiveUp, MemoryDeadLetters, Runtime};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout(u32),
    Declined,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout(n) => write!(f, "timeout #{n}"),
            GatewayError::Declined => f.write_str("declined"),
        }
    }
}

#[jobguard::retry(attempts = 7, base = "100ms", jitter = none)]
async fn times_out(calls: &AtomicU32) -> Result<(), GatewayError> {
    Err(GatewayError::Timeout(
        calls.fetch_add(1, Ordering::SeqCst) + 1,
    ))
}

#[jobguard::retry(attempts = 7, base = "100ms", jitter = none)]
async fn declined_on_the_second(calls: &AtomicU32) -> Result<(), GatewayError> {
    match calls.fetch_add(1, Ordering::SeqCst) + 1 {
        1 => Err(GatewayError::Timeout(1)),
        _ => Err(GatewayError::Declined),
    }
}

fn runtime() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

fn only(letters: &MemoryDeadLetters) -> DeadLetter {
    let mut all = letters.letters();
    assert_eq!(all.len(), 1, "{all:#?}");
    all.pop().unwrap()
}

/// One captured event: level, message and fields.
type Captured = (Level, String, BTreeMap<String, String>);

/// Error-level (and other) events on this thread, captured.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Visitor<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Visitor(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let level = *event.metadata().level();
        self.0.lock().unwrap().push((level, message, fields));
    }
}

impl Capture {
    /// A capturing subscriber for this thread, until the guard drops.
    fn install() -> (Capture, tracing::subscriber::DefaultGuard) {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone());
        (capture, tracing::subscriber::set_default(subscriber))
    }

    fn errors(&self) -> Vec<(String, BTreeMap<String, String>)> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(level, ..)| *level == Level::ERROR)
            .map(|(_, message, fields)| (message.clone(), fields.clone()))
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn the_history_keeps_the_last_five_errors_oldest_first() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    assert!(runtime.scope(times_out(&calls)).await.is_err());
    let letter = only(&letters);
    assert_eq!(letter.attempts, 7);
    assert_eq!(DeadLetter::HISTORY, 5);
    assert_eq!(
        letter.history,
        [
            "timeout #3",
            "timeout #4",
            "timeout #5",
            "timeout #6",
            "timeout #7"
        ]
    );
    assert_eq!(letter.error, "timeout #7", "the last entry is the error");
}

#[tokio::test(start_paused = true)]
async fn a_short_run_keeps_every_error() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    assert!(runtime.scope(declined_on_the_second(&calls)).await.is_err());
    let letter = only(&letters);
    assert_eq!(letter.reason, GiveUp::Permanent);
    assert_eq!(letter.history, ["timeout #1", "declined"]);
}

/// `(order_id, amount)`, counting how often it is serialized.
struct Args<'a> {
    order_id: &'a str,
    amount: u64,
    serialized: &'a AtomicU32,
}

impl Serialize for Args<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.serialized.fetch_add(1, Ordering::SeqCst);
        (self.order_id, self.amount).serialize(s)
    }
}

/// Fails `fail` times, with `payload` for its arguments in the letter; generic over the payload
/// so that a test can count its serializations.
#[jobguard::retry(attempts = 3, jitter = none, payload = payload)]
async fn charge<P: Serialize + Sync>(
    payload: &P,
    fail: u32,
    calls: &AtomicU32,
) -> Result<u64, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= fail {
        Err(GatewayError::Timeout(n))
    } else {
        Ok(100)
    }
}

#[tokio::test(start_paused = true)]
async fn the_payload_is_serialized_only_when_the_job_gives_up() {
    let (runtime, letters) = runtime();
    let serialized = AtomicU32::new(0);
    let args = |order_id| Args {
        order_id,
        amount: 100,
        serialized: &serialized,
    };
    runtime
        .scope(async {
            assert_eq!(
                charge(&args("order-A"), 0, &AtomicU32::new(0))
                    .await
                    .unwrap(),
                100
            );
            assert_eq!(
                charge(&args("order-A"), 2, &AtomicU32::new(0))
                    .await
                    .unwrap(),
                100
            );
        })
        .await;
    assert_eq!(
        serialized.load(Ordering::SeqCst),
        0,
        "success paths never serialize"
    );
    assert!(letters.is_empty());

    assert!(
        runtime
            .scope(charge(&args("order-B"), 99, &AtomicU32::new(0)))
            .await
            .is_err()
    );
    assert_eq!(serialized.load(Ordering::SeqCst), 1, "once, for the letter");
    let letter = only(&letters);
    assert_eq!(letter.payload, Some(serde_json::json!(["order-B", 100])));
    let (order_id, amount): (String, u64) = letter.payload_as().unwrap().unwrap();
    assert_eq!((order_id.as_str(), amount), ("order-B", 100));
    assert!(matches!(
        letter.payload_as::<(u64, u64)>(),
        Some(Err(jobguard::Error::Corrupt(_)))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_letter_without_a_payload_says_so() {
    let (runtime, letters) = runtime();
    let calls = AtomicU32::new(0);
    assert!(runtime.scope(times_out(&calls)).await.is_err());
    let letter = only(&letters);
    assert_eq!(letter.payload, None);
    assert!(letter.payload_as::<(String, u64)>().is_none());
}

struct Unserializable;

impl Serialize for Unserializable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("a socket is not data"))
    }
}

#[tokio::test(start_paused = true)]
async fn an_unserializable_payload_is_reported_and_the_letter_still_sent() {
    let (events, _guard) = Capture::install();
    let (runtime, letters) = runtime();
    assert!(
        runtime
            .scope(charge(&Unserializable, 99, &AtomicU32::new(0)))
            .await
            .is_err()
    );
    let letter = only(&letters);
    assert_eq!(letter.payload, None);
    assert_eq!(letter.attempts, 3);
    let errors = events.errors();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]
            .0
            .contains("dead_letter_record::charge gave up and its payload could not be serialized")
            && errors[0].0.contains("a socket is not data"),
        "{}",
        errors[0].0
    );
}

#[test]
fn letters_recorded_before_history_and_payload_existed_still_decode() {
    let old = serde_json::json!({
        "job": "tests::charge",
        "key": "idem-2",
        "reason": "exhausted",
        "attempts": 5,
        "error": "timeout",
        "first_attempt": {"secs_since_epoch": 1_700_000_000, "nanos_since_epoch": 0},
        "last_attempt": {"secs_since_epoch": 1_700_000_010, "nanos_since_epoch": 0},
    });
    let letter: DeadLetter = serde_json::from_value(old).unwrap();
    assert!(letter.history.is_empty());
    assert_eq!(letter.payload, None);
    assert_eq!(letter.reason, GiveUp::Exhausted);
}

#[test]
fn with_history_keeps_only_the_last_entries() {
    let now = std::time::SystemTime::now();
    let letter = DeadLetter::new("job", None, GiveUp::Exhausted, 9, "e9", now, now)
        .with_history((1..=9).map(|n| format!("e{n}")).collect());
    assert_eq!(letter.history, ["e5", "e6", "e7", "e8", "e9"]);
}

/// Counts allocations made on the current thread.
#[global_allocator]
static GLOBAL: jobguard_testkit::alloc::Counting = jobguard_testkit::alloc::Counting;

/// Polls a future that completes without waiting, with no executor to count.
fn ready<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("expected to complete at once"),
    }
}

#[test]
fn a_first_time_success_with_a_payload_allocates_nothing() {
    let serialized = AtomicU32::new(0);
    let args = Args {
        order_id: "order-A",
        amount: 100,
        serialized: &serialized,
    };
    // Warm-up: the embedded runtime and the metrics label of this job are built once.
    assert_eq!(ready(charge(&args, 0, &AtomicU32::new(0))).unwrap(), 100);
    let (allocations, ()) = jobguard_testkit::alloc::during(|| {
        for _ in 0..1_000 {
            assert_eq!(ready(charge(&args, 0, &AtomicU32::new(0))).unwrap(), 100);
        }
    });
    assert_eq!(allocations, 0, "the success path allocated");
    assert_eq!(serialized.load(Ordering::SeqCst), 0);
}
