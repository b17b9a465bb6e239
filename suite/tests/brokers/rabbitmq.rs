//! The RabbitMQ side: a quorum queue of the test's own (with its parked queue), the jobs
//! published to it, and the worker's consumer loop, as `examples/rabbitmq_worker.rs` runs it.

use super::crash::TestQueue;
use super::{Job, Kind, Outcome, Setup};
use futures::StreamExt;
use jobguard_testkit::broker::Broker;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// A queue a test leaves behind by failing goes away after 10 minutes unused (`x-expires`).
const EXPIRES_MS: i32 = 600_000;

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ")
}

/// The quorum queue `setup.name` with `x-delivery-limit` `setup.limit`, whose dropped messages
/// go to `{name}.parked`; both declared, and deleted when dropped.
pub struct Queue {
    connection: Connection,
    channel: Channel,
    name: String,
}

impl TestQueue for Queue {
    const BROKER: Broker = Broker::RabbitMq;
    const KIND: Kind = Kind::RabbitMq;

    /// `x-delivery-limit` counts the deliveries after the first.
    fn limit(deliveries: u32) -> u32 {
        deliveries - 1
    }

    /// Declares the queues.
    async fn create(setup: &Setup) -> Queue {
        let connection = connect(&setup.url).await;
        let channel = connection.create_channel().await.expect("a channel");
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let parked = format!("{}.parked", setup.name);
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args.insert("x-expires".into(), AMQPValue::LongInt(EXPIRES_MS));
        channel
            .queue_declare(parked.as_str().into(), durable, args.clone())
            .await
            .expect("declare the parked queue");
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(setup.limit as i32),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(parked.as_str().into()),
        );
        channel
            .queue_declare(setup.name.as_str().into(), durable, args)
            .await
            .expect("declare the queue");
        Queue {
            connection,
            channel,
            name: setup.name.clone(),
        }
    }

    /// Publishes each job, persistent and confirmed.
    async fn publish(&self, jobs: &[Job]) {
        for job in jobs {
            self.channel
                .basic_publish(
                    "".into(),
                    self.name.as_str().into(),
                    BasicPublishOptions::default(),
                    &serde_json::to_vec(job).unwrap(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .expect("publish")
                .await
                .expect("publish confirmed");
        }
    }

    /// Ready messages in the queue and in its parked queue.
    async fn left(&self) -> (u64, u64) {
        let parked = format!("{}.parked", self.name);
        (self.count(&self.name).await, self.count(&parked).await)
    }

    /// Deletes both queues.
    async fn delete(self) {
        for queue in [self.name.clone(), format!("{}.parked", self.name)] {
            self.channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap_or_else(|e| panic!("delete {queue}: {e}"));
        }
        let _ = self.connection.close(200, "done".into()).await;
    }
}

impl Queue {
    async fn count(&self, queue: &str) -> u64 {
        self.channel
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
            .message_count()
            .into()
    }
}

/// The worker: consumes the queue with a prefetch of 1 until it is killed.
pub async fn run_worker(setup: &Setup) {
    let connection = connect(&setup.url).await;
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    let tag = format!("worker-{}", std::process::id());
    let mut messages = channel
        .basic_consume(
            setup.name.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    while let Some(message) = messages.next().await {
        let message = message.expect("a delivery");
        let job: Job = serde_json::from_slice(&message.data).expect("a job");
        let delivery = jobguard::lapin::delivery(&message, setup.limit);
        let outcome = super::handle(job, delivery).await;
        match outcome {
            Outcome::Done | Outcome::Settled => {
                message.ack(BasicAckOptions::default()).await.expect("ack")
            }
            Outcome::HandBack => message
                .reject(BasicRejectOptions { requeue: true })
                .await
                .expect("reject"),
        };
        super::sent(job, outcome).await;
    }
    panic!("the consumer was cancelled");
}
