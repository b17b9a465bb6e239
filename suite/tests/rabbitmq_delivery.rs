//! `jobguard::lapin::delivery` against the machine's RabbitMQ: what a quorum queue really sends.
//! The first delivery carries no count; each `basic.reject` with requeue, and each consumer
//! whose connection closed without an ack, adds one; the delivery whose count reached the
//! queue's `x-delivery-limit` is the last, and after it the queue gives the message to its
//! dead-letter exchange (here a queue of the test's own) instead of delivering it again. A
//! classic queue's redelivery carries no count, and reads as the last; a count a publisher wrote
//! that is not a number does not panic.
//!
//! Each test declares queues named for itself and deletes them at its end. Without a server it
//! skips, unless `JOBGUARD_REQUIRE_RABBITMQ=1`.

use futures::StreamExt;
use jobguard::Delivery;
use jobguard_testkit::broker::{Broker, unique_name};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use std::time::{Duration, Instant};

/// The quorum queue's `x-delivery-limit`.
const LIMIT: u32 = 2;

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ")
}

/// Declares a quorum queue `name` with `x-delivery-limit` [`LIMIT`], whose dropped messages go
/// to the queue `dead` (declared too).
async fn quorum_queue(channel: &Channel, name: &str, dead: &str) {
    declare(channel, dead, FieldTable::default()).await;
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-delivery-limit".into(), AMQPValue::LongInt(LIMIT as i32));
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.into()),
    );
    declare(channel, name, args).await;
}

async fn declare(channel: &Channel, name: &str, args: FieldTable) {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .unwrap_or_else(|e| panic!("declare {name}: {e}"));
}

async fn publish(channel: &Channel, queue: &str, properties: BasicProperties) {
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"job",
            properties,
        )
        .await
        .expect("publish")
        .await
        .expect("publish confirmed");
}

async fn consume(channel: &Channel, queue: &str) -> Consumer {
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    channel
        .basic_consume(
            queue.into(),
            unique_name("consumer").as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume")
}

/// The next message, within 10 s.
async fn next(consumer: &mut Consumer) -> lapin::message::Delivery {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the consumer is open")
        .expect("a delivery")
}

/// How many messages are ready in `queue`, polled until it is `expected` or 10 s passed.
async fn ready_becomes(channel: &Channel, queue: &str, expected: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let count = channel
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
            .message_count();
        if count == expected || Instant::now() > deadline {
            return count;
        }
        // The broker settles a quorum queue's returns through its log; poll it.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn delete(channel: &Channel, queues: &[&str]) {
    for queue in queues {
        channel
            .queue_delete((*queue).into(), QueueDeleteOptions::default())
            .await
            .unwrap_or_else(|e| panic!("delete {queue}: {e}"));
    }
}

#[tokio::test]
async fn each_reject_counts_and_the_delivery_at_the_limit_is_the_last() {
    let Some(url) = Broker::RabbitMq.url() else {
        return;
    };
    let (queue, dead) = (unique_name("delivery"), unique_name("delivery-dead"));
    let connection = connect(&url).await;
    let channel = connection.create_channel().await.unwrap();
    quorum_queue(&channel, &queue, &dead).await;
    publish(&channel, &queue, BasicProperties::default()).await;

    let mut consumer = consume(&channel, &queue).await;
    let mut seen = Vec::new();
    for _ in 0..=LIMIT {
        let message = next(&mut consumer).await;
        seen.push(jobguard::lapin::delivery(&message, LIMIT));
        message
            .reject(BasicRejectOptions { requeue: true })
            .await
            .unwrap();
    }
    assert_eq!(
        seen,
        [
            Delivery {
                number: 1,
                last: false
            },
            Delivery {
                number: 2,
                last: false
            },
            Delivery {
                number: 3,
                last: true
            },
        ]
    );
    // Rejected on its last delivery, the message went to the dead-letter queue, not back.
    assert_eq!(ready_becomes(&channel, &dead, 1).await, 1);
    assert_eq!(ready_becomes(&channel, &queue, 0).await, 0);
    delete(&channel, &[&queue, &dead]).await;
}

#[tokio::test]
async fn a_consumer_that_dies_without_an_ack_spends_a_delivery() {
    let Some(url) = Broker::RabbitMq.url() else {
        return;
    };
    let (queue, dead) = (unique_name("died"), unique_name("died-dead"));
    let admin = connect(&url).await;
    let channel = admin.create_channel().await.unwrap();
    quorum_queue(&channel, &queue, &dead).await;
    publish(&channel, &queue, BasicProperties::default()).await;

    // A worker takes the message and its connection drops, as a killed process's does.
    let worker = connect(&url).await;
    let mut consumer = consume(&worker.create_channel().await.unwrap(), &queue).await;
    let first = next(&mut consumer).await;
    assert_eq!(
        jobguard::lapin::delivery(&first, LIMIT),
        Delivery {
            number: 1,
            last: false
        }
    );
    worker.close(200, "bye".into()).await.unwrap();

    let mut consumer = consume(&channel, &queue).await;
    let again = next(&mut consumer).await;
    assert!(again.redelivered);
    assert_eq!(
        jobguard::lapin::delivery(&again, LIMIT),
        Delivery {
            number: 2,
            last: false
        }
    );
    delete(&channel, &[&queue, &dead]).await;
}

#[tokio::test]
async fn a_classic_queues_redelivery_has_no_count_and_is_the_last() {
    let Some(url) = Broker::RabbitMq.url() else {
        return;
    };
    let queue = unique_name("classic");
    let connection = connect(&url).await;
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, &queue, FieldTable::default()).await;
    publish(&channel, &queue, BasicProperties::default()).await;

    let mut consumer = consume(&channel, &queue).await;
    let first = next(&mut consumer).await;
    assert_eq!(
        jobguard::lapin::delivery(&first, 5),
        Delivery {
            number: 1,
            last: false
        }
    );
    first
        .reject(BasicRejectOptions { requeue: true })
        .await
        .unwrap();
    let again = next(&mut consumer).await;
    assert!(again.redelivered);
    assert_eq!(
        jobguard::lapin::delivery(&again, 5),
        Delivery {
            number: 2,
            last: true
        }
    );
    delete(&channel, &[&queue]).await;
}

#[tokio::test]
async fn a_count_a_publisher_wrote_that_is_not_a_number_reads_as_the_last() {
    let Some(url) = Broker::RabbitMq.url() else {
        return;
    };
    let queue = unique_name("forged");
    let connection = connect(&url).await;
    let channel = connection.create_channel().await.unwrap();
    // A classic queue passes a publisher's headers through as they are.
    declare(&channel, &queue, FieldTable::default()).await;
    let mut headers = FieldTable::default();
    headers.insert(
        "x-delivery-count".into(),
        AMQPValue::LongString(LongString::from("three")),
    );
    publish(
        &channel,
        &queue,
        BasicProperties::default().with_headers(headers),
    )
    .await;

    let mut consumer = consume(&channel, &queue).await;
    let message = next(&mut consumer).await;
    assert_eq!(
        jobguard::lapin::delivery(&message, 5),
        Delivery {
            number: 1,
            last: true
        }
    );
    delete(&channel, &[&queue]).await;
}
