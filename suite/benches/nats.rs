//! Jobs per second through NATS JetStream with async-nats: a pull consumer that keeps 16
//! messages in flight, running 16 jobs at a time and acknowledging each after its job, with a
//! bare handler, the bare handler plus two plain Redis round trips (the floor of any
//! claim-then-complete design), and the bare handler under `#[idempotent]` + `#[retry]` with
//! `RedisStore` in the delivery's scope (`jobguard::nats::delivery`, `Delivery::scope_settled`),
//! as `examples/nats_worker.rs` runs a job. The machine's NATS, a private `redis-server`. A timed
//! harness, one run:
//!
//! ```text
//! cargo bench -p jobguard-suite --bench nats
//! ```
//!
//! Each trial publishes `JOBS` messages to a fresh work-queue stream (each stored before the
//! next), then times one consumer from its first pull until it has acknowledged every message
//! and the stream is empty. The contenders alternate, `TRIALS` times each, and the table gives
//! the median trial. `JOBGUARD_BENCH_JOBS=N` changes the jobs per trial.

#[path = "support/broker_job.rs"]
mod broker_job;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy};
use async_nats::jetstream::{self, AckKind, Context};
use broker_job::{CONCURRENCY, Handler, TRIALS};
use futures::StreamExt;
use jobguard_testkit::broker::{Broker, unique_name};
use jobguard_testkit::redis::RedisServer;
use std::time::{Duration, Instant};

/// The consumer's `max_deliver`.
const MAX_DELIVER: i64 = 5;

/// One trial: publishes `jobs` messages, then consumes them all; jobs per second.
async fn trial(js: &Context, trial: usize, handler: Handler, jobs: usize) -> f64 {
    let name = unique_name("bench");
    let subject = format!("jobguard.bench.{name}");
    let mut stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            retention: RetentionPolicy::WorkQueue,
            ..stream::Config::default()
        })
        .await
        .expect("create the stream");
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_deliver: MAX_DELIVER,
            max_ack_pending: CONCURRENCY as i64,
            ..pull::Config::default()
        })
        .await
        .expect("create the consumer");
    // Published a thousand at a time: async-nats holds back a publish while too many of its
    // acknowledgements are outstanding, and they are taken only when awaited.
    for ids in (0..jobs).collect::<Vec<_>>().chunks(1_000) {
        let mut acks = Vec::with_capacity(ids.len());
        for id in ids {
            acks.push(
                js.publish(subject.clone(), id.to_string().into())
                    .await
                    .expect("publish"),
            );
        }
        for ack in acks {
            ack.await.expect("stored");
        }
    }

    let started = Instant::now();
    let messages = consumer
        .stream()
        .max_messages_per_batch(CONCURRENCY)
        .messages()
        .await
        .expect("a pull stream");
    messages
        .take(jobs)
        .for_each_concurrent(CONCURRENCY, |message| async move {
            let message = message.expect("a message");
            let id: u64 = std::str::from_utf8(&message.payload)
                .ok()
                .and_then(|s| s.parse().ok())
                .expect("an id");
            let delivery = jobguard::nats::delivery(&message, MAX_DELIVER);
            let ack = if handler.run(trial, id, delivery).await {
                AckKind::Ack
            } else {
                AckKind::Nak(None)
            };
            message.ack_with(ack).await.expect("ack");
        })
        .await;
    // Acks are fire-and-forget: the trial ends when the work queue has let every message go.
    while stream.info().await.expect("stream info").state.messages > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    js.delete_stream(&name).await.expect("delete the stream");
    rate
}

fn main() {
    // `cargo test --benches` runs this with `--bench`-less arguments; only `cargo bench` measures.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(url) = Broker::Nats.url() else {
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
        let js = jetstream::new(async_nats::connect(&url).await.expect("connect to NATS"));
        let mut n = 0;
        // Warm-up: connections, scripts loaded, allocator.
        for handler in Handler::ALL {
            trial(&js, n, handler, jobs / 4).await;
            n += 1;
        }
        let mut rates: [Vec<f64>; 3] = Default::default();
        for _ in 0..TRIALS {
            for (i, handler) in Handler::ALL.into_iter().enumerate() {
                rates[i].push(trial(&js, n, handler, jobs).await);
                n += 1;
            }
        }
        broker_job::print("NATS JetStream (work queue) + async-nats", jobs, rates);
    });
}
