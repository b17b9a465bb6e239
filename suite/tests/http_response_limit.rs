//! A response larger than the storage limit is passed through whole, not stored, with a
//! `StoreFailed` event; the claim is released.

mod http_support;

use http_support::{Client, Handler, app, serve};
use jobguard::http::IdempotencyLayer;
use jobguard::{Event, MemoryStore, Runtime, StoreKey};
use std::sync::{Arc, Mutex};

#[tokio::test]
async fn a_response_over_the_storage_limit_passes_through_unstored() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    Runtime::builder()
        .observer(move |event: &Event<'_>| {
            if let Event::StoreFailed { scope, key } = event {
                seen.lock().unwrap().push(format!("{scope}:{key}"));
            }
        })
        .build()
        .install()
        .expect("the only runtime installed in this test binary");

    let store = MemoryStore::new();
    let handler = Handler {
        body_len: Some(300_000),
        ..Handler::default()
    };
    let layer = IdempotencyLayer::new(store.clone()).max_response(64 * 1024);
    let addr = serve(app(handler.clone(), layer)).await;
    let client = Client::new(addr);

    let reply = client.charge("big").await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body.len(), 300_000, "never truncated");
    assert!(reply.body.iter().all(|b| *b == b'x'));
    assert_eq!(
        store.completed(StoreKey {
            scope: "http-anonymous",
            key: "big"
        }),
        None,
        "not stored"
    );
    assert_eq!(*events.lock().unwrap(), ["http-anonymous:big"]);

    let again = client.charge("big").await;
    assert!(!again.replayed());
    assert_eq!(again.body.len(), 300_000);
    assert_eq!(handler.runs(), 2);
}
