//! The first request with a key runs and its response is stored; a repeat gets that response
//! byte for byte with `Idempotent-Replayed: true`, and the handler does not run again.

mod http_support;

use http_support::{Client, Handler, app, serve};
use jobguard::http::IdempotencyLayer;
use jobguard::{MemoryStore, StoreKey};

#[tokio::test]
async fn first_request_runs_and_its_response_is_stored() {
    let store = MemoryStore::new();
    let handler = Handler::default();
    let addr = serve(app(handler.clone(), IdempotencyLayer::new(store.clone()))).await;
    let client = Client::new(addr);

    let first = client
        .send(
            "POST",
            "/charge/order-A",
            Some("idem-1"),
            "{\"amount\":100}",
        )
        .await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(first.json()["run"], 1);
    assert_eq!(
        first.json()["body_bytes"],
        14,
        "the handler saw the whole body"
    );
    assert_eq!(handler.runs(), 1);
    let key = StoreKey {
        scope: "http-anonymous",
        key: "idem-1",
    };
    assert!(
        store.completed(key).is_some(),
        "the response is stored under the key"
    );
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn repeat_replays_the_stored_response_byte_for_byte() {
    let handler = Handler::default();
    let addr = serve(app(
        handler.clone(),
        IdempotencyLayer::new(MemoryStore::new()),
    ))
    .await;
    let client = Client::new(addr);

    let first = client
        .send(
            "POST",
            "/charge/order-A",
            Some("idem-1"),
            "{\"amount\":100}",
        )
        .await;
    let again = client
        .send(
            "POST",
            "/charge/order-A",
            Some("idem-1"),
            "{\"amount\":100}",
        )
        .await;
    assert_eq!(handler.runs(), 1, "the repeat did not run the handler");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.status, first.status);
    assert_eq!(again.body, first.body, "byte for byte");
    for header in ["content-type", "location", "content-length"] {
        assert_eq!(
            again.headers.get(header),
            first.headers.get(header),
            "{header}"
        );
    }
    assert_eq!(first.headers["x-run"], "1");
    assert!(
        again.headers.get("x-run").is_none(),
        "only content headers are stored"
    );

    let third = client
        .send(
            "POST",
            "/charge/order-A",
            Some("idem-1"),
            "{\"amount\":100}",
        )
        .await;
    assert!(third.replayed());
    assert_eq!(third.body, first.body);
    assert_eq!(handler.runs(), 1);
}
