//! `RedisDeadLetters` against a private `redis-server` per test: letters from jobs listed, read
//! by id, counted and removed; redrive removes a letter only when the job succeeds, and a
//! `crashed` letter's redrive forgives the job's poisoned key (in a `RedisStore` on the same
//! server) and runs it; the stream is trimmed near its bound; a corrupt entry is listed in its
//! place as `Error::Corrupt` naming it (the letters around it are listed and redriven all the
//! same) and can be removed; a lost server is `Error::Store`, and a letter it could not take is
//! logged as a record that reads back and goes back in.
//!
//! These run on the real clock: the connection's timeouts are real I/O, which tokio's paused
//! clock would fire early. The jobs retry after 1 ms.

use jobguard::dead_letter::redis::{RedisDeadLetters, RedriveError};
use jobguard::store::redis::RedisStore;
use jobguard::{
    ClaimOptions, DeadLetter, DeadLetterSink, Error, Event, GiveUp, Runtime, Store, StoreKey,
};
use jobguard_testkit::redis::RedisServer;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const STREAM: &str = "jobguard:dead_letters";

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout(String),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout(order) => write!(f, "gateway timeout on {order}"),
        }
    }
}

#[jobguard::idempotent(key = order_id, scope = "tests.redis_dead_letters")]
#[jobguard::retry(attempts = 3, base = "1ms", jitter = none)]
async fn charge(order_id: &str) -> Result<(), GatewayError> {
    Err(GatewayError::Timeout(order_id.to_owned()))
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Timeout(e.to_string())
    }
}

/// Whether the gateway `charge_with_payload` calls answers.
static GATEWAY_UP: AtomicBool = AtomicBool::new(false);
/// What `charge_with_payload` charged.
static CHARGED: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Times out while the gateway is down, so it gives up with its key and its arguments in the
/// letter; charges once it is up.
#[jobguard::idempotent(key = order_id, scope = "tests.redis_payload")]
#[jobguard::retry(attempts = 2, base = "1ms", jitter = none, payload = (order_id, amount))]
async fn charge_with_payload(order_id: &str, amount: u64) -> Result<u64, GatewayError> {
    if !GATEWAY_UP.load(Ordering::SeqCst) {
        return Err(GatewayError::Timeout(order_id.to_owned()));
    }
    CHARGED.lock().unwrap().push((order_id.to_owned(), amount));
    Ok(amount)
}

/// `list`, every entry read as a letter: the tests that write no corrupt entry.
async fn letters_of(letters: &RedisDeadLetters) -> Vec<(String, DeadLetter)> {
    letters
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|(id, letter)| {
            let letter = letter.unwrap_or_else(|e| panic!("{id}: {e}"));
            (id, letter)
        })
        .collect()
}

async fn connect(server: &RedisServer) -> RedisDeadLetters {
    RedisDeadLetters::connect(&server.url(), STREAM)
        .await
        .expect("connect")
}

fn letter(n: u32) -> DeadLetter {
    let now = SystemTime::now();
    DeadLetter::new(
        "tests::job",
        None,
        GiveUp::Permanent,
        1,
        format!("e{n}"),
        now,
        now,
    )
}

#[tokio::test]
async fn letters_from_jobs_are_listed_in_order_and_read_back_by_id() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let letters = connect(&server).await;
    assert!(letters.is_empty().await.unwrap());
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    for order in ["order-B", "order-C"] {
        assert!(runtime.scope(charge(order)).await.is_err());
    }

    assert_eq!(letters.len().await.unwrap(), 2);
    let listed = letters_of(&letters).await;
    let keys: Vec<_> = listed
        .iter()
        .map(|(_, l)| l.key.as_deref().unwrap())
        .collect();
    assert_eq!(keys, ["order-B", "order-C"], "oldest first");
    let (id, first) = &listed[0];
    assert_eq!(first.job, "tests.redis_dead_letters");
    assert_eq!((first.reason, first.attempts), (GiveUp::Exhausted, 3));
    assert_eq!(first.error, "gateway timeout on order-B");
    assert_eq!(first.history, ["gateway timeout on order-B"; 3]);
    assert!(first.first_attempt <= first.last_attempt);

    assert_eq!(letters.get(id).await.unwrap().as_ref(), Some(first));
    assert_eq!(letters.get("1-1").await.unwrap(), None);

    // Another connection (another worker, or the process after a restart) sees the same letters.
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let again = RedisDeadLetters::new(store.connection(), STREAM);
    assert_eq!(letters_of(&again).await, listed);
}

#[tokio::test]
async fn remove_deletes_one_entry() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let letters = connect(&server).await;
    let a = letters.add(&letter(1)).await.unwrap();
    let b = letters.add(&letter(2)).await.unwrap();
    assert!(letters.remove(&a).await.unwrap());
    assert!(!letters.remove(&a).await.unwrap(), "already gone");
    let left = letters_of(&letters).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, b);
    assert_eq!(left[0].1.error, "e2");
}

#[tokio::test]
async fn redrive_removes_the_letter_only_when_the_job_succeeds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let letters = connect(&server).await;
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    assert!(
        runtime
            .scope(charge_with_payload("order-B", 100))
            .await
            .is_err()
    );
    let (id, letter) = letters_of(&letters).await.pop().unwrap();
    assert_eq!(letter.payload, Some(serde_json::json!(["order-B", 100])));

    // The redriven job fails: the letter stays.
    let failed = letters
        .redrive(&id, |_letter| async {
            Err::<(), _>(GatewayError::Timeout("order-B".into()))
        })
        .await;
    assert!(matches!(
        failed,
        Err(RedriveError::Job(GatewayError::Timeout(_)))
    ));
    assert_eq!(letters.len().await.unwrap(), 1);
    assert!(letters.get(&id).await.unwrap().is_some());
    // So does the job itself, giving up again: its give-up writes no second letter (nor raises
    // a `DeadLetter` event); the redriven one still stands for it.
    let failed = runtime
        .scope(letters.redrive(&id, |letter| async move {
            let (order_id, amount): (String, u64) = letter.payload_as().unwrap()?;
            charge_with_payload(&order_id, amount).await
        }))
        .await;
    assert!(matches!(failed, Err(RedriveError::Job(_))), "{failed:?}");
    assert_eq!(letters.len().await.unwrap(), 1, "one job, one letter");
    assert!(letters.get(&id).await.unwrap().is_some());
    assert!(CHARGED.lock().unwrap().is_empty());
    // Another job giving up inside a redrive is not the redriven one: its letter is written.
    let other = runtime
        .scope(letters.redrive(&id, |_letter| charge("order-other")))
        .await;
    assert!(matches!(other, Err(RedriveError::Job(_))), "{other:?}");
    assert_eq!(letters.len().await.unwrap(), 2, "the other job's letter");
    let (other_id, other_letter) = letters_of(&letters).await.pop().unwrap();
    assert_eq!(other_letter.key.as_deref(), Some("order-other"));
    assert!(letters.remove(&other_id).await.unwrap());

    // The gateway is back: the job itself runs again from the payload, under the same key (the
    // give-up released its claim) and with a fresh attempt budget. It charges, and the letter goes.
    GATEWAY_UP.store(true, Ordering::SeqCst);
    let redriven = runtime
        .scope(letters.redrive(&id, |letter| async move {
            let (order_id, amount): (String, u64) = letter.payload_as().unwrap()?;
            assert_eq!(letter.key.as_deref(), Some(order_id.as_str()));
            charge_with_payload(&order_id, amount).await
        }))
        .await;
    assert!(matches!(redriven, Ok(true)), "{redriven:?}");
    assert_eq!(*CHARGED.lock().unwrap(), [("order-B".to_owned(), 100)]);
    assert!(letters.is_empty().await.unwrap());
    // A redelivery of the original job now replays the charge instead of repeating it.
    assert_eq!(
        runtime
            .scope(charge_with_payload("order-B", 100))
            .await
            .unwrap(),
        100
    );
    assert_eq!(CHARGED.lock().unwrap().len(), 1);

    // Nothing left to redrive: the job does not run.
    let calls = AtomicU32::new(0);
    let none = letters
        .redrive(&id, |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<(), Error>(())
        })
        .await;
    assert!(matches!(none, Ok(false)));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// What `fragile` ran: each run's order and fence.
static FRAGILE_RUNS: Mutex<Vec<(String, Option<u64>)>> = Mutex::new(Vec::new());

/// A job whose worker died holding its key once is poisoned (`crashes = 1`), and letters
/// `crashed` with its arguments.
#[jobguard::idempotent(key = order_id, scope = "tests.redis_crashed", lease = "10s", crashes = 1)]
#[jobguard::retry(attempts = 2, base = "1ms", jitter = none, payload = (order_id, amount))]
async fn fragile(order_id: &str, amount: u64) -> Result<u64, Error> {
    FRAGILE_RUNS
        .lock()
        .unwrap()
        .push((order_id.to_owned(), jobguard::fence()));
    Ok(amount)
}

/// A worker of `fragile` that claims `order_id` with a short lease and dies; `fragile` is then
/// called until it finds the lapsed claim, counts it, and is refused: poisoned, one letter.
async fn poisoned_by_a_dead_worker(runtime: &Runtime, store: &RedisStore, order_id: &str) {
    let k = StoreKey {
        scope: "tests.redis_crashed",
        key: order_id,
    };
    let lease = std::time::Duration::from_millis(200);
    store
        .claim(k, "dead-worker", ClaimOptions::new(lease))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match runtime.scope(fragile(order_id, 7)).await {
            // The dead worker's lease runs on the server's clock: look again until it lapsed.
            Err(Error::InProgress) => {
                assert!(std::time::Instant::now() < deadline, "still held after 5 s");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(Error::Poisoned { crashes: 1 }) => return,
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn redriving_a_crashed_letter_forgives_the_key_runs_the_job_and_removes_the_letter() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let letters = RedisDeadLetters::new(store.connection(), STREAM);
    let runtime = Runtime::builder()
        .store(store.clone())
        .dead_letters(letters.clone())
        .build();
    poisoned_by_a_dead_worker(&runtime, &store, "order-C").await;
    poisoned_by_a_dead_worker(&runtime, &store, "order-D").await;
    assert!(FRAGILE_RUNS.lock().unwrap().is_empty(), "never ran");
    let listed = letters.list().await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let (id, letter) = listed[0].clone();
    let letter = letter.expect("a letter the stream holds whole");
    assert_eq!(letter.reason, GiveUp::Crashed);
    assert_eq!(letter.job, "tests.redis_crashed");
    assert_eq!(letter.key.as_deref(), Some("order-C"));
    assert_eq!(letter.payload, Some(serde_json::json!(["order-C", 7])));

    // Outside a redrive the key stays refused, and no second letter is written.
    assert_eq!(
        runtime.scope(fragile("order-C", 7)).await,
        Err(Error::Poisoned { crashes: 1 })
    );
    // Inside the redrive of another letter (order-D's), order-C is not forgiven either.
    let other = runtime
        .scope(letters.redrive(&listed[1].0, |_letter| fragile("order-C", 7)))
        .await;
    assert!(
        matches!(
            other,
            Err(RedriveError::Job(Error::Poisoned { crashes: 1 }))
        ),
        "{other:?}"
    );
    assert_eq!(letters.len().await.unwrap(), 2, "both letters kept");
    assert!(FRAGILE_RUNS.lock().unwrap().is_empty(), "never ran");

    // The redrive of order-C's own letter forgives its key: the job runs, from the letter's
    // payload, under a generation after the dead worker's, and the letter goes.
    let redriven = runtime
        .scope(letters.redrive(&id, |letter| async move {
            let (order_id, amount): (String, u64) = letter.payload_as().unwrap()?;
            fragile(&order_id, amount).await
        }))
        .await;
    assert!(matches!(redriven, Ok(true)), "{redriven:?}");
    assert_eq!(
        *FRAGILE_RUNS.lock().unwrap(),
        [("order-C".to_owned(), Some(2))]
    );
    let left = letters.list().await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        left[0].1.as_ref().map(|l| l.key.as_deref()),
        Ok(Some("order-D"))
    );
    // A redelivery now replays the result; order-D is still refused.
    assert_eq!(runtime.scope(fragile("order-C", 7)).await, Ok(7));
    assert_eq!(
        runtime.scope(fragile("order-D", 7)).await,
        Err(Error::Poisoned { crashes: 1 })
    );
    assert_eq!(FRAGILE_RUNS.lock().unwrap().len(), 1, "replayed, not run");

    // A letter of order-D's job and key for another reason (its retries ran out before the
    // crashes): its redrive is no word that the poison job is to run, and forgives nothing.
    let now = SystemTime::now();
    let exhausted = DeadLetter::new(
        "tests.redis_crashed",
        Some("order-D".into()),
        GiveUp::Exhausted,
        5,
        "timeout",
        now,
        now,
    );
    let exhausted_id = letters.add(&exhausted).await.unwrap();
    let refused = runtime
        .scope(letters.redrive(&exhausted_id, |_letter| fragile("order-D", 7)))
        .await;
    assert!(
        matches!(
            refused,
            Err(RedriveError::Job(Error::Poisoned { crashes: 1 }))
        ),
        "{refused:?}"
    );
    assert_eq!(
        letters.len().await.unwrap(),
        2,
        "both of order-D's letters kept"
    );
    assert_eq!(FRAGILE_RUNS.lock().unwrap().len(), 1, "order-D never ran");
}

#[tokio::test]
async fn the_stream_is_trimmed_to_about_its_bound_keeping_the_newest() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let letters = connect(&server).await.max_len(50);
    for n in 0..1_000 {
        letters.send(letter(n)).await.unwrap();
    }
    // `MAXLEN ~` trims whole stream nodes (100 entries by default), never below the bound.
    let len = letters.len().await.unwrap();
    assert!((50..150).contains(&len), "{len} letters kept");
    // What was trimmed is said, letter for letter: no letter goes in silence.
    let said: u64 = capture
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(level, message, _)| {
            *level == tracing::Level::WARN && message.contains("oldest letter(s)")
        })
        .map(|(_, message, _)| {
            let count = message.split("gave up its ").nth(1).unwrap();
            count.split(' ').next().unwrap().parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(said, 1_000 - len as u64, "every trimmed letter counted");
    let listed = letters_of(&letters).await;
    assert_eq!(listed.len(), len);
    assert_eq!(listed.last().unwrap().1.error, "e999");
    let errors: Vec<u32> = listed
        .iter()
        .map(|(_, l)| l.error[1..].parse().unwrap())
        .collect();
    let newest: Vec<u32> = (1_000 - len as u32..1_000).collect();
    assert_eq!(errors, newest, "the oldest letters are the ones trimmed");
}

#[tokio::test]
async fn list_pages_through_a_long_stream() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let letters = connect(&server).await;
    for n in 0..1_234 {
        letters.send(letter(n)).await.unwrap();
    }
    let listed = letters_of(&letters).await;
    let errors: Vec<String> = listed.into_iter().map(|(_, l)| l.error).collect();
    let expected: Vec<String> = (0..1_234).map(|n| format!("e{n}")).collect();
    assert_eq!(errors, expected);
}

/// Appends an entry with `fields` as they are, bypassing the sink's encoder.
async fn xadd(store: &RedisStore, fields: &[&str]) -> String {
    redis::cmd("XADD")
        .arg(STREAM)
        .arg("*")
        .arg(fields)
        .query_async(&mut store.connection())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_corrupt_entry_is_an_error_naming_it_never_a_panic() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let letters = RedisDeadLetters::new(store.connection(), STREAM);
    let good = letters.add(&letter(1)).await.unwrap();
    let v2 = jobguard::dead_letter::redis::encode(&letter(2)).replacen(r#""v":1"#, r#""v":2"#, 1);
    let bad_entries: [(&[&str], &str); 5] = [
        (&["letter", "not json"], "not a JSON record"),
        (&["other", "field"], "no `letter` field"),
        (&["letter", &v2], "record format version 2"),
        (&["letter", r#"{"v":1,"job":7}"#], "not a dead letter"),
        (
            &["letter", r#"{"job":"no version"}"#],
            "without a format version",
        ),
    ];
    for (fields, why) in bad_entries {
        let id = xadd(&store, fields).await;
        let names_it = |e: &Error| {
            matches!(e, Error::Corrupt(msg)
                if msg.contains(&id) && msg.contains(STREAM) && msg.contains(why))
        };
        let got = letters.get(&id).await;
        assert!(matches!(&got, Err(e) if names_it(e)), "{fields:?}: {got:?}");
        // Listed in its place, after the good letter, as the error: not hidden, not fatal.
        let listed = letters.list().await.unwrap();
        assert_eq!(listed.len(), 2, "{fields:?}: {listed:?}");
        assert_eq!(listed[0].0, good);
        assert_eq!(listed[0].1.as_ref().unwrap().error, "e1");
        assert_eq!(listed[1].0, id);
        assert!(
            matches!(&listed[1].1, Err(e) if names_it(e)),
            "{fields:?}: {listed:?}"
        );
        assert_eq!(letters.len().await.unwrap(), 2, "len counts it");
        // The redrive of a corrupt entry neither runs the job nor removes the entry.
        let ran = AtomicBool::new(false);
        let redriven = letters
            .redrive(&id, |_| async {
                ran.store(true, Ordering::SeqCst);
                Ok::<(), Error>(())
            })
            .await;
        assert!(
            matches!(&redriven, Err(RedriveError::Store(e)) if names_it(e)),
            "{fields:?}: {redriven:?}"
        );
        assert!(!ran.load(Ordering::SeqCst), "the job did not run");
        assert_eq!(letters.len().await.unwrap(), 2, "still there");
        assert!(
            letters.remove(&id).await.unwrap(),
            "a corrupt entry can be removed"
        );
    }
    let listed = letters_of(&letters).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, good);
}

/// An operator's redrive loop over a stream with corrupt entries among its letters: every
/// letter is redriven and removed, every corrupt entry is reported with its id and reason,
/// and nothing is skipped in silence.
#[tokio::test]
async fn a_redrive_loop_reaches_every_letter_past_corrupt_entries() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let letters = RedisDeadLetters::new(store.connection(), STREAM);
    let mut good = Vec::new();
    let mut corrupt = Vec::new();
    // Corrupt entries first, between and last, across more than one `XRANGE` page (500).
    for n in 0..1_200 {
        if n % 300 == 0 || n == 1_199 {
            corrupt.push(xadd(&store, &["letter", "{truncated"]).await);
        } else {
            good.push(letters.add(&letter(n)).await.unwrap());
        }
    }

    let (mut redriven, mut reported) = (Vec::new(), Vec::new());
    for (id, letter) in letters.list().await.unwrap() {
        if let Err(why) = letter {
            reported.push((id, why));
            continue;
        }
        let ran = letters
            .redrive(&id, |letter| async move {
                assert!(letter.error.starts_with('e'));
                Ok::<(), Error>(())
            })
            .await;
        assert!(matches!(ran, Ok(true)), "{id}: {ran:?}");
        redriven.push(id);
    }
    assert_eq!(redriven, good, "every letter, in order");
    let reported_ids: Vec<_> = reported.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(reported_ids, corrupt, "every corrupt entry, by id");
    for (id, why) in &reported {
        assert!(
            matches!(why, Error::Corrupt(msg) if msg.contains(id.as_str()) && msg.contains(STREAM)),
            "{id}: {why}"
        );
    }
    // What is left is exactly the corrupt entries, and they go by id.
    assert_eq!(letters.len().await.unwrap(), corrupt.len());
    for id in &corrupt {
        assert!(letters.remove(id).await.unwrap());
    }
    assert!(letters.is_empty().await.unwrap());
}

#[tokio::test]
async fn a_lost_server_is_a_store_error_and_the_job_still_returns_its_own() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let letters = connect(&server).await;
    let id = letters.add(&letter(1)).await.unwrap();
    server.stop();

    let store_error = |r: Result<(), Error>| matches!(r, Err(Error::Store(_)));
    assert!(store_error(letters.add(&letter(2)).await.map(drop)));
    assert!(store_error(letters.list().await.map(drop)));
    assert!(store_error(letters.len().await.map(drop)));
    assert!(store_error(letters.get(&id).await.map(drop)));
    assert!(store_error(letters.remove(&id).await.map(drop)));
    let redriven = letters
        .redrive(&id, |_| async { Ok::<(), Error>(()) })
        .await;
    assert!(matches!(
        redriven,
        Err(RedriveError::Store(Error::Store(_)))
    ));
    assert!(matches!(
        RedisDeadLetters::connect(&server.url(), STREAM).await,
        Err(Error::Store(_))
    ));
    assert!(matches!(
        RedisDeadLetters::connect("not a url", STREAM).await,
        Err(Error::Store(_))
    ));

    // A job that gives up while the sink is down still fails with its own error.
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    let result = runtime.scope(charge("order-D")).await;
    assert!(
        matches!(&result, Err(GatewayError::Timeout(order)) if order == "order-D"),
        "{result:?}"
    );
}

/// Declines while the gateway is "down" with its payload, for a letter worth putting back.
#[jobguard::retry(attempts = 1, payload = (order_id, amount))]
async fn refund(order_id: &str, amount: u64) -> Result<u64, GatewayError> {
    let _ = amount;
    Err(GatewayError::Timeout(order_id.to_owned()))
}

/// One captured event: level, message and fields.
type Captured = (tracing::Level, String, Vec<(String, String)>);

/// The `jobguard` events on this thread.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "jobguard" {
            return;
        }
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        let message = fields
            .iter()
            .position(|(name, _)| name == "message")
            .map(|at| fields.remove(at).1)
            .unwrap_or_default();
        let level = *event.metadata().level();
        self.0.lock().unwrap().push((level, message, fields));
    }
}

/// A letter the sink could not take (its server is down) is raised once as `DeadLetterLost`,
/// and logged as the record the stream keeps: the logged record reads back with the decoder
/// `list` and `get` use, and goes back into the stream as it is, or through `from_log`.
#[tokio::test]
async fn a_letter_the_server_refused_is_raised_once_and_logged_as_the_stream_record() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let letters = connect(&server).await;
    server.stop();
    let lost = Arc::new(Mutex::new(Vec::new()));
    let seen = lost.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |event: &Event<'_>| {
            if let Event::DeadLetterLost { letter, error } = event {
                seen.lock()
                    .unwrap()
                    .push(((*letter).clone(), error.to_string()));
            }
        })
        .build();
    let result = runtime.scope(refund("order-L", 250)).await;
    assert!(
        matches!(&result, Err(GatewayError::Timeout(order)) if order == "order-L"),
        "the job's own error: {result:?}"
    );

    let lost = lost.lock().unwrap().clone();
    assert_eq!(lost.len(), 1, "raised once: {lost:?}");
    let (letter, sink_error) = &lost[0];
    assert_eq!(letter.job, concat!(module_path!(), "::refund"));
    assert_eq!(letter.payload, Some(serde_json::json!(["order-L", 250])));
    assert!(sink_error.contains("XADD"), "{sink_error}");

    let events = capture.0.lock().unwrap().clone();
    let errors: Vec<_> = events
        .iter()
        .filter(|(level, message, _)| {
            *level == tracing::Level::ERROR && message.contains("dead letter was lost")
        })
        .collect();
    assert_eq!(errors.len(), 1, "one log line: {events:#?}");
    let line = &errors[0].1;
    // The record is the end of the line, exactly as `add` writes it, `"v"` included.
    let (_, record) = line.split_once("; the letter: ").expect("the record");
    assert_eq!(record, jobguard::dead_letter::redis::encode(letter));
    assert!(record.starts_with(r#"{"v":1,"#), "{record}");
    assert_eq!(
        jobguard::dead_letter::redis::decode(record.as_bytes()).as_ref(),
        Ok(letter)
    );
    assert_eq!(jobguard::dead_letter::from_log(line).as_ref(), Ok(letter));
    let warned: Vec<_> = events
        .iter()
        .filter(|(_, message, _)| message == "dead letter lost")
        .collect();
    assert_eq!(warned.len(), 1, "{events:#?}");
    assert_eq!(warned[0].0, tracing::Level::WARN);
    assert!(
        warned[0]
            .2
            .contains(&("job".to_owned(), letter.job.clone())),
        "{warned:?}"
    );

    // The server is back: the logged record goes into the stream as it is (what
    // `redis-cli -x XADD <stream> '*' letter < record` does, its newline included), and
    // through `from_log` and `add`; `get` and `list` read both as the letter.
    server.restart();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let letters = RedisDeadLetters::new(store.connection(), STREAM);
    let raw = xadd(&store, &["letter", &format!("{record}\n")]).await;
    let added = letters
        .add(&jobguard::dead_letter::from_log(line).unwrap())
        .await
        .unwrap();
    assert_eq!(letters.get(&raw).await.unwrap().as_ref(), Some(letter));
    assert_eq!(letters.get(&added).await.unwrap().as_ref(), Some(letter));
    assert_eq!(
        letters_of(&letters).await,
        [(raw, letter.clone()), (added, letter.clone())]
    );

    // The README's shell lines, as written, on a log holding the line.
    let has_cli = std::process::Command::new("sh")
        .args(["-c", "command -v redis-cli"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cli {
        eprintln!("skipping the redis-cli part: no redis-cli on PATH");
        return;
    }
    let dir = std::env::temp_dir().join(format!("jobguard-lost-letter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("worker.log"),
        format!("2026-01-01T00:00:00Z ERROR jobguard: {line}\nlater: unrelated\n"),
    )
    .unwrap();
    let script = format!(
        "grep -m1 'dead letter was lost' worker.log | sed 's/^.*; the letter: //' > letter.json\n\
         redis-cli -u {} -x XADD {STREAM} '*' letter < letter.json",
        server.url()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_eq!(
        letters.get(&id).await.unwrap().as_ref(),
        Some(letter),
        "{id}"
    );
}

/// A user whose ACL allows `XADD` but not `XTRIM`: the letter is taken (never reported lost, so
/// never logged to be added twice), and the failed trim is said.
#[tokio::test]
async fn a_letter_the_stream_took_is_not_lost_when_its_trim_is_refused() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let admin = connect(&server).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("writer")
        .arg("on")
        .arg("nopass")
        .arg("~*")
        .arg("+@all")
        .arg("-xtrim")
        .query_async(&mut conn)
        .await
        .unwrap();
    let url = format!("redis://writer:x@127.0.0.1:{}/", server.port());
    let writer = RedisDeadLetters::connect(&url, STREAM).await.unwrap();
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let id = writer
        .add(&letter(1))
        .await
        .expect("the stream took the letter");
    assert!(admin.get(&id).await.unwrap().is_some());
    let said = capture.0.lock().unwrap().clone();
    assert!(
        said.iter()
            .any(|(level, message, _)| *level == tracing::Level::WARN
                && message.contains("XTRIM failed")),
        "{said:?}"
    );
    assert!(
        !said
            .iter()
            .any(|(_, message, _)| message.contains("was lost")),
        "{said:?}"
    );
}
