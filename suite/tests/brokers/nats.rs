//! The NATS JetStream side: a work-queue stream of the test's own with one durable pull
//! consumer, the jobs published to it, and the worker's consumer loop, as
//! `examples/nats_worker.rs` runs it.

use super::crash::TestQueue;
use super::{Job, Kind, Outcome, Setup};
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy};
use async_nats::jetstream::{self, AckKind, Context};
use futures::StreamExt;
use jobguard_testkit::broker::Broker;
use std::future::Future;
use std::time::Duration;

/// The consumer's `ack_wait`: a message a dead worker held is delivered again this long after its
/// last sign of life.
pub const ACK_WAIT: Duration = Duration::from_secs(2);

async fn connect(url: &str) -> Context {
    jetstream::new(async_nats::connect(url).await.expect("connect to NATS"))
}

fn subject(name: &str) -> String {
    format!("jobguard.test.{name}")
}

/// The stream `setup.name` (work-queue retention) and its durable pull consumer of the same name
/// with `max_deliver` `setup.limit`. Deleted by [`delete`](TestQueue::delete), or when dropped
/// (a test that failed).
pub struct Stream {
    js: Context,
    url: String,
    name: String,
    deleted: bool,
}

impl TestQueue for Stream {
    const BROKER: Broker = Broker::Nats;
    const KIND: Kind = Kind::Nats;

    /// `max_deliver` counts every delivery.
    fn limit(deliveries: u32) -> u32 {
        deliveries
    }

    /// Creates the stream and its consumer.
    async fn create(setup: &Setup) -> Stream {
        let js = connect(&setup.url).await;
        let stream = js
            .create_stream(stream::Config {
                name: setup.name.clone(),
                subjects: vec![subject(&setup.name)],
                retention: RetentionPolicy::WorkQueue,
                ..stream::Config::default()
            })
            .await
            .expect("create the stream");
        stream
            .create_consumer(pull::Config {
                durable_name: Some(setup.name.clone()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_deliver: i64::from(setup.limit),
                ..pull::Config::default()
            })
            .await
            .expect("create the consumer");
        Stream {
            js,
            url: setup.url.clone(),
            name: setup.name.clone(),
            deleted: false,
        }
    }

    /// Publishes each job and waits for the stream to store it.
    async fn publish(&self, jobs: &[Job]) {
        for job in jobs {
            self.js
                .publish(subject(&self.name), serde_json::to_vec(job).unwrap().into())
                .await
                .expect("publish")
                .await
                .expect("stored");
        }
    }

    /// Messages in the stream (a work queue drops a message once it is acknowledged or
    /// terminated), and those its consumer has yet to deliver.
    async fn left(&self) -> (u64, u64) {
        let mut stream = self.js.get_stream(&self.name).await.expect("the stream");
        let messages = stream.info().await.expect("stream info").state.messages;
        let mut consumer: PullConsumer =
            stream.get_consumer(&self.name).await.expect("the consumer");
        let pending = consumer.info().await.expect("consumer info").num_pending;
        (messages, pending)
    }

    /// Deletes the stream, and its consumer with it.
    async fn delete(mut self) {
        self.js
            .delete_stream(&self.name)
            .await
            .unwrap_or_else(|e| panic!("delete the stream {}: {e}", self.name));
        self.deleted = true;
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        // Dropped by a failing test, maybe inside its runtime: delete on a thread of its own.
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let _ = connect(&url).await.delete_stream(&name).await;
            });
        })
        .join();
    }
}

/// The worker: takes one message at a time until it is killed.
pub async fn run_worker(setup: &Setup) {
    let js = connect(&setup.url).await;
    let consumer: PullConsumer = js
        .get_stream(&setup.name)
        .await
        .expect("the stream")
        .get_consumer(&setup.name)
        .await
        .expect("the consumer");
    loop {
        let mut batch = consumer
            .batch()
            .max_messages(1)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .expect("a pull request");
        while let Some(message) = batch.next().await {
            let message = message.expect("a message");
            let job: Job = serde_json::from_slice(&message.payload).expect("a job");
            let delivery = jobguard::nats::delivery(&message, i64::from(setup.limit));
            let outcome = in_progress(&message, super::handle(job, delivery)).await;
            let ack = match outcome {
                Outcome::Done => AckKind::Ack,
                Outcome::Settled => AckKind::Term,
                Outcome::HandBack => AckKind::Nak(None),
            };
            message.ack_with(ack).await.expect("ack");
            super::sent(job, outcome).await;
        }
    }
}

/// Runs `job`, telling the server every third of `ack_wait` that the message is in progress,
/// so that it is not delivered again while this worker lives.
async fn in_progress<F: Future>(message: &jetstream::Message, job: F) -> F::Output {
    let mut job = std::pin::pin!(job);
    let mut tick = tokio::time::interval(ACK_WAIT / 3);
    tick.tick().await;
    loop {
        tokio::select! {
            output = &mut job => return output,
            _ = tick.tick() => {
                let _ = message.ack_with(AckKind::Progress).await;
            }
        }
    }
}
