//! `jobguard::console::requeue`: a redrive from the console pushes the letter's payload back
//! onto an apalis queue (apalis-redis on a private `redis-server`), where a worker takes it; a
//! letter without a payload fails its redrive and is kept, with the reason shown.

mod console_support;

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use console_support::{Client, send, serve};
use jobguard::console::{Console, requeue};
use jobguard::{DeadLetter, DeadLetterSink, GiveUp, MemoryDeadLetters};
use jobguard_testkit::redis::RedisServer;
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    order_id: String,
    amount: u64,
}

async fn take(
    job: Charge,
    taken: Data<mpsc::UnboundedSender<Charge>>,
) -> Result<(), std::io::Error> {
    let _ = taken.send(job);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_pushes_the_task_back_onto_its_apalis_queue() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = apalis_redis::connect(server.url()).await.unwrap();
    let config = apalis_redis::Config::default().queue("tests.console.requeue");
    let storage = RedisStorage::<Charge>::new(conn).with_config(config);

    let letters = MemoryDeadLetters::new();
    let now = SystemTime::now();
    let charge = Charge {
        order_id: "order-B".into(),
        amount: 100,
    };
    let letter = |payload| {
        DeadLetter::new(
            "payments.charge",
            Some("k-1".into()),
            GiveUp::Exhausted,
            5,
            "timeout",
            now,
            now,
        )
        .with_payload(payload)
    };
    letters
        .send(letter(Some(serde_json::to_value(&charge).unwrap())))
        .await
        .unwrap();
    letters.send(letter(None)).await.unwrap();
    let console = Console::new()
        .dead_letters(letters.clone())
        .redrive("payments.charge", requeue::<Charge, _, _>(storage.clone()));
    let client = Client::new(serve(axum::Router::new().nest("/jobguard", console.router())).await);

    let reply = send(&client, "POST", "/jobguard/api/dead-letters/1/redrive", "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(letters.len(), 1, "the redriven letter is gone");
    let failed = send(&client, "POST", "/jobguard/api/dead-letters/2/redrive", "").await;
    failed.problem(502);
    assert!(
        failed.json()["error"]
            .as_str()
            .unwrap()
            .contains("no payload"),
        "{:?}",
        failed.json()
    );
    assert_eq!(letters.len(), 1, "the letter without a payload is kept");

    // A worker on the queue takes the pushed task.
    let (tx, mut taken) = mpsc::unbounded_channel::<Charge>();
    let worker = WorkerBuilder::new("tests-console-requeue")
        .backend(storage)
        .data(tx)
        .build(take);
    tokio::spawn(worker.run());
    let got = tokio::time::timeout(Duration::from_secs(30), taken.recv())
        .await
        .expect("the worker takes the task within 30 s")
        .unwrap();
    assert_eq!(got, charge);
}
