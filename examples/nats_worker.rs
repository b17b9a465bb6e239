//! A charge worker on NATS JetStream, through async-nats: run as many as you like; each takes
//! charge jobs from a work-queue stream, one at a time, and a job whose worker dies (`kill -9`)
//! is delivered again once its `ack_wait` lapses and finished by another worker, charging once.
//!
//! ```text
//! nats-server -js
//! redis-server --port 6379
//! cargo run --example nats_worker --features brokers -- --redis redis://127.0.0.1:6379/ [--nats URL] [--concurrency N]
//! cargo run --example nats_worker --features brokers -- --redis redis://127.0.0.1:6379/ publish order-A idem-1 100
//! ```
//!
//! The stream `payments` keeps the subject `payments.charge` as a work queue (a message leaves
//! it once acknowledged or terminated), read by the durable pull consumer `charge-workers`:
//! explicit acks, `ack_wait` 30 s, and `max_deliver` 5, so the server delivers a message five
//! times at most, counting every delivery (a `-NAK`, or an `ack_wait` that lapsed because the
//! worker died).
//!
//! Each worker pulls one message at a time (with `--concurrency N`, N pull loops), tells the
//! server every 10 s that the job is still running (`+WPI`, so a long job is not delivered
//! twice), and answers after the job:
//!
//! * the job succeeded, or replayed a stored result: `+ACK`;
//! * the job failed and wrote its one dead letter (on its last delivery, for a permanent error,
//!   or a job poisoned by crashes): `+TERM`, since the letter in the Redis stream
//!   `jobguard:dead_letters:charge` is its record now;
//! * the job failed on a delivery that is not its last: `-NAK`, and the server delivers it
//!   again;
//! * the message is not a charge job at all: `+TERM`.
//!
//! The job is `#[idempotent]` (claims and results in `RedisStore`, shared by every worker)
//! around `#[retry]`, against a simulated gateway on which `order-A` times out twice then
//! succeeds and every other order times out. `in_progress = wait("10s")` is longer than the
//! 5 s lease: a redelivery that finds the claim of a worker that died waits for its lease to
//! lapse and takes it over, counting the crash, instead of spending a delivery.
//! After 3 crashes (`crashes = 3`, the default) the job is dead-lettered `crashed`; a
//! `max_deliver` of 5 leaves a delivery for that.

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy};
use async_nats::jetstream::{self, AckKind, Context, Message};
use futures::StreamExt;
use futures::future::try_join_all;
use jobguard::{Event, RedisDeadLetters, RedisStore, Runtime, Transient};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The stream the jobs are published to.
pub const STREAM: &str = "payments";
/// The workers' durable consumer.
pub const CONSUMER: &str = "charge-workers";
/// The consumer's `max_deliver`: at least `crashes` + 1 (4), so that a job that kills its
/// worker is delivered once more after its last crash, and dead-lettered then.
pub const MAX_DELIVER: i64 = 5;
/// The consumer's `ack_wait`: a message whose worker went silent this long is delivered again.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// The Redis stream of dead letters.
const DEAD_LETTERS: &str = "jobguard:dead_letters:charge";

#[tokio::main]
async fn main() -> Result<(), async_nats::Error> {
    let mut args = std::env::args().skip(1);
    let mut nats = "nats://127.0.0.1:4222".to_owned();
    let (mut redis, mut concurrency, mut publishing) = (None, 1, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nats" => nats = args.next().ok_or("--nats needs a URL")?,
            "--redis" => redis = Some(args.next().ok_or("--redis needs a URL")?),
            "--concurrency" => concurrency = args.next().ok_or("--concurrency needs N")?.parse()?,
            "publish" => {
                let (order_id, key, amount) = (args.next(), args.next(), args.next());
                let usage = "publish ORDER_ID KEY AMOUNT";
                publishing = Some(ChargeJob {
                    order_id: order_id.ok_or(usage)?,
                    key: key.ok_or(usage)?,
                    amount: amount.ok_or(usage)?.parse()?,
                });
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let redis = redis.ok_or("usage: nats_worker --redis URL [--nats URL] [--concurrency N] [publish ORDER_ID KEY AMOUNT]")?;

    let js = jetstream::new(async_nats::connect(&nats).await?);
    let consumer = create(&js, STREAM).await?;
    if let Some(job) = publishing {
        publish(&js, STREAM, &job).await?;
        println!("published {job:?}");
        return Ok(());
    }

    Runtime::builder()
        .store(RedisStore::connect(&redis).await?)
        .dead_letters(RedisDeadLetters::connect(&redis, DEAD_LETTERS).await?)
        .observer(observer)
        .build()
        .install()
        .map_err(|_| "a jobguard runtime was installed already")?;
    println!("taking charge jobs from {STREAM} ({concurrency} at a time)");
    run(&consumer, Arc::new(Gateway::default()), concurrency).await?;
    Ok(())
}

/// The subject of `stream`'s charge jobs.
pub fn subject(stream: &str) -> String {
    format!("{stream}.charge")
}

/// Creates the work-queue stream `stream` and its consumer [`CONSUMER`], or finds them. Every
/// worker and producer does it.
pub async fn create(js: &Context, stream: &str) -> Result<PullConsumer, async_nats::Error> {
    let stream = js
        .get_or_create_stream(stream::Config {
            name: stream.to_owned(),
            subjects: vec![subject(stream)],
            retention: RetentionPolicy::WorkQueue,
            ..stream::Config::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            CONSUMER,
            pull::Config {
                durable_name: Some(CONSUMER.to_owned()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_deliver: MAX_DELIVER,
                ..pull::Config::default()
            },
        )
        .await?;
    Ok(consumer)
}

/// Publishes `job` to `stream` and waits for the stream to store it.
pub async fn publish(js: &Context, stream: &str, job: &ChargeJob) -> Result<(), async_nats::Error> {
    let body = serde_json::to_vec(job).expect("a charge job serializes");
    js.publish(subject(stream), body.into()).await?.await?;
    Ok(())
}

/// Runs `concurrency` pull loops of one message at a time on `consumer`, until an error.
pub async fn run(
    consumer: &PullConsumer,
    gateway: Arc<Gateway>,
    concurrency: usize,
) -> Result<(), async_nats::Error> {
    try_join_all((0..concurrency.max(1)).map(|_| pull_loop(consumer, &gateway))).await?;
    Ok(())
}

/// Takes one message at a time from `consumer`, until an error.
async fn pull_loop(consumer: &PullConsumer, gateway: &Gateway) -> Result<(), async_nats::Error> {
    loop {
        // A long poll for one message: the worker holds one job at a time.
        let mut batch = consumer
            .batch()
            .max_messages(1)
            .expires(Duration::from_secs(5))
            .messages()
            .await?;
        while let Some(message) = batch.next().await {
            handle(&message?, gateway).await?;
        }
    }
}

/// One message: its job in the delivery's scope, then the answer that the outcome calls for.
async fn handle(message: &Message, gateway: &Gateway) -> Result<(), async_nats::Error> {
    let Ok(job) = serde_json::from_slice::<ChargeJob>(&message.payload) else {
        eprintln!(
            "not a charge job, terminated: {:?}",
            String::from_utf8_lossy(&message.payload)
        );
        message.ack_with(AckKind::Term).await?;
        return Ok(());
    };
    let delivery = jobguard::nats::delivery(message, MAX_DELIVER);
    println!(
        "charging {} (key {}, delivery {})",
        job.order_id, job.key, delivery.number
    );
    let charged = charge(gateway, &job.order_id, job.amount, &job.key);
    let (result, settled) = in_progress(message, delivery.scope_settled(charged)).await;
    match result {
        Ok(receipt) => {
            println!("  {} charged: {receipt:?}", job.order_id);
            message.ack().await?;
        }
        // Its one dead letter is written: the server must not deliver it again.
        Err(_) if settled => message.ack_with(AckKind::Term).await?,
        Err(e) => {
            println!("  {} handed back to the stream: {e}", job.order_id);
            message.ack_with(AckKind::Nak(None)).await?;
        }
    }
    Ok(())
}

/// Runs `job`, telling the server every third of `ack_wait` that the message is in progress.
async fn in_progress<F: Future>(message: &Message, job: F) -> F::Output {
    let mut job = std::pin::pin!(job);
    let mut tick = tokio::time::interval(ACK_WAIT / 3);
    tick.tick().await; // the first tick is now
    loop {
        tokio::select! {
            output = &mut job => return output,
            _ = tick.tick() => {
                if let Err(e) = message.ack_with(AckKind::Progress).await {
                    eprintln!("could not tell the server the job is in progress: {e}");
                }
            }
        }
    }
}

/// What the stream carries: one charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeJob {
    /// The order to charge.
    pub order_id: String,
    /// The idempotency key: one charge per key, however often the job is delivered.
    pub key: String,
    /// The amount, in cents.
    pub amount: u64,
}

/// The job: idempotency outside, retry inside.
#[jobguard::idempotent(key = key, scope = "payments.charge", lease = "5s", in_progress = wait("10s"))]
#[jobguard::retry(attempts = 3, base = "200ms", cap = "2s", on = transient)]
async fn charge(
    gateway: &Gateway,
    order_id: &str,
    amount: u64,
    key: &str,
) -> Result<Receipt, GatewayError> {
    gateway.capture(order_id, amount)
}

/// What the gateway returns for a captured payment; stored by `#[idempotent]` and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The order charged.
    pub order_id: String,
    /// The gateway's tries it took.
    pub attempts_used: u32,
}

/// The gateway's failures. `#[derive(Transient)]` gives `on = transient` its verdicts.
#[derive(Debug, Transient)]
pub enum GatewayError {
    /// The gateway did not answer in time: worth another attempt.
    #[transient]
    Timeout {
        /// The order.
        order_id: String,
        /// The gateway's try that timed out.
        attempt: u32,
    },
    /// jobguard's own failure (store, lease, poisoned job), with its own verdict.
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

/// A simulated gateway, in this process: `order-A` times out twice then succeeds; any other
/// order always times out.
#[derive(Debug, Default)]
pub struct Gateway {
    tries: Mutex<HashMap<String, u32>>,
    charges: Mutex<Vec<String>>,
}

impl Gateway {
    fn capture(&self, order_id: &str, _amount: u64) -> Result<Receipt, GatewayError> {
        let attempt = {
            let mut tries = self.tries.lock().unwrap();
            let n = tries.entry(order_id.to_owned()).or_default();
            *n += 1;
            *n
        };
        println!("  {order_id} attempt {attempt}");
        if order_id != "order-A" || attempt < 3 {
            return Err(GatewayError::Timeout {
                order_id: order_id.to_owned(),
                attempt,
            });
        }
        self.charges.lock().unwrap().push(order_id.to_owned());
        Ok(Receipt {
            order_id: order_id.to_owned(),
            attempts_used: attempt,
        })
    }

    /// The orders charged, in order.
    pub fn charges(&self) -> Vec<String> {
        self.charges.lock().unwrap().clone()
    }

    /// The gateway's tries of `order_id`.
    pub fn tries(&self, order_id: &str) -> u32 {
        self.tries
            .lock()
            .unwrap()
            .get(order_id)
            .copied()
            .unwrap_or(0)
    }
}

/// Prints replays, hand-backs and dead letters as they happen.
fn observer(event: &Event<'_>) {
    match event {
        Event::Replayed { key, .. } => println!("  key {key} already processed: replayed"),
        Event::HandedBack {
            key: Some(key),
            attempts,
            delivery,
            ..
        } => println!(
            "  key {key}: {attempts} attempts on delivery {}, handed back",
            delivery.number
        ),
        Event::DeadLetter(letter) => println!(
            "  dead letter: key {:?} gave up ({:?}) after {} attempts: {}",
            letter.key, letter.reason, letter.attempts, letter.error
        ),
        _ => {}
    }
}
