//! The NATS worker example against the machine's NATS JetStream and a private `redis-server`
//! (the store and the dead letters): the scenario's jobs go through a work-queue stream of the
//! test's own. order-A is charged once, on its third attempt, and its second delivery replays the
//! stored receipt; order-B times out on every attempt, is handed back (`-NAK`) on each of its
//! first four deliveries, and is dead-lettered once, on its fifth and last (`max_deliver` 5),
//! with all 15 attempts counted, and terminated: the stream is empty at the end.

#[allow(dead_code)]
#[path = "../../examples/nats_worker.rs"]
mod worker;

use jobguard::{Event, GiveUp, RedisDeadLetters, RedisStore, Runtime};
use jobguard_testkit::broker::{Broker, unique_name};
use jobguard_testkit::redis::RedisServer;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::{ChargeJob, Gateway};

fn job(order_id: &str, key: &str) -> ChargeJob {
    ChargeJob {
        order_id: order_id.to_owned(),
        key: key.to_owned(),
        amount: 100,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_on_a_work_queue_stream() {
    let Some(url) = Broker::Nats.url() else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let stream = unique_name("charge");
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    let consumer = worker::create(&js, &stream).await.unwrap();

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
    let consuming = {
        let gateway = gateway.clone();
        tokio::spawn(async move { runtime.scope(worker::run(&consumer, gateway, 1)).await })
    };

    for job in [
        job("order-A", "idem-1"),
        job("order-A", "idem-1"),
        job("order-B", "idem-2"),
    ] {
        worker::publish(&js, &stream, &job).await.unwrap();
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
    // One more replay of order-A: a worker pulls it only after it answered order-B's last
    // delivery, on the same connection, so the server has that answer first.
    worker::publish(&js, &stream, &job("order-A", "idem-1"))
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
        3 * worker::MAX_DELIVER as u32,
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
    // order-B was terminated with its letter: the work queue holds nothing any more.
    consuming.abort();
    let mut info = js.get_stream(&stream).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while info.info().await.unwrap().state.messages != 0 {
        assert!(
            Instant::now() < deadline,
            "the stream still holds a message"
        );
        // The server drops a terminated message from a work queue as it processes the +TERM.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    js.delete_stream(&stream).await.unwrap();
}
