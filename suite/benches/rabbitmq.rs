//! Jobs per second through RabbitMQ with lapin: a consumer at prefetch 16, running 16 jobs at a
//! time and acknowledging each after its job, with a bare handler, the bare handler plus two
//! plain Redis round trips (the floor of any claim-then-complete design), and the bare handler
//! under `#[idempotent]` + `#[retry]` with `RedisStore` in the delivery's scope
//! (`jobguard::lapin::delivery`, `Delivery::scope_settled`), as `examples/rabbitmq_worker.rs`
//! runs a job. The machine's RabbitMQ, a private `redis-server`. A timed harness, one run:
//!
//! ```text
//! cargo bench -p jobguard-suite --bench rabbitmq
//! ```
//!
//! Each trial publishes `JOBS` messages to a fresh quorum queue, waits until the queue holds
//! them all, then times one consumer from its `basic.consume` until it has acknowledged every
//! message. The contenders alternate, `TRIALS` times each, and the table gives the median trial.
//! `JOBGUARD_BENCH_JOBS=N` changes the jobs per trial.

#[path = "support/broker_job.rs"]
mod broker_job;

use broker_job::{CONCURRENCY, Handler, TRIALS};
use futures::StreamExt;
use jobguard_testkit::broker::{Broker, unique_name};
use jobguard_testkit::redis::RedisServer;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::time::{Duration, Instant};

/// The queues' `x-delivery-limit`.
const LIMIT: u32 = 4;

async fn declare(channel: &Channel, queue: &str) {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-delivery-limit".into(), AMQPValue::LongInt(LIMIT as i32));
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .expect("declare the queue");
}

async fn ready(channel: &Channel, queue: &str) -> usize {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare")
        .message_count() as usize
}

/// One trial: publishes `jobs` messages, then consumes them all; jobs per second.
async fn trial(url: &str, trial: usize, handler: Handler, jobs: usize) -> f64 {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let channel = connection.create_channel().await.expect("a channel");
    let queue = unique_name("bench");
    declare(&channel, &queue).await;
    for id in 0..jobs {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                id.to_string().as_bytes(),
                BasicProperties::default(),
            )
            .await
            .expect("publish");
    }
    // Polls the queue until every message is in.
    while ready(&channel, &queue).await < jobs {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let consumer_channel = connection.create_channel().await.expect("a channel");
    consumer_channel
        .basic_qos(CONCURRENCY as u16, BasicQosOptions::default())
        .await
        .expect("qos");
    let started = Instant::now();
    let consumer = consumer_channel
        .basic_consume(
            queue.as_str().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    consumer
        .take(jobs)
        .for_each_concurrent(CONCURRENCY, |message| async move {
            let message = message.expect("a delivery");
            let id: u64 = std::str::from_utf8(&message.data)
                .ok()
                .and_then(|s| s.parse().ok())
                .expect("an id");
            let delivery = jobguard::lapin::delivery(&message, LIMIT);
            if handler.run(trial, id, delivery).await {
                message.ack(BasicAckOptions::default()).await.expect("ack");
            } else {
                message
                    .reject(BasicRejectOptions { requeue: true })
                    .await
                    .expect("reject");
            }
        })
        .await;
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the queue");
    let _ = connection.close(200, "done".into()).await;
    rate
}

fn main() {
    // `cargo test --benches` runs this with `--bench`-less arguments; only `cargo bench` measures.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(url) = Broker::RabbitMq.url() else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let jobs = broker_job::jobs(2_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        broker_job::install(&redis.url()).await;
        let mut n = 0;
        // Warm-up: connections, scripts loaded, allocator.
        for handler in Handler::ALL {
            trial(&url, n, handler, jobs / 4).await;
            n += 1;
        }
        let mut rates: [Vec<f64>; 3] = Default::default();
        for _ in 0..TRIALS {
            for (i, handler) in Handler::ALL.into_iter().enumerate() {
                rates[i].push(trial(&url, n, handler, jobs).await);
                n += 1;
            }
        }
        broker_job::print("RabbitMQ (quorum queue) + lapin", jobs, rates);
    });
}
