//! A checkout job with three effects, each run once: capture the payment, reserve the stock,
//! send the receipt. An apalis worker on Redis runs it; the job is `#[idempotent]` around
//! `#[retry]`, and each effect is a `#[jobguard::step]`, recorded in Redis under the job's key.
//!
//! ```text
//! redis-server --port 6379
//! cargo run --example checkout -- --redis redis://127.0.0.1:6379/ [--order ID] [--mail-outages N]
//! ```
//!
//! The mail server is down for the first `N` sends (default 2): the receipt step fails, and
//! `#[retry]` runs the job again. The capture and the reservation were recorded by the first
//! attempt, so the later attempts replay them and go straight to the receipt: the customer is
//! charged once, the stock reserved once, the receipt sent once. Without the steps, each retry
//! would capture the payment again.
//!
//! The program pushes one order, runs a worker until the order's job is done, prints how many
//! times each effect happened (the simulated services count them in Redis), and exits. A worker
//! killed in the middle of the job (`kill -9` after the reservation) leaves its steps recorded:
//! the job's redelivery, on any worker, resumes at the receipt.
use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::GuardLayer;
use jobguard::{Event, RedisDeadLetters, RedisStore, Runtime, Transient};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The apalis queue of checkout jobs.
pub const QUEUE: &str = "shop.checkout";
/// The Redis stream of dead letters.
pub const DEAD_LETTERS: &str = "jobguard:dead_letters:checkout";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut url, mut order, mut outages) = (None, "order-1".to_owned(), 2);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => url = Some(args.next().ok_or("--redis needs a URL")?),
            "--order" => order = args.next().ok_or("--order needs an ID")?,
            "--mail-outages" => outages = args.next().ok_or("--mail-outages needs N")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let url = url.ok_or("usage: checkout --redis URL [--order ID] [--mail-outages N]")?;
    let effects = run(&url, &order, outages).await?;
    println!("{order}: {effects:?}");
    Ok(())
}

/// How many times each effect of an order happened, as the services counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Effects {
    /// Payments captured.
    pub captured: u32,
    /// Stock reservations made.
    pub reserved: u32,
    /// Receipts sent.
    pub receipts: u32,
    /// Sends the mail server was asked for, failed ones included.
    pub mail_tries: u32,
}

/// Pushes `order` (its mail server down for the first `outages` sends), runs a worker on the
/// Redis server at `url` until the order's job is done, and returns what each service counted.
pub async fn run(
    url: &str,
    order: &str,
    outages: u32,
) -> Result<Effects, Box<dyn std::error::Error>> {
    let conn = apalis_redis::connect(url).await?;
    let shop = Shop {
        redis: conn.clone(),
    };
    let done = Arc::new(Notify::new());
    let runtime = Runtime::builder()
        .store(RedisStore::connect(url).await?)
        .dead_letters(RedisDeadLetters::connect(url, DEAD_LETTERS).await?)
        .observer(|event: &Event<'_>| match event {
            Event::StepRecorded { step, key, .. } => println!("  {key}: {step} recorded"),
            Event::StepReplayed { step, key, .. } => println!("  {key}: {step} replayed"),
            Event::Retry { error, .. } => println!("  retrying: {error}"),
            _ => {}
        })
        .build();
    // Installed, unless the process has one: then this worker runs its jobs under that one.
    let _ = runtime.install();

    let mut storage = RedisStorage::<Order>::new(conn).with_config(
        apalis_redis::Config::default()
            .queue(QUEUE)
            .heartbeat_interval(Duration::from_secs(1))
            .missed_heartbeats(5),
    );
    let order = Order {
        id: order.to_owned(),
        amount: 4_200,
        sku: "sku-mug".to_owned(),
        mail_outages: outages,
    };
    storage.push(order.clone()).await?;

    let worker = WorkerBuilder::new(format!("checkout-{}", std::process::id()))
        .backend(storage)
        .data(shop.clone())
        .data(done.clone())
        .layer(GuardLayer::new())
        .build(handle);
    let finished = async move {
        done.notified().await;
        Ok::<(), std::io::Error>(())
    };
    worker.run_until(finished).await?;
    shop.effects(&order.id).await
}

/// What the queue carries: one order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// The order's id: the job's idempotency key.
    pub id: String,
    /// The amount to capture, in cents.
    pub amount: u64,
    /// What to reserve.
    pub sku: String,
    /// Sends the simulated mail server fails before it recovers.
    pub mail_outages: u32,
}

/// The apalis handler: the job, then word that it is done.
async fn handle(
    order: Order,
    shop: Data<Shop>,
    done: Data<Arc<Notify>>,
) -> Result<String, ShopError> {
    let receipt = checkout(&shop, &order).await;
    done.notify_one();
    receipt
}

/// The job. Each step's value is recorded under the order's key the first time it succeeds;
/// every later run of the job (a retry below, a redelivery, a redrive) replays it.
#[jobguard::idempotent(key = order.id, scope = "shop.checkout", lease = "10s")]
#[jobguard::retry(attempts = 4, base = "200ms", cap = "2s", jitter = none)]
async fn checkout(shop: &Shop, order: &Order) -> Result<String, ShopError> {
    let payment = capture(shop, order).await?;
    let reservation = reserve(shop, order).await?;
    send_receipt(shop, order, &payment, reservation).await
}

/// What the payment gateway returns for a capture: recorded, so it is replayed, not captured
/// again.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    id: String,
    amount: u64,
}

#[jobguard::step(name = "capture.v1")]
async fn capture(shop: &Shop, order: &Order) -> Result<Payment, ShopError> {
    let n = shop.count(&order.id, "captured").await?;
    Ok(Payment {
        id: format!("pay-{}-{n}", order.id),
        amount: order.amount,
    })
}

#[jobguard::step(name = "reserve.v1")]
async fn reserve(shop: &Shop, order: &Order) -> Result<u64, ShopError> {
    let n = shop.count(&order.id, "reserved").await?;
    Ok(n)
}

#[jobguard::step(name = "receipt.v1")]
async fn send_receipt(
    shop: &Shop,
    order: &Order,
    payment: &Payment,
    reservation: u64,
) -> Result<String, ShopError> {
    let tries = shop.count(&order.id, "mail-tries").await?;
    if tries <= u64::from(order.mail_outages) {
        return Err(ShopError::MailDown);
    }
    shop.count(&order.id, "receipts").await?;
    Ok(format!(
        "receipt for {}: {} cents ({}), reservation {reservation}",
        order.id, payment.amount, payment.id
    ))
}

/// The simulated payment gateway, stock and mail server: each counts its effects in Redis.
#[derive(Clone)]
struct Shop {
    redis: ConnectionManager,
}

impl Shop {
    /// Counts one more `what` for `order`; returns the count.
    async fn count(&self, order: &str, what: &str) -> Result<u64, ShopError> {
        let mut redis = self.redis.clone();
        let n: u64 = redis.incr(format!("shop:{order}:{what}"), 1).await?;
        Ok(n)
    }

    async fn effects(&self, order: &str) -> Result<Effects, Box<dyn std::error::Error>> {
        let mut redis = self.redis.clone();
        let mut get = async |what: &str| -> Result<u32, redis::RedisError> {
            let n: Option<u32> = redis.get(format!("shop:{order}:{what}")).await?;
            Ok(n.unwrap_or(0))
        };
        Ok(Effects {
            captured: get("captured").await?,
            reserved: get("reserved").await?,
            receipts: get("receipts").await?,
            mail_tries: get("mail-tries").await?,
        })
    }
}

/// The job's failures: `#[derive(Transient)]` says which are worth another attempt.
#[derive(Debug, Transient)]
enum ShopError {
    /// The mail server did not answer.
    #[transient]
    MailDown,
    /// A service could not be reached.
    #[transient(from)]
    Redis(redis::RedisError),
    /// jobguard's own errors (a store out of reach, a lost lease), with their own verdicts.
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::MailDown => f.write_str("mail server down"),
            ShopError::Redis(e) => write!(f, "service unreachable: {e}"),
            ShopError::Jobguard(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ShopError {}

impl From<redis::RedisError> for ShopError {
    fn from(e: redis::RedisError) -> Self {
        ShopError::Redis(e)
    }
}

impl From<jobguard::Error> for ShopError {
    fn from(e: jobguard::Error) -> Self {
        ShopError::Jobguard(e)
    }
}
