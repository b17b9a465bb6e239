//! The log sink, `LogDeadLetters`, the embedded default: each letter is an error-level `tracing`
//! event with its fields when a subscriber is set, a line on stderr when none is, and is kept in
//! a bounded list. Either way the log carries the letter whole, as the record a Redis stream
//! keeps, so the log alone is enough to put it back.

use jobguard::{DeadLetter, DeadLetterSink, GiveUp, LogDeadLetters, Runtime};
use jobguard_testkit::redis::rerun_test;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tracing::field::{Field, Visit};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const ROLE_ENV: &str = "JOBGUARD_TEST_ROLE";

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway timeout on order-B")
    }
}

#[jobguard::idempotent(key = order_id, scope = "tests.charge")]
#[jobguard::retry(attempts = 2, base = "500ms", jitter = none)]
async fn charge(order_id: &str) -> Result<(), GatewayError> {
    let _ = order_id;
    Err(GatewayError::Timeout)
}

impl From<jobguard::Error> for GatewayError {
    fn from(_: jobguard::Error) -> Self {
        GatewayError::Timeout
    }
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
async fn each_letter_is_an_error_event_with_its_fields_and_is_kept() {
    let (events, _guard) = Capture::install();
    let sink = LogDeadLetters::new();
    let runtime = Runtime::builder().dead_letters(sink.clone()).build();
    assert!(runtime.scope(charge("order-B")).await.is_err());

    let errors = events.errors();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let (message, fields) = &errors[0];
    assert_eq!(message, "dead letter");
    let field = |name: &str| fields.get(name).map(String::as_str);
    assert_eq!(field("job"), Some("tests.charge"));
    assert_eq!(field("key"), Some("order-B"));
    assert_eq!(field("reason"), Some("exhausted"));
    assert_eq!(field("attempts"), Some("2"));
    assert_eq!(field("error"), Some("gateway timeout on order-B"));

    let kept = sink.kept().letters();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].key.as_deref(), Some("order-B"));
    // The `letter` field is the letter whole, as the record a Redis stream keeps.
    let record = field("letter").expect("the letter's record");
    assert_eq!(record, jobguard::dead_letter::encode(&kept[0]));
    assert_eq!(
        jobguard::dead_letter::decode(record.as_bytes()).as_ref(),
        Ok(&kept[0])
    );
}

#[tokio::test]
async fn the_kept_letters_are_bounded() {
    let sink = LogDeadLetters::with_capacity(2);
    assert_eq!(LogDeadLetters::new().kept().capacity(), 10_000);
    let now = SystemTime::now();
    for n in 0..3 {
        let letter = DeadLetter::new("job", None, GiveUp::Permanent, 1, format!("e{n}"), now, now);
        sink.send(letter).await.unwrap();
    }
    let errors: Vec<_> = sink.kept().letters().into_iter().map(|l| l.error).collect();
    assert_eq!(errors, ["e1", "e2"]);
    assert_eq!(sink.kept().dropped(), 1);
}

/// Run again as a child with no subscriber and no runtime: the embedded default sink must write
/// the letter to stderr rather than to a subscriber nobody set.
#[test]
fn without_a_subscriber_the_default_sink_writes_to_stderr() {
    if std::env::var_os(ROLE_ENV).is_some() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        assert!(rt.block_on(charge("order-B")).is_err());
        return;
    }
    let output = rerun_test("without_a_subscriber_the_default_sink_writes_to_stderr")
        .env(ROLE_ENV, "child")
        .output()
        .expect("run the child");
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "jobguard: dead letter: job tests.charge key order-B gave up (exhausted) \
             after 2 attempt(s): gateway timeout on order-B"
        ),
        "{stderr}"
    );
    // The line ends with the letter whole, as its record.
    let line = stderr
        .lines()
        .find(|l| l.starts_with("jobguard: dead letter: "))
        .expect("the line");
    assert!(line.contains("; the letter: {\"v\":1,"), "{line}");
    let letter = jobguard::dead_letter::from_log(line).expect("the record reads back");
    assert_eq!(letter.job, "tests.charge");
    assert_eq!(letter.key.as_deref(), Some("order-B"));
    assert_eq!((letter.reason, letter.attempts), (GiveUp::Exhausted, 2));
    assert_eq!(letter.history, ["gateway timeout on order-B"; 2]);
}
