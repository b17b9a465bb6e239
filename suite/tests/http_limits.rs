//! A body larger than `.max_body` is `413` before the handler runs; the store unreachable is
//! `503` and the handler does not run, raising `ClaimFailed` once.

mod http_support;

use http_support::{Client, Handler, app, charge_request, ready, serve};
use jobguard::http::IdempotencyLayer;
use jobguard::store::{ClaimOptions, Claimed, KeyInfo, StepKey, StepRecord, StoreFuture};

use jobguard::{Error, Event, MemoryStore, Runtime, Store, StoreKey};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::Service;

#[tokio::test]
async fn a_body_larger_than_max_body_is_413_before_the_handler_runs() {
    let store = MemoryStore::new();
    let handler = Handler::default();
    let addr = serve(app(
        handler.clone(),
        IdempotencyLayer::new(store.clone()).max_body(16),
    ))
    .await;
    let client = Client::new(addr);

    let reply = client
        .send("POST", "/charge/order-A", Some("k"), &"x".repeat(17))
        .await;
    let detail = reply.problem(413);
    assert!(detail.contains("at most 16 bytes"), "{detail}");
    assert_eq!(handler.runs(), 0);
    assert!(store.is_empty());

    // At the limit it runs; without a key the limit does not apply.
    assert_eq!(
        client
            .send("POST", "/charge/order-A", Some("k"), &"x".repeat(16))
            .await
            .status,
        201
    );
    assert_eq!(
        client
            .send("POST", "/charge/order-A", None, &"x".repeat(1000))
            .await
            .status,
        201
    );
    assert_eq!(handler.runs(), 2);
}

/// A store that cannot be reached.
struct Down;

impl Store for Down {
    fn claim<'a>(
        &'a self,
        _: StoreKey<'a>,
        _: &'a str,
        _: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        Box::pin(async { Err(Error::Store("redis 127.0.0.1:1: connection refused".into())) })
    }
    fn complete<'a>(
        &'a self,
        _: StoreKey<'a>,
        _: &'a str,
        _: &'a [u8],
        _: Duration,
    ) -> StoreFuture<'a, ()> {
        refused()
    }
    fn release<'a>(&'a self, _: StoreKey<'a>, _: &'a str) -> StoreFuture<'a, ()> {
        refused()
    }
    fn renew<'a>(&'a self, _: StoreKey<'a>, _: &'a str, _: Duration) -> StoreFuture<'a, ()> {
        refused()
    }
    fn lookup<'a>(&'a self, _: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        refused()
    }
    fn forgive<'a>(&'a self, _: StoreKey<'a>) -> StoreFuture<'a, bool> {
        refused()
    }
    fn lettered<'a>(&'a self, _: StoreKey<'a>) -> StoreFuture<'a, ()> {
        refused()
    }
    fn inspect<'a>(&'a self, _: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
        refused()
    }
    fn forget<'a>(&'a self, _: StoreKey<'a>) -> StoreFuture<'a, bool> {
        refused()
    }
    fn attempted<'a>(&'a self, _: StoreKey<'a>, _: &'a str) -> StoreFuture<'a, u32> {
        refused()
    }
    fn record_step<'a>(
        &'a self,
        _: StoreKey<'a>,
        _: &'a str,
        _: StepKey<'a>,
        _: &'a [u8],
    ) -> StoreFuture<'a, ()> {
        refused()
    }
    fn steps<'a>(&'a self, _: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
        refused()
    }
}

fn refused<'a, T: Send + 'a>() -> StoreFuture<'a, T> {
    Box::pin(async { Err(Error::Store("connection refused".into())) })
}

#[tokio::test]
async fn the_store_unreachable_is_503_and_the_handler_does_not_run() {
    let handler = Handler::default();
    let addr = serve(app(handler.clone(), IdempotencyLayer::new(Down))).await;
    let client = Client::new(addr);

    let reply = client.charge("k").await;
    let detail = reply.problem(503);
    assert!(detail.contains("connection refused"), "{detail}");
    assert!(detail.contains("not processed"), "{detail}");
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(handler.runs(), 0);
    // Requests without a key, and unguarded methods, do not need the store.
    assert_eq!(
        client
            .send("GET", "/charge/order-A", Some("k"), "")
            .await
            .status,
        201
    );
}

#[tokio::test]
async fn a_claim_the_store_refuses_raises_claim_failed_once() {
    let failed = Arc::new(AtomicUsize::new(0));
    let seen = failed.clone();
    let runtime = Runtime::builder()
        .observer(move |e: &Event<'_>| {
            if let Event::ClaimFailed { scope, key, error } = e {
                assert_eq!((*scope, *key), ("http-anonymous", "k"));
                assert!(matches!(error, Error::Store(_)), "{error:?}");
                seen.fetch_add(1, Ordering::SeqCst);
            }
        })
        .build();
    let handler = Handler::default();
    let mut service = app(handler.clone(), IdempotencyLayer::new(Down));
    ready(&mut service).await;
    let response = runtime
        .scope(service.call(charge_request("k")))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(handler.runs(), 0);
    assert_eq!(failed.load(Ordering::SeqCst), 1);
}
