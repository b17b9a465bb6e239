//! A repeat while the first request runs is `409` with `Retry-After`; 50 concurrent identical
//! requests run the handler once.

mod http_support;

use http_support::{Client, Handler, app, serve};
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;
use std::time::Duration;

#[tokio::test]
async fn repeat_while_the_first_runs_is_409_with_retry_after() {
    let (handler, gate) = Handler::gated();
    let addr = serve(app(
        handler.clone(),
        IdempotencyLayer::new(MemoryStore::new()),
    ))
    .await;
    let client = Client::new(addr);

    let first = tokio::spawn({
        let client = client.clone();
        async move { client.charge("idem-1").await }
    });
    handler.entered.notified().await;
    let repeat = client.charge("idem-1").await;
    let detail = repeat.problem(409);
    assert_eq!(repeat.headers["retry-after"], "1");
    assert!(detail.contains("still being processed"), "{detail}");

    gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let after = client.charge("idem-1").await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(handler.runs(), 1);
}

/// All 50 go in while the first run is held: one runs, the other 49 are `409` before it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_identical_requests_while_one_runs_are_409() {
    let (handler, gate) = Handler::gated();
    let addr = serve(app(
        handler.clone(),
        IdempotencyLayer::new(MemoryStore::new()),
    ))
    .await;
    let client = Client::new(addr);

    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let client = client.clone();
        requests.spawn(async move { client.charge("idem-50").await });
    }
    // The held run cannot answer until the gate opens, so the first 49 answers are the others.
    for _ in 0..49 {
        let reply = requests.join_next().await.unwrap().unwrap();
        reply.problem(409);
        assert_eq!(reply.headers["retry-after"], "1");
    }
    assert_eq!(handler.runs(), 1);
    gate.add_permits(1);
    let first = requests.join_next().await.unwrap().unwrap();
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert!(client.charge("idem-50").await.replayed());
    assert_eq!(handler.runs(), 1);
}

/// 50 at once against a handler that works for 200 ms: whatever the interleaving, one run; each
/// other request is `409`, or the replay when it came in after the run finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_requests_run_the_handler_once() {
    let handler = Handler {
        work: Duration::from_millis(200),
        ..Handler::default()
    };
    let addr = serve(app(
        handler.clone(),
        IdempotencyLayer::new(MemoryStore::new()),
    ))
    .await;
    let client = Client::new(addr);

    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let client = client.clone();
        requests.spawn(async move { client.charge("idem-50").await });
    }
    let (mut ran, mut conflicts, mut replays, mut body) = (0, 0, 0, None);
    while let Some(reply) = requests.join_next().await {
        let reply = reply.unwrap();
        match reply.status.as_u16() {
            201 if reply.replayed() => replays += 1,
            201 => {
                ran += 1;
                body = Some(reply.body.clone());
            }
            409 => {
                reply.problem(409);
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(handler.runs(), 1);
    assert_eq!(ran + conflicts + replays, 50);
    let after = client.charge("idem-50").await;
    assert!(after.replayed());
    assert_eq!(Some(after.body), body);
    println!("1 run, {conflicts} conflicts, {replays} replays");
}
