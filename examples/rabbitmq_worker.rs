//! A charge worker on RabbitMQ, through lapin: run as many as you like; each takes charge jobs
//! from a quorum queue, one at a time, and a job whose worker dies (`kill -9`) is delivered
//! again and finished by another worker, charging once.
//!
//! ```text
//! redis-server --port 6379
//! cargo run --example rabbitmq_worker --features brokers -- --redis redis://127.0.0.1:6379/ [--amqp URL] [--concurrency N]
//! cargo run --example rabbitmq_worker --features brokers -- --redis redis://127.0.0.1:6379/ publish order-A idem-1 100
//! ```
//!
//! The queue `payments.charge` is a quorum queue with `x-delivery-limit: 4`: RabbitMQ counts each
//! failed delivery of a message (a `basic.reject` with requeue, or a worker whose connection
//! closed before its ack) and delivers it five times at most. A message it will not deliver
//! again goes to the queue's dead-letter exchange, here the queue `payments.charge.parked`.
//!
//! Each worker consumes with a prefetch of 1 (with `--concurrency N`, N channels of prefetch 1)
//! and acknowledges a message after its job:
//!
//! * the job succeeded, or replayed a stored result: `basic.ack`;
//! * the job failed and wrote its one dead letter (on its last delivery, for a permanent error,
//!   or a job poisoned by crashes): `basic.ack` too, since the letter in the Redis stream
//!   `jobguard:dead_letters:charge` is its record now;
//! * the job failed on a delivery that is not its last: `basic.reject` with requeue, which
//!   RabbitMQ counts on every version (a `basic.nack` is not counted from RabbitMQ 4.3), and
//!   delivers it again;
//! * the message is not a charge job at all: `basic.reject` without requeue, which parks it.
//!
//! The job is `#[idempotent]` (claims and results in `RedisStore`, shared by every worker)
//! around `#[retry]`, against a simulated gateway on which `order-A` times out twice then
//! succeeds and every other order times out. `in_progress = wait("10s")` is longer than the
//! 5 s lease: a redelivery that finds the claim of a worker that died waits for its lease to
//! lapse and takes it over, counting the crash, instead of spending a delivery.
//! After 3 crashes (`crashes = 3`, the default) the job is dead-lettered `crashed`; the
//! delivery limit of 4 leaves a delivery for that.

use futures::StreamExt;
use futures::future::try_join_all;
use jobguard::{Event, RedisDeadLetters, RedisStore, Runtime, Transient};
use lapin::message::Delivery as Message;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The queue the jobs are published to.
pub const QUEUE: &str = "payments.charge";
/// The queue's `x-delivery-limit`: RabbitMQ delivers a message `DELIVERY_LIMIT + 1` times at
/// most. At least `crashes` (3), so that a job that kills its worker is delivered once more
/// after its last crash, and dead-lettered then.
pub const DELIVERY_LIMIT: u32 = 4;
/// The Redis stream of dead letters.
const DEAD_LETTERS: &str = "jobguard:dead_letters:charge";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut amqp = "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned();
    let (mut redis, mut concurrency, mut publishing) = (None, 1, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--amqp" => amqp = args.next().ok_or("--amqp needs a URL")?,
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
    let redis = redis.ok_or("usage: rabbitmq_worker --redis URL [--amqp URL] [--concurrency N] [publish ORDER_ID KEY AMOUNT]")?;

    let connection = Connection::connect(&amqp, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    declare(&channel, QUEUE).await?;
    if let Some(job) = publishing {
        publish(&channel, QUEUE, &job).await?;
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
    println!("taking charge jobs from {QUEUE} ({concurrency} at a time)");
    run(
        &connection,
        QUEUE,
        Arc::new(Gateway::default()),
        concurrency,
    )
    .await?;
    Ok(())
}

/// Declares the quorum queue `queue` with its delivery limit, and `{queue}.parked`, where
/// RabbitMQ puts a message it will not deliver again. Declaring is idempotent: every worker and
/// producer does it.
pub async fn declare(channel: &Channel, queue: &str) -> lapin::Result<()> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let parked = format!("{queue}.parked");
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(parked.as_str().into(), durable, quorum.clone())
        .await?;
    quorum.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongInt(DELIVERY_LIMIT as i32),
    );
    // Through the default exchange, by the parked queue's name.
    quorum.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    quorum.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(parked.as_str().into()),
    );
    channel.queue_declare(queue.into(), durable, quorum).await?;
    Ok(())
}

/// Publishes `job` to `queue`, persistent, and waits for RabbitMQ to confirm it.
pub async fn publish(channel: &Channel, queue: &str, job: &ChargeJob) -> lapin::Result<()> {
    let body = serde_json::to_vec(job).expect("a charge job serializes");
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default()
                .with_delivery_mode(2) // persistent
                .with_content_type("application/json".into()),
        )
        .await?
        .await?;
    Ok(())
}

/// Consumes `queue` on `concurrency` channels of prefetch 1 until the connection closes.
pub async fn run(
    connection: &Connection,
    queue: &str,
    gateway: Arc<Gateway>,
    concurrency: usize,
) -> lapin::Result<()> {
    let consumers = (0..concurrency.max(1)).map(|n| {
        let gateway = gateway.clone();
        async move {
            let channel = connection.create_channel().await?;
            // One unacknowledged message at a time on this channel: a worker that dies holds
            // one job, which RabbitMQ delivers again at once.
            channel.basic_qos(1, BasicQosOptions::default()).await?;
            let tag = format!("charge-worker-{}-{n}", std::process::id());
            let mut messages = channel
                .basic_consume(
                    queue.into(),
                    tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            while let Some(message) = messages.next().await {
                handle(&message?, &gateway).await?;
            }
            Ok::<(), lapin::Error>(())
        }
    });
    try_join_all(consumers).await?;
    Ok(())
}

/// One message: its job in the delivery's scope, then the ack that the outcome calls for.
async fn handle(message: &Message, gateway: &Gateway) -> lapin::Result<()> {
    let Ok(job) = serde_json::from_slice::<ChargeJob>(&message.data) else {
        eprintln!(
            "not a charge job, parked: {:?}",
            String::from_utf8_lossy(&message.data)
        );
        message
            .reject(BasicRejectOptions { requeue: false })
            .await?;
        return Ok(());
    };
    let delivery = jobguard::lapin::delivery(message, DELIVERY_LIMIT);
    println!(
        "charging {} (key {}, delivery {})",
        job.order_id, job.key, delivery.number
    );
    let charged = charge(gateway, &job.order_id, job.amount, &job.key);
    let (result, settled) = delivery.scope_settled(charged).await;
    match result {
        Ok(receipt) => {
            println!("  {} charged: {receipt:?}", job.order_id);
            message.ack(BasicAckOptions::default()).await?;
        }
        // Its one dead letter is written: RabbitMQ must not deliver it again.
        Err(_) if settled => {
            message.ack(BasicAckOptions::default()).await?;
        }
        Err(e) => {
            println!("  {} handed back to the queue: {e}", job.order_id);
            message.reject(BasicRejectOptions { requeue: true }).await?;
        }
    }
    Ok(())
}

/// What the queue carries: one charge.
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
