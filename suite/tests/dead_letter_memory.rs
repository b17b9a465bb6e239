//! `MemoryDeadLetters`: bounded, dropping the oldest letter at capacity, and never silently: a
//! drop is counted and reported at error level with the dropped letter whole, as the record a
//! Redis stream keeps. `Clone` shares one list; `drain` empties it.

use jobguard::{DeadLetter, DeadLetterSink, GiveUp, MemoryDeadLetters, Runtime};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tracing::field::{Field, Visit};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

fn letter(n: u32) -> DeadLetter {
    let now = SystemTime::now();
    DeadLetter::new(
        "tests::job",
        Some(format!("key-{n}")),
        GiveUp::Exhausted,
        5,
        format!("timeout {n}"),
        now,
        now,
    )
}

fn keys(letters: &[DeadLetter]) -> Vec<String> {
    letters.iter().map(|l| l.key.clone().unwrap()).collect()
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

#[tokio::test]
async fn at_capacity_the_oldest_letter_is_dropped_and_counted() {
    let letters = MemoryDeadLetters::with_capacity(3);
    for n in 1..=5 {
        letters.send(letter(n)).await.unwrap();
    }
    assert_eq!(letters.len(), 3);
    assert_eq!(keys(&letters.letters()), ["key-3", "key-4", "key-5"]);
    assert_eq!(letters.dropped(), 2);
    assert_eq!(letters.capacity(), 3);
}

#[tokio::test]
async fn every_drop_is_reported_at_error_level_naming_the_lost_letter() {
    let (events, _guard) = Capture::install();
    let letters = MemoryDeadLetters::with_capacity(2);
    let sent: Vec<DeadLetter> = (1..=4).map(letter).collect();
    letters.send(sent[0].clone()).await.unwrap();
    letters.send(sent[1].clone()).await.unwrap();
    assert!(events.errors().is_empty(), "no report below capacity");
    letters.send(sent[2].clone()).await.unwrap();
    letters.send(sent[3].clone()).await.unwrap();

    let errors = events.errors();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].0.contains("in-memory dead letters full (2 kept)"),
        "{}",
        errors[0].0
    );
    assert!(
        errors[0].0.contains("job tests::job key key-1"),
        "{}",
        errors[0].0
    );
    assert!(
        errors[0].0.contains("timeout 1; 1 dropped so far"),
        "{}",
        errors[0].0
    );
    assert!(errors[1].0.contains("key key-2"), "{}", errors[1].0);
    assert!(errors[1].0.contains("2 dropped so far"), "{}", errors[1].0);
    // The dropped letter itself ends the line, as its record: it can be read back and put back.
    for ((line, _), dropped) in errors.iter().zip(&sent) {
        let record = jobguard::dead_letter::encode(dropped);
        assert!(line.ends_with(&format!("; the letter: {record}")), "{line}");
        assert_eq!(jobguard::dead_letter::from_log(line).as_ref(), Ok(dropped));
    }
}

#[tokio::test]
async fn clones_share_one_list_and_one_drop_count() {
    let letters = MemoryDeadLetters::with_capacity(2);
    let other = letters.clone();
    letters.send(letter(1)).await.unwrap();
    other.send(letter(2)).await.unwrap();
    other.send(letter(3)).await.unwrap();
    assert_eq!(keys(&letters.letters()), ["key-2", "key-3"]);
    assert_eq!((letters.dropped(), other.dropped()), (1, 1));

    assert_eq!(keys(&other.drain()), ["key-2", "key-3"]);
    assert!(letters.is_empty());
    assert_eq!(letters.dropped(), 1, "draining is not dropping");
}

#[tokio::test]
async fn new_keeps_the_default_bound_and_a_zero_capacity_keeps_one() {
    assert_eq!(
        MemoryDeadLetters::new().capacity(),
        MemoryDeadLetters::DEFAULT_CAPACITY
    );
    assert_eq!(MemoryDeadLetters::DEFAULT_CAPACITY, 10_000);
    let one = MemoryDeadLetters::with_capacity(0);
    one.send(letter(1)).await.unwrap();
    one.send(letter(2)).await.unwrap();
    assert_eq!(keys(&one.letters()), ["key-2"]);
    assert_eq!(one.dropped(), 1);
}

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway timeout")
    }
}

#[jobguard::retry(attempts = 2, base = "1s", jitter = none)]
async fn always_times_out() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[tokio::test(start_paused = true)]
async fn jobs_that_give_up_fill_the_runtime_sink_up_to_its_bound() {
    let letters = MemoryDeadLetters::with_capacity(3);
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    for _ in 0..4 {
        assert!(runtime.scope(always_times_out()).await.is_err());
    }
    assert_eq!(letters.len(), 3);
    assert_eq!(letters.dropped(), 1);
    assert!(
        letters
            .letters()
            .iter()
            .all(|l| l.job == "dead_letter_memory::always_times_out"
                && l.reason == GiveUp::Exhausted
                && l.attempts == 2)
    );
}
