//! Charging an order: the case jobguard exists for. A service queues background jobs that
//! capture payments; the gateway is flaky, and the queue delivers at least once.
//!
//! ```text
//! cargo run --example charge                      # the embedded in-memory store
//! cargo run --example charge -- --redis URL       # Redis store, dead letters in a Redis stream
//! cargo run --example charge -- --redis URL --redrive   # then the gateway recovers: redrive
//! ```
//!
//! Three deliveries of two jobs:
//!
//! - `order-A` (idempotency key `idem-1`) times out on its first two attempts and succeeds on
//!   the third.
//! - `order-A` is then delivered a second time with the same key `idem-1`: the customer must not
//!   be charged again; the redelivery replays the first result and runs no attempt.
//! - `order-B` (key `idem-2`) times out on every attempt: after 5 attempts it gives up and lands
//!   in the dead-letter sink, and no error escapes into the service.
//!
//! Policy: 5 attempts, base 500ms, cap 8s, no jitter (so the delays are readable; production
//! keeps the default full jitter). Idempotency wraps retry: the key is checked once, outside the
//! retry loop. The service answers each delivery at once and works in the background:
//!
//! ```text
//! $ POST /charge/order-A?key=idem-1
//! {"idempotency_key":"idem-1","order_id":"order-A","status":"queued"}
//! $ POST /charge/order-A?key=idem-1
//! {"idempotency_key":"idem-1","order_id":"order-A","status":"queued"}
//! $ POST /charge/order-B?key=idem-2
//! {"idempotency_key":"idem-2","order_id":"order-B","status":"queued"}
//! ```
//!
//! and once the background work has finished, its state reads:
//!
//! ```json
//! $ GET /state
//! {
//!   "attempts": [
//!     "order-A attempt 1",
//!     "order-A attempt 2",
//!     "order-A attempt 3",
//!     "order-A skipped: idempotency key idem-1 already processed",
//!     "order-B attempt 1",
//!     "order-B attempt 2",
//!     "order-B attempt 3",
//!     "order-B attempt 4",
//!     "order-B attempt 5"
//!   ],
//!   "charges": ["order-A"],
//!   "backoff_delays": [0.5, 1.0, 0.5, 1.0, 2.0, 4.0],
//!   "idempotency_store": {
//!     "idem-1": {"order_id": "order-A", "attempts_used": 3}
//!   },
//!   "dead_letter": [
//!     "order-B key=idem-2 gave up: gateway timeout on order-B (attempt 5)"
//!   ]
//! }
//! ```
//!
//! `charges` holds `order-A` once despite four attempts' worth of deliveries; the delays double
//! (0.5, 1.0 for the order that recovered on its third attempt; 0.5, 1.0, 2.0, 4.0 for the one
//! that used all five); `order-B` ends as a dead letter, not as an error in the service.
//!
//! With `--redis`, order-B's dead letter stays in the stream `jobguard:dead_letters:charge`,
//! carrying its key and the job's arguments. With `--redrive` too, the gateway then recovers and
//! every letter in the stream is redriven ([`Service::redrive`]): the job runs again from the
//! letter's payload under its idempotency key, order-B is charged once, and the letter is removed
//! because the job succeeded.

use jobguard::{
    Event, MemoryDeadLetters, MemoryStore, RedisDeadLetters, RedisStore, RedriveError, Runtime,
    Store, StoreKey, Transient,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};

const STREAM: &str = "jobguard:dead_letters:charge";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let redis_url = match args.iter().position(|a| a == "--redis") {
        Some(i) => Some(
            args.get(i + 1)
                .ok_or("--redis needs a URL, such as redis://127.0.0.1:6379")?
                .clone(),
        ),
        None => None,
    };
    let service = match &redis_url {
        Some(url) => {
            // A fresh demo: forget the keys an earlier run completed (layout `jobguard:{scope}:{key}`).
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let _: () = redis::cmd("DEL")
                .arg("jobguard:payments.charge:idem-1")
                .arg("jobguard:payments.charge:idem-2")
                .query_async(&mut conn)
                .await?;
            println!("store: redis at {url}; dead letters: stream {STREAM}");
            Service::start(
                RedisStore::connect(url).await?,
                RedisDeadLetters::connect(url, STREAM).await?,
            )
        }
        None => {
            println!("store: in memory (embedded default)");
            Service::start(MemoryStore::new(), MemoryDeadLetters::new())
        }
    };
    let state = run_scenario(&service).await;
    println!("\n$ GET /state\n{}", serde_json::to_string_pretty(&state)?);
    let Some(url) = &redis_url else {
        return Ok(());
    };
    let letters = RedisDeadLetters::connect(url, STREAM).await?;
    println!();
    for (id, letter) in letters.list().await? {
        let letter = match letter {
            Ok(letter) => letter,
            // Not a letter: say so with its id and why, and go on to the others.
            Err(corrupt) => {
                println!("in {STREAM}: {id} is not a letter: {corrupt}");
                continue;
            }
        };
        println!(
            "in {STREAM}: {id} job={} key={} reason={} attempts={} payload={}",
            letter.job,
            letter.key.as_deref().unwrap_or("-"),
            letter.reason,
            letter.attempts,
            letter
                .payload
                .as_ref()
                .map_or("-".into(), ToString::to_string),
        );
    }
    if !args.iter().any(|a| a == "--redrive") {
        println!("redrive them with: cargo run --example charge -- --redis {url} --redrive");
        return Ok(());
    }
    println!("\n$ the gateway recovers; redrive {STREAM}");
    for (id, done) in service.redrive(&letters).await? {
        let outcome = if done { "redriven, removed" } else { "kept" };
        println!("  {id}: {outcome}");
    }
    println!(
        "letters left in {STREAM}: {}\n\n$ GET /state\n{}",
        letters.len().await?,
        serde_json::to_string_pretty(&service.state().await)?
    );
    Ok(())
}

/// Delivers the three jobs, each answered `queued` at once, and returns the state once the
/// background work is done.
pub async fn run_scenario(service: &Service) -> State {
    for (order, key) in [
        ("order-A", "idem-1"),
        ("order-A", "idem-1"),
        ("order-B", "idem-2"),
    ] {
        println!("$ POST /charge/{order}?key={key}");
        let queued =
            serde_json::json!({"order_id": order, "idempotency_key": key, "status": "queued"});
        println!("{queued}");
        service.enqueue(order, key);
    }
    service.finished(3).await;
    service.state().await
}

/// The job: idempotency outside, retry inside. A give-up's dead letter carries
/// `(order_id, amount)`, so that [`Service::redrive`] can run the job again.
#[jobguard::idempotent(key = key, scope = "payments.charge")]
#[jobguard::retry(
    attempts = 5,
    base = "500ms",
    cap = "8s",
    jitter = none,
    on = transient,
    payload = (order_id, amount)
)]
pub async fn charge(
    gateway: &Gateway,
    order_id: &str,
    amount: u64,
    key: &str,
) -> Result<Receipt, GatewayError> {
    gateway.capture(order_id, amount).await
}

/// What the gateway returns for a captured payment; stored by `#[idempotent]` and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub order_id: String,
    pub attempts_used: u32,
}

/// The gateway's failures. `#[derive(Transient)]` gives `on = transient` its verdicts.
#[derive(Debug, Transient)]
pub enum GatewayError {
    /// The gateway did not answer in time: worth another attempt.
    #[transient]
    Timeout { order_id: String, attempt: u32 },
    /// The card was declined: permanent, no retry.
    Declined,
    /// jobguard's own failure (store, lease, ...), with its own verdict.
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout { order_id, attempt } => {
                write!(f, "gateway timeout on {order_id} (attempt {attempt})")
            }
            GatewayError::Declined => f.write_str("card declined"),
            GatewayError::Jobguard(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for GatewayError {}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

/// The state document: what the service did, as `GET /state` would show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Every attempt and every skipped delivery, in order.
    pub attempts: Vec<String>,
    /// Orders actually charged.
    pub charges: Vec<String>,
    /// Every retry delay, in seconds.
    pub backoff_delays: Vec<f64>,
    /// Completed idempotency keys and their stored receipts.
    pub idempotency_store: BTreeMap<String, Receipt>,
    /// One line per dead letter.
    pub dead_letter: Vec<String>,
}

/// A simulated gateway: `order-A` times out twice then succeeds; `order-B` always times out,
/// until [`Gateway::recover`].
#[derive(Default)]
pub struct Gateway {
    state: Arc<Mutex<State>>,
    tries: Mutex<BTreeMap<String, u32>>,
    recovered: AtomicBool,
}

impl Gateway {
    /// The gateway is back: from now on every capture succeeds, order-B's too.
    pub fn recover(&self) {
        self.recovered.store(true, Ordering::SeqCst);
    }

    /// Captures a payment, or times out as the scenario says.
    pub async fn capture(&self, order_id: &str, _amount: u64) -> Result<Receipt, GatewayError> {
        let attempt = {
            let mut tries = self.tries.lock().unwrap();
            let n = tries.entry(order_id.to_owned()).or_default();
            *n += 1;
            *n
        };
        self.log(format!("{order_id} attempt {attempt}"));
        let recovers_on = if order_id == "order-A" { 3 } else { u32::MAX };
        if attempt < recovers_on && !self.recovered.load(Ordering::SeqCst) {
            return Err(GatewayError::Timeout {
                order_id: order_id.to_owned(),
                attempt,
            });
        }
        self.state.lock().unwrap().charges.push(order_id.to_owned());
        Ok(Receipt {
            order_id: order_id.to_owned(),
            attempts_used: attempt,
        })
    }

    fn log(&self, line: String) {
        println!("  {line}");
        self.state.lock().unwrap().attempts.push(line);
    }
}

/// The service: a queue, one background worker running [`charge`], and the state it leaves.
#[derive(Clone)]
pub struct Service {
    gateway: Arc<Gateway>,
    runtime: Runtime,
    store: Arc<dyn Store>,
    /// Idempotency key to order id, for every job queued.
    orders: Arc<Mutex<BTreeMap<String, String>>>,
    queue: mpsc::UnboundedSender<(String, String)>,
    /// How many jobs have finished.
    done: Arc<watch::Sender<usize>>,
}

impl Service {
    /// Starts the worker on the current tokio runtime. Jobs use `store` and send their dead
    /// letters to `dead_letters`; an observer writes retries, replays and dead letters into the
    /// state document as they happen.
    pub fn start<S: Store + Clone + 'static>(
        store: S,
        dead_letters: impl jobguard::DeadLetterSink + 'static,
    ) -> Service {
        let gateway = Arc::new(Gateway::default());
        let orders: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let (state, seen) = (gateway.state.clone(), orders.clone());
        let order_of = move |key: &str| seen.lock().unwrap().get(key).cloned().unwrap_or_default();
        let runtime = Runtime::builder()
            .store(store.clone())
            .dead_letters(dead_letters)
            .observer(move |event: &Event<'_>| match event {
                Event::Retry { delay, key, .. } => {
                    let order = order_of(key.unwrap_or_default());
                    println!("    retrying {order} in {:.1}s", delay.as_secs_f64());
                    let delay = delay.as_secs_f64();
                    state.lock().unwrap().backoff_delays.push(delay);
                }
                Event::Replayed { key, .. } => {
                    let order = order_of(key);
                    let line = format!("{order} skipped: idempotency key {key} already processed");
                    println!("  {line}");
                    state.lock().unwrap().attempts.push(line);
                }
                Event::DeadLetter(letter) => {
                    let key = letter.key.clone().unwrap_or_default();
                    let line = format!("{} key={key} gave up: {}", order_of(&key), letter.error);
                    println!("  dead letter: {line}");
                    state.lock().unwrap().dead_letter.push(line);
                }
                _ => {}
            })
            .build();
        let (queue, mut jobs) = mpsc::unbounded_channel::<(String, String)>();
        let service = Service {
            gateway,
            runtime,
            store: Arc::new(store),
            orders,
            queue,
            done: Arc::new(watch::channel(0).0),
        };
        let worker = service.clone();
        tokio::spawn(async move {
            while let Some((order_id, key)) = jobs.recv().await {
                // A job's failure ends as a dead letter; nothing escapes into the service.
                let charging = charge(&worker.gateway, &order_id, 100, &key);
                let _ = worker.runtime.scope(charging).await;
                worker.done.send_modify(|done| *done += 1);
            }
        });
        service
    }

    /// Queues a charge and returns at once.
    pub fn enqueue(&self, order_id: &str, key: &str) {
        self.orders
            .lock()
            .unwrap()
            .insert(key.to_owned(), order_id.to_owned());
        let _ = self.queue.send((order_id.to_owned(), key.to_owned()));
    }

    /// Waits until `n` jobs in all have finished.
    pub async fn finished(&self, n: usize) {
        let _ = self.done.subscribe().wait_for(|done| *done >= n).await;
    }

    /// The gateway is back: redrives every letter in `letters`, running [`charge`] again from
    /// the letter's payload under its idempotency key (the give-up released the claim) with a
    /// fresh attempt budget. A letter is removed only when its job succeeds. Returns each
    /// letter's id and whether it was redriven.
    pub async fn redrive(
        &self,
        letters: &RedisDeadLetters,
    ) -> Result<Vec<(String, bool)>, jobguard::Error> {
        self.gateway.recover();
        let mut redriven = Vec::new();
        for (id, letter) in letters.list().await? {
            // An entry that is not a letter is reported and left for an operator to remove by
            // its id; the letters after it are redriven all the same.
            if let Err(corrupt) = letter {
                println!("  {id} is not a letter, it stays: {corrupt}");
                redriven.push((id, false));
                continue;
            }
            let gateway = &*self.gateway;
            let outcome = self
                .runtime
                .scope(letters.redrive(&id, |letter| async move {
                    let no_payload =
                        || jobguard::Error::Corrupt("a letter without a payload".into());
                    let (order_id, amount): (String, u64) =
                        letter.payload_as().ok_or_else(no_payload)??;
                    let key = letter.key.as_deref().unwrap_or_default();
                    charge(gateway, &order_id, amount, key).await
                }))
                .await;
            match outcome {
                Ok(done) => redriven.push((id, done)),
                Err(RedriveError::Store(e)) => return Err(e),
                Err(RedriveError::Job(e)) => {
                    println!("  redrive of {id} failed, the letter stays: {e}");
                    redriven.push((id, false));
                }
            }
        }
        Ok(redriven)
    }

    /// The state document, with the idempotency store read back from the store itself.
    pub async fn state(&self) -> State {
        let mut state = self.gateway.state.lock().unwrap().clone();
        let keys: Vec<String> = self.orders.lock().unwrap().keys().cloned().collect();
        for key in keys {
            if let Some(receipt) = completed(&*self.store, &key).await {
                state.idempotency_store.insert(key, receipt);
            }
        }
        state
    }
}

/// The stored receipt for `key`, read without disturbing it (a lookup claims nothing).
async fn completed(store: &dyn Store, key: &str) -> Option<Receipt> {
    #[derive(Deserialize)]
    struct Record {
        ok: Receipt,
    }
    let key = StoreKey {
        scope: "payments.charge",
        key,
    };
    let bytes = store.lookup(key).await.ok()??;
    serde_json::from_slice::<Record>(&bytes).ok().map(|r| r.ok)
}
