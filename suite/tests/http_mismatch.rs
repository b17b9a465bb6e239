//! The same key with another request (method, path and query, or body) is `422`, and the first
//! request's response stays stored.

mod http_support;

use http_support::{Client, Handler, app, serve};
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;

#[tokio::test]
async fn same_key_with_another_method_path_query_or_body_is_422() {
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
            "/charge/order-A?currency=eur",
            Some("k"),
            "{\"amount\":100}",
        )
        .await;
    assert_eq!(first.status, 201);
    for (method, path, body) in [
        ("POST", "/charge/order-A?currency=eur", "{\"amount\":999}"),
        ("POST", "/charge/order-B?currency=eur", "{\"amount\":100}"),
        ("POST", "/charge/order-A?currency=usd", "{\"amount\":100}"),
        ("POST", "/charge/order-A", "{\"amount\":100}"),
        ("PATCH", "/charge/order-A?currency=eur", "{\"amount\":100}"),
    ] {
        let reply = client.send(method, path, Some("k"), body).await;
        let detail = reply.problem(422);
        assert!(detail.contains("different"), "{detail}");
        assert!(!reply.replayed());
    }
    assert_eq!(handler.runs(), 1, "no mismatch ran the handler");
    let again = client
        .send(
            "POST",
            "/charge/order-A?currency=eur",
            Some("k"),
            "{\"amount\":100}",
        )
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}
