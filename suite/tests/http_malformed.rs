//! Malformed `Idempotency-Key` headers: each a `400` that says what is wrong, no panic, nothing
//! stored, and the handler does not run.

mod http_support;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::Full;
use http_support::{Client, Handler, app, serve};
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;

/// Sends `POST /charge/order-A` with these `Idempotency-Key` values; checks the `400`, that
/// nothing was stored or run, and that the server still serves; returns the detail.
async fn refused(values: &[&[u8]]) -> String {
    let store = MemoryStore::new();
    let handler = Handler::default();
    let addr = serve(app(handler.clone(), IdempotencyLayer::new(store.clone()))).await;
    let client = Client::new(addr);

    let mut request = http::Request::post("/charge/order-A")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    for value in values {
        request
            .headers_mut()
            .append("idempotency-key", HeaderValue::from_bytes(value).unwrap());
    }
    let reply = client.send_request(request).await;
    let detail = reply.problem(400);
    assert!(detail.contains("Idempotency-Key"), "{detail}");
    assert!(store.is_empty(), "nothing stored");
    assert_eq!(handler.runs(), 0);
    assert_eq!(
        client.charge("fine").await.status,
        201,
        "the server still serves"
    );
    detail
}

#[tokio::test]
async fn empty_key_is_400() {
    let detail = refused(&[b""]).await;
    assert!(detail.contains("is empty"), "{detail}");
    let detail = refused(&[b"\"\""]).await;
    assert!(detail.contains("is empty"), "{detail}");
}

#[tokio::test]
async fn key_of_256_characters_is_400() {
    let detail = refused(&["k".repeat(256).as_bytes()]).await;
    assert!(
        detail.contains("256 characters long; the limit is 255"),
        "{detail}"
    );
}

#[tokio::test]
async fn non_ascii_key_is_400() {
    let detail = refused(&["clé-1".as_bytes()]).await;
    assert!(detail.contains("outside printable ASCII"), "{detail}");
}

#[tokio::test]
async fn two_key_headers_are_400() {
    let detail = refused(&[b"a", b"b"]).await;
    assert!(
        detail.contains("2 Idempotency-Key headers; send exactly one"),
        "{detail}"
    );
}

#[tokio::test]
async fn a_structured_field_list_is_400() {
    let detail = refused(&[b"\"a\", \"b\""]).await;
    assert!(detail.contains("list of keys"), "{detail}");
    let detail = refused(&[b"a, b"]).await;
    assert!(detail.contains("list of keys"), "{detail}");
}
