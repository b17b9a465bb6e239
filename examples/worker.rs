//! A worker process for the server example's charge jobs, on apalis's Redis storage. Run as many
//! as you like, on as many machines; each takes jobs from the queue, and a job whose worker dies
//! (`kill -9`) goes back on the queue once the worker's heartbeat lapses and is finished by
//! another, charging once.
//!
//! ```text
//! redis-server --port 6379
//! cargo run --example worker -- --redis redis://127.0.0.1:6379/ [--concurrency N] \
//!     [--failure-rate R] [--grace SECS]
//! cargo run --example server -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! The job is the server's: `#[idempotent]` (claims in `RedisStore`) around `#[retry]` (dead
//! letters in a Redis stream), against a simulated gateway. By default `order-A` times out twice
//! then succeeds and every other order times out; with `--failure-rate R` the gateway is down
//! for a share `R` of the orders (they run out of tries and are dead-lettered once), and any
//! other try times out with chance `R` (retried): with 0.05, most orders are charged once, on
//! their first or second try, and one in twenty is dead-lettered once. The gateway writes its journal (attempts, charges, retry delays,
//! dead letters) and its count of tries per order to Redis, where the server's `GET /state`
//! reads it.
//!
//! The server pushes each job with `max_attempts` 3, and `GuardLayer` reads it: a job that keeps
//! failing runs its five attempts on each of three deliveries, is handed back to the queue after
//! the first two without a dead letter, and is dead-lettered once, on the third.
//!
//! # Settings for many workers
//!
//! * `batch_size` = the worker's concurrency: a worker fetches no more jobs than it can run, so a
//!   backlog spreads over every worker instead of sitting in one worker's buffer.
//! * Heartbeat every second, dead after 10 missed (10 s): a worker busy with a backlog, or on a
//!   loaded machine, is not declared dead (and its jobs taken from it) for one late beat; a dead
//!   worker's jobs go back on the queue 10 s after it died.
//! * `#[idempotent(lease = "10s")]`, renewed every third of itself while the job runs: about the
//!   broker's 10 s, so when a dead worker's job comes back its claim has (nearly) lapsed. The
//!   delivery waits out whatever is left of it and takes it over (counted as a crash), rather
//!   than being handed back with "another worker is running this job".
//!
//! # Stopping
//!
//! SIGTERM (or Ctrl-C) stops the worker taking jobs; the jobs in flight get `--grace` seconds
//! (default 20) to finish. Whatever still runs then is dropped, and its claims are released
//! before the process exits ([`Runtime::shutdown`]), so the job runs again on another worker and
//! no crash is counted. A runner error (Redis unreachable) ends the worker the same way.
use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::GuardLayer;
use jobguard::{Event, RedisDeadLetters, RedisStore, Runtime, Transient};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// The apalis queue the server pushes to.
pub const QUEUE: &str = "payments.charge";
/// The Redis stream of dead letters.
pub const DEAD_LETTERS: &str = "jobguard:dead_letters:charge";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut settings = Settings::default();
    let mut url = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => url = Some(args.next().ok_or("--redis needs a URL")?),
            "--concurrency" => {
                settings.concurrency = args.next().ok_or("--concurrency needs N")?.parse()?;
            }
            "--failure-rate" => {
                let rate: f64 = args.next().ok_or("--failure-rate needs R")?.parse()?;
                if !(0.0..=1.0).contains(&rate) {
                    return Err("--failure-rate is a probability, from 0 to 1".into());
                }
                settings.failure_rate = Some(rate);
            }
            "--grace" => {
                let secs: u64 = args.next().ok_or("--grace needs SECS")?.parse()?;
                settings.grace = Duration::from_secs(secs);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let url =
        url.ok_or("usage: worker --redis URL [--concurrency N] [--failure-rate R] [--grace SECS]")?;
    run(&url, settings).await
}

/// How a worker runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Jobs at a time.
    pub concurrency: usize,
    /// The gateway's chance to fail each try; `None`: only `order-A` succeeds, on its third try.
    pub failure_rate: Option<f64>,
    /// How long the jobs in flight have to finish once the worker is told to stop.
    pub grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            concurrency: 1,
            failure_rate: None,
            grace: Duration::from_secs(20),
        }
    }
}

/// Runs a worker on the Redis server at `url` until it is told to stop (SIGTERM, Ctrl-C) or its
/// runner fails.
pub async fn run(url: &str, settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    let conn = apalis_redis::connect(url).await?;
    let journal = Journal::start(conn.clone());
    let orders = Orders::default();
    let runtime = Runtime::builder()
        .store(RedisStore::connect(url).await?)
        .dead_letters(RedisDeadLetters::connect(url, DEAD_LETTERS).await?)
        .observer(observer(journal.clone(), orders.clone()))
        .build();
    runtime
        .clone()
        .install()
        .map_err(|_| "a jobguard runtime was installed already")?;

    // See "Settings for many workers" above.
    let config = apalis_redis::Config::default()
        .queue(QUEUE)
        .batch_size(settings.concurrency.max(1))
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(10);
    let storage = RedisStorage::<ChargeJob>::new(conn).with_config(config);
    // A name no other worker has, now or after a restart: apalis-redis tracks each worker's
    // jobs under its name.
    let name = format!("worker-{}", std::process::id());
    println!(
        "{name}: taking charge jobs from {url} ({} at a time)",
        settings.concurrency
    );
    let worker = WorkerBuilder::new(name.clone())
        .backend(storage)
        .data(Arc::new(Gateway {
            journal,
            failure_rate: settings.failure_rate,
        }))
        .data(orders)
        .concurrency(settings.concurrency)
        .layer(GuardLayer::new())
        .build(handle);

    // Told to stop, the worker takes no more jobs and waits for those in flight; after the
    // grace, the ones still running are dropped here.
    let stopping = Arc::new(Notify::new());
    let stop_asked = Arc::new(AtomicBool::new(false));
    let signal = {
        let (stopping, stop_asked) = (stopping.clone(), stop_asked.clone());
        async move {
            stop_signal().await?;
            stop_asked.store(true, Ordering::SeqCst);
            stopping.notify_one();
            Ok::<(), std::io::Error>(())
        }
    };
    let grace_over = async {
        stopping.notified().await;
        println!(
            "{name}: stopping; the jobs in flight have {:?}",
            settings.grace
        );
        tokio::time::sleep(settings.grace).await;
    };
    let ran = tokio::select! {
        ran = worker.run_until(signal) => ran,
        () = grace_over => {
            println!("{name}: grace over; the jobs still running are dropped, their claims released");
            Ok(())
        }
    };
    // The claims of dropped jobs are released in tasks: wait for those writes, so that no claim
    // is left to lapse (and be counted as a crash by its next claimer).
    if let Err(held) = runtime.shutdown(Duration::from_secs(5)).await {
        eprintln!("{name}: {held} claims left to lapse with their lease");
    }
    println!("{name}: stopped");
    match ran {
        // apalis-redis 1.0 hands back the jobs a stopping worker fetched but did not start, and
        // fails the stop with `ReenqueueMismatch` when another worker has taken one of them
        // over meanwhile. Nothing is lost: a job this worker still holds goes back on the queue
        // once its heartbeat lapses. Said, and not an error exit.
        Err(e) if stop_asked.load(Ordering::SeqCst) => {
            eprintln!("{name}: the broker reported while stopping: {e}");
            Ok(())
        }
        ran => Ok(ran?),
    }
}

/// SIGTERM, or Ctrl-C.
async fn stop_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = terminate.recv() => Ok(()),
            ctrl_c = tokio::signal::ctrl_c() => ctrl_c,
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

/// What the queue carries: one charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeJob {
    /// The order to charge.
    pub order_id: String,
    /// The idempotency key.
    pub key: String,
    /// The amount.
    pub amount: u64,
}

/// The job: idempotency outside, retry inside. The lease is about the broker's redelivery delay
/// for a dead worker's job (see "Settings for many workers" above).
#[jobguard::idempotent(key = key, scope = "payments.charge", lease = "10s")]
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
    println!("done with {} (key {})", job.order_id, job.key);
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

/// A simulated gateway. Without a failure rate, `order-A` times out twice then succeeds and any
/// other order always times out; with one, each try of each order fails with that chance. Its
/// tries per order are counted in Redis, so the count holds across workers.
struct Gateway {
    journal: Journal,
    failure_rate: Option<f64>,
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
        let fails = match self.failure_rate {
            // An order the gateway is down for (the same ones on every worker) times out every
            // time; any other try times out with the same chance.
            Some(rate) => down_for(order_id, rate) || rand::random::<f64>() < rate,
            None => order_id != "order-A" || attempt < 3,
        };
        if fails {
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

/// Whether the gateway is down for `order_id`: true for a share `rate` of the orders, the same
/// ones on every worker (a hash of the id, FNV-1a).
pub fn down_for(order_id: &str, rate: f64) -> bool {
    let hash = order_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % 10_000) as f64 / 10_000.0 < rate
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
