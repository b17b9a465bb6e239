//! `5xx`, `408` and `429` are not stored: the claim is released and a repeat runs the handler
//! again. Other `4xx` are stored and replayed, since they would repeat.

mod http_support;

use axum::http::StatusCode;
use http_support::{Client, Handler, app, serve};
use jobguard::http::IdempotencyLayer;
use jobguard::{MemoryStore, StoreKey};

#[tokio::test]
async fn server_errors_408_and_429_are_not_stored_and_the_claim_is_released() {
    for status in [500, 502, 503, 504, 408, 429] {
        let store = MemoryStore::new();
        let handler = Handler {
            status: Some(StatusCode::from_u16(status).unwrap()),
            ..Handler::default()
        };
        let addr = serve(app(handler.clone(), IdempotencyLayer::new(store.clone()))).await;
        let client = Client::new(addr);

        let first = client.charge("k").await;
        assert_eq!(first.status, status);
        let again = client.charge("k").await;
        assert_eq!(again.status, status, "the repeat ran instead of a 409");
        assert!(!again.replayed());
        assert_eq!(handler.runs(), 2, "{status}: the claim was released");
        assert_eq!(
            store.completed(StoreKey {
                scope: "http-anonymous",
                key: "k"
            }),
            None,
            "{status}: nothing stored"
        );
    }
}

#[tokio::test]
async fn other_client_errors_are_stored_and_replayed() {
    for status in [400, 402, 404, 409, 422] {
        let store = MemoryStore::new();
        let handler = Handler {
            status: Some(StatusCode::from_u16(status).unwrap()),
            ..Handler::default()
        };
        let addr = serve(app(handler.clone(), IdempotencyLayer::new(store.clone()))).await;
        let client = Client::new(addr);

        let first = client.charge("k").await;
        assert_eq!(first.status, status);
        let again = client.charge("k").await;
        assert!(again.replayed(), "{status}");
        assert_eq!(again.status, status);
        assert_eq!(again.body, first.body);
        assert_eq!(handler.runs(), 1, "{status}");
        assert_eq!(store.len(), 1);
    }
}
