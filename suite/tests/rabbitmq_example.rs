//! The RabbitMQ worker example against the machine's RabbitMQ and a private `redis-server` (the
//! store and the dead letters): the scenario's jobs go through a quorum queue of the test's own.
//! order-A is charged once, on its third attempt, and its second delivery replays the stored
//! receipt; order-B times out on every attempt, is handed back to the queue on each of its first
//! four deliveries, and is dead-lettered once, on its fifth and last (`x-delivery-limit` 4),
//! with all 15 attempts counted; nothing reaches the parked queue.

#[allow(dead_code)]
#[path = "../../examples/rabbitmq_worker.rs"]
mod worker;

use jobguard::{Event, GiveUp, RedisDeadLetters, RedisStore, Runtime};
use jobguard_testkit::broker::{Broker, unique_name};
use jobguard_testkit::redis::RedisServer;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::{ChargeJob, Gateway};

/// Ready messages in `queue`.
async fn ready(channel: &Channel, queue: &str) -> u32 {
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
        .message_count()
}

fn job(order_id: &str, key: &str) -> ChargeJob {
    ChargeJob {
        order_id: order_id.to_owned(),
        key: key.to_owned(),
        amount: 100,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_on_a_quorum_queue() {
    let Some(amqp) = Broker::RabbitMq.url() else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let queue = unique_name("charge");
    let parked = format!("{queue}.parked");
    let connection = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    worker::declare(&channel, &queue).await.unwrap();

    let replays = Arc::new(Mutex::new(0_u32));
    let counted = replays.clone();
    let letters = RedisDeadLetters::connect(&redis.url(), "test:dead")
        .await
        .unwrap();
    let runtime = Runtime::builder()
        .store(RedisStore::connect(&redis.url()).await.unwrap())
        .dead_letters(letters.clone())
        .observer(move |event: &Event<'_>| {
            if let Event::Replayed { .. } = event {
                *counted.lock().unwrap() += 1;
            }
        })
        .build();
    let gateway = Arc::new(Gateway::default());
    let worker_connection = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .unwrap();
    let consuming = {
        let (gateway, queue) = (gateway.clone(), queue.clone());
        tokio::spawn(async move {
            runtime
                .scope(worker::run(&worker_connection, &queue, gateway, 1))
                .await
        })
    };

    for job in [
        job("order-A", "idem-1"),
        job("order-A", "idem-1"),
        job("order-B", "idem-2"),
    ] {
        worker::publish(&channel, &queue, &job).await.unwrap();
    }
    // Polls the dead letters in Redis and the gateway's tries.
    let deadline = Instant::now() + Duration::from_secs(60);
    while letters.list().await.unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no letter after 60 s; order-B tried {} times",
            gateway.tries("order-B")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One more replay of order-A: with a prefetch of 1, RabbitMQ delivers it only once order-B's
    // last delivery is settled.
    worker::publish(&channel, &queue, &job("order-A", "idem-1"))
        .await
        .unwrap();
    while *replays.lock().unwrap() < 2 {
        assert!(Instant::now() < deadline, "the last replay did not come");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    assert_eq!(gateway.charges(), ["order-A"]);
    assert_eq!(gateway.tries("order-A"), 3);
    assert_eq!(
        gateway.tries("order-B"),
        3 * (worker::DELIVERY_LIMIT + 1),
        "three attempts on each of the five deliveries"
    );
    let letters: Vec<_> = letters
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|(_, letter)| letter.unwrap())
        .collect();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
    assert_eq!(letters[0].key.as_deref(), Some("idem-2"));
    assert_eq!(letters[0].attempts, 15);
    assert_eq!(letters[0].error, "gateway timeout on order-B (attempt 15)");
    // order-B was acknowledged with its letter, not dropped to the parked queue.
    assert_eq!(
        (
            ready(&channel, &queue).await,
            ready(&channel, &parked).await
        ),
        (0, 0)
    );

    consuming.abort();
    for queue in [&queue, &parked] {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
}
