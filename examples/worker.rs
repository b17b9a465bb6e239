//! A worker process for the server example's charge jobs, on apalis's Redis storage. Run as many
//! as you like, on as many machines; each takes jobs from the queue, and a job whose worker dies
//! (`kill -9`) goes back on the queue once the worker's heartbeat lapses and is finished by
//! another, charging once.
//!
//! ```text
//! redis-server --port 6379
//! cargo run --example worker -- --redis redis://127.0.0.1:6379/ [--concurrency N]
//! cargo run --example server -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! The job is the server's: `#[idempotent]` (claims in `RedisStore`) around `#[retry]` (dead
//! letters in a Redis stream), against a simulated gateway on which `order-A` times out twice
//! then succeeds and every other order times out. The gateway writes its journal (attempts,
//! charges, retry delays, dead letters) and its count of tries per order to Redis, where the
//! server's `GET /state` reads it.
//!
//! The server pushes each job with `max_attempts` 3, and `GuardLayer` reads it: a job that keeps
//! failing runs its five attempts on each of three deliveries, is handed back to the queue after
//! the first two without a dead letter, and is dead-lettered once, on the third.

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::GuardLayer;
use jobguard::{Event, RedisDeadLetters, RedisStore, Runtime, Transient};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// The apalis queue the server pushes to.
const QUEUE: &str = "payments.charge";
/// The Redis stream of dead letters.
const DEAD_LETTERS: &str = "jobguard:dead_letters:charge";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut url, mut concurrency) = (None, 1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => url = Some(args.next().ok_or("--redis needs a URL")?),
            "--concurrency" => concurrency = args.next().ok_or("--concurrency needs N")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let url = url.ok_or("usage: worker --redis URL [--concurrency N]")?;
    run(&url, concurrency).await
}

/// Runs a worker on the Redis server at `url`, `concurrency` jobs at a time, until the process
/// ends.
pub async fn run(url: &str, concurrency: usize) -> Result<(), Box<dyn std::error::Error>> {
    let conn = apalis_redis::connect(url).await?;
    let journal = Journal::start(conn.clone());
    let orders = Orders::default();
    Runtime::builder()
        .store(RedisStore::connect(url).await?)
        .dead_letters(RedisDeadLetters::connect(url, DEAD_LETTERS).await?)
        .observer(observer(journal.clone(), orders.clone()))
        .build()
        .install()
        .map_err(|_| "a jobguard runtime was installed already")?;

    // A worker whose heartbeat stops for 2 s is dead: its jobs go back on the queue.
    let config = apalis_redis::Config::default()
        .queue(QUEUE)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2);
    let storage = RedisStorage::<ChargeJob>::new(conn).with_config(config);
    // A name no other worker has, now or after a restart: apalis-redis tracks each worker's
    // jobs under its name.
    let name = format!("worker-{}", std::process::id());
    println!("{name}: taking charge jobs from {url} ({concurrency} at a time)");
    WorkerBuilder::new(name)
        .backend(storage)
        .data(Arc::new(Gateway { journal }))
        .data(orders)
        .concurrency(concurrency)
        .layer(GuardLayer::new())
        .build(handle)
        .run()
        .await?;
    Ok(())
}

/// What the queue carries: one charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeJob {
    order_id: String,
    key: String,
    amount: u64,
}

/// The job: idempotency outside, retry inside. The lease is short so that the job of a worker
/// killed mid-charge is taken over within seconds.
#[jobguard::idempotent(key = key, scope = "payments.charge", lease = "5s")]
#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = none, on = transient)]
async fn charge(
    gateway: &Gateway,
    order_id: &str,
    amount: u64,
    key: &str,
) -> Result<Receipt, GatewayError> {
    gateway.capture(order_id, amount).await
}

/// The apalis handler: returns the job's error to the broker. On a delivery that is not the
/// last, `#[retry]` ran out of attempts without writing a dead letter, and the broker delivers
/// the job again. On the last delivery (the server pushes each job with `max_attempts` 3) it
/// wrote the job's one letter, and `GuardLayer` tells the broker not to deliver it again.
/// jobguard's own failures (the key in progress on a worker that died, the store out of reach)
/// are delivered again too.
async fn handle(
    job: ChargeJob,
    gateway: Data<Arc<Gateway>>,
    orders: Data<Orders>,
) -> Result<Receipt, GatewayError> {
    orders.insert(&job.key, &job.order_id);
    println!("charging {} (key {})", job.order_id, job.key);
    let result = charge(&gateway, &job.order_id, job.amount, &job.key).await;
    if let Err(GatewayError::Jobguard(e)) = &result {
        println!("  {} handed back to the queue: {e}", job.order_id);
    }
    result
}

/// What the gateway returns for a captured payment; stored by `#[idempotent]` and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order_id: String,
    attempts_used: u32,
}

/// The gateway's failures. `#[derive(Transient)]` gives `on = transient` its verdicts.
#[derive(Debug, Transient)]
enum GatewayError {
    /// The gateway did not answer in time: worth another attempt.
    #[transient]
    Timeout { order_id: String, attempt: u32 },
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

/// A simulated gateway: `order-A` times out twice then succeeds; any other order always times
/// out. Its tries per order are counted in Redis, so the count holds across workers.
struct Gateway {
    journal: Journal,
}

impl Gateway {
    async fn capture(&self, order_id: &str, _amount: u64) -> Result<Receipt, GatewayError> {
        let attempt: u32 = self
            .journal
            .conn
            .clone()
            .incr(format!("demo:tries:{order_id}"), 1)
            .await
            .map_err(|e| jobguard::Error::Store(e.to_string()))?;
        let line = format!("{order_id} attempt {attempt}");
        println!("  {line}");
        self.journal.push("demo:attempts", line);
        if order_id != "order-A" || attempt < 3 {
            return Err(GatewayError::Timeout {
                order_id: order_id.to_owned(),
                attempt,
            });
        }
        self.journal.push("demo:charges", order_id.to_owned());
        Ok(Receipt {
            order_id: order_id.to_owned(),
            attempts_used: attempt,
        })
    }
}

/// The gateway's journal in Redis, the lists the server's `GET /state` reads. Lines go through
/// one writer task, so they land in the order they were written.
#[derive(Clone)]
struct Journal {
    conn: ConnectionManager,
    lines: mpsc::UnboundedSender<(&'static str, String)>,
}

impl Journal {
    fn start(conn: ConnectionManager) -> Journal {
        let (lines, mut pending) = mpsc::unbounded_channel::<(&'static str, String)>();
        let mut writer = conn.clone();
        tokio::spawn(async move {
            while let Some((list, line)) = pending.recv().await {
                if let Err(e) = writer.rpush::<_, _, ()>(list, &line).await {
                    eprintln!("journal line lost ({e}): {line}");
                }
            }
        });
        Journal { conn, lines }
    }

    fn push(&self, list: &'static str, line: String) {
        let _ = self.lines.send((list, line));
    }
}

/// Idempotency key to order id, for the journal's lines.
#[derive(Clone, Default)]
struct Orders(Arc<Mutex<BTreeMap<String, String>>>);

impl Orders {
    fn insert(&self, key: &str, order_id: &str) {
        self.0
            .lock()
            .unwrap()
            .insert(key.to_owned(), order_id.to_owned());
    }

    fn of(&self, key: &str) -> String {
        self.0.lock().unwrap().get(key).cloned().unwrap_or_default()
    }
}

/// Writes retries, replays and dead letters into the journal as they happen.
fn observer(journal: Journal, orders: Orders) -> impl Fn(&Event<'_>) + Send + Sync {
    move |event: &Event<'_>| match event {
        Event::Retry { delay, key, .. } => {
            let order = orders.of(key.unwrap_or_default());
            println!("    retrying {order} in {:.1}s", delay.as_secs_f64());
            journal.push("demo:delays", delay.as_secs_f64().to_string());
        }
        Event::Replayed { key, .. } => {
            let line = format!(
                "{} skipped: idempotency key {key} already processed",
                orders.of(key)
            );
            println!("  {line}");
            journal.push("demo:attempts", line);
        }
        Event::DeadLetter(letter) => {
            let key = letter.key.clone().unwrap_or_default();
            let line = format!("{} key={key} gave up: {}", orders.of(&key), letter.error);
            println!("  dead letter: {line}");
            journal.push("demo:dead_letters", line);
        }
        Event::HandedBack {
            key: Some(key),
            attempts,
            delivery,
            ..
        } => {
            let (order, n) = (orders.of(key), delivery.number);
            println!("  {order} handed back to the queue after {attempts} attempts (delivery {n})");
        }
        _ => {}
    }
}
