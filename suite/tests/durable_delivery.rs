//! `GuardLayer` on real apalis workers: the delivery that `jobguard::attempt()` gives inside the
//! handler is the broker's count.
//! On apalis-redis a failing task comes back with the next number, and the task's
//! `max_attempts` marks the last; on apalis's in-memory storage every delivery is the only one.

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::{Delivery, GuardLayer};
use jobguard_testkit::redis::RedisServer;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Seen = Arc<Mutex<Vec<Option<Delivery>>>>;

/// What a guarded call inside the handler reads of its delivery.
#[jobguard::retry(attempts = 1)]
async fn delivery_seen() -> Result<Option<Delivery>, std::io::Error> {
    Ok(jobguard::attempt().and_then(|a| a.delivery))
}

async fn failing(_job: u32, seen: Data<Seen>) -> Result<(), std::io::Error> {
    let delivery = delivery_seen().await?;
    seen.lock().unwrap().push(delivery);
    Err(std::io::ErrorKind::ConnectionReset.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_task_on_redis_is_delivered_again_with_the_next_number_up_to_its_last() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = apalis_redis::connect(server.url()).await.unwrap();
    let config = apalis_redis::Config::default().queue("delivery");
    let mut storage = RedisStorage::<u32>::new(conn).with_config(config);
    storage
        .push_task(TaskBuilder::new(7).max_attempts(3).build())
        .await
        .unwrap();
    let seen: Seen = Arc::default();
    let watched = seen.clone();
    let third = async move {
        // Polls what the handler recorded; the broker redelivers on its own clock.
        while watched.lock().unwrap().len() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok::<(), WorkerError>(())
    };
    let run = WorkerBuilder::new("delivery-worker")
        .backend(storage)
        .data(seen.clone())
        .layer(GuardLayer::new())
        .build(failing)
        .run_until(third);
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("three deliveries within 30 s")
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[..3],
        [
            Some(Delivery {
                number: 1,
                last: false
            }),
            Some(Delivery {
                number: 2,
                last: false
            }),
            Some(Delivery {
                number: 3,
                last: true
            }),
        ]
    );
}

#[tokio::test]
async fn a_task_in_memory_is_delivered_once() {
    let mut storage = MemoryStorage::new();
    storage.push(7u32).await.unwrap();
    let seen: Seen = Arc::default();
    let watched = seen.clone();
    let first = async move {
        while watched.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        Ok::<(), WorkerError>(())
    };
    WorkerBuilder::new("memory-worker")
        .backend(storage)
        .data(seen.clone())
        .layer(GuardLayer::new())
        .build(failing)
        .run_until(first)
        .await
        .unwrap();
    assert_eq!(
        seen.lock().unwrap()[..],
        [Some(Delivery {
            number: 1,
            last: true
        })]
    );
}
