//! No key on a guarded method is `400` with `.required(true)`, and passes through without it;
//! methods outside `.methods(..)` pass through untouched.

mod http_support;

use http::Method;
use http_support::{Client, Handler, app, serve};
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;

#[tokio::test]
async fn no_key_where_one_is_required_is_400() {
    let store = MemoryStore::new();
    let handler = Handler::default();
    let layer = IdempotencyLayer::new(store.clone()).required(true);
    let addr = serve(app(handler.clone(), layer)).await;
    let client = Client::new(addr);

    for method in ["POST", "PATCH"] {
        let reply = client.send(method, "/charge/order-A", None, "{}").await;
        let detail = reply.problem(400);
        assert!(
            detail.contains("requires an Idempotency-Key header"),
            "{detail}"
        );
    }
    assert_eq!(handler.runs(), 0);
    assert!(store.is_empty());
    // A method the layer does not guard needs no key.
    assert_eq!(
        client.send("GET", "/charge/order-A", None, "").await.status,
        201
    );
}

#[tokio::test]
async fn no_key_where_one_is_optional_passes_through() {
    let store = MemoryStore::new();
    let handler = Handler::default();
    let addr = serve(app(handler.clone(), IdempotencyLayer::new(store.clone()))).await;
    let client = Client::new(addr);

    for run in 1..=2 {
        let reply = client.send("POST", "/charge/order-A", None, "{}").await;
        assert_eq!(reply.status, 201);
        assert_eq!(reply.json()["run"], run);
    }
    assert!(store.is_empty());
}

#[tokio::test]
async fn methods_outside_the_list_pass_through_untouched() {
    let store = MemoryStore::new();
    let handler = Handler::default();
    let layer = IdempotencyLayer::new(store.clone()).methods([Method::PUT]);
    let addr = serve(app(handler.clone(), layer)).await;
    let client = Client::new(addr);

    // POST is not in the list now: every request runs, even with a key, even a malformed one.
    for key in ["k", "k", ""] {
        let reply = client
            .send("POST", "/charge/order-A", Some(key), "{}")
            .await;
        assert_eq!(reply.status, 201);
        assert!(!reply.replayed());
        assert_eq!(reply.headers["x-run"], handler.runs().to_string());
    }
    assert_eq!(handler.runs(), 3);
    assert!(store.is_empty(), "nothing was claimed for POST");

    // PUT is guarded.
    let first = client.send("PUT", "/charge/order-A", Some("k"), "{}").await;
    let again = client.send("PUT", "/charge/order-A", Some("k"), "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(handler.runs(), 4);
}
