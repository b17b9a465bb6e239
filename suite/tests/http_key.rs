//! The key is a structured-field string (`"abc"`) or a bare token (`abc`), 1 to 255 characters:
//! both spellings name the same key.

mod http_support;

use http_support::{Client, Handler, app, serve};
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;

#[tokio::test]
async fn key_as_a_quoted_string_or_a_bare_token_up_to_255_characters() {
    let handler = Handler::default();
    let addr = serve(app(
        handler.clone(),
        IdempotencyLayer::new(MemoryStore::new()),
    ))
    .await;
    let client = Client::new(addr);

    let quoted = client.charge("\"8e03978e-40d5\"").await;
    assert_eq!(quoted.status, 201);
    let bare = client.charge("8e03978e-40d5").await;
    assert!(bare.replayed(), "\"abc\" and abc are one key: {bare:?}");
    assert_eq!(bare.body, quoted.body);
    assert_eq!(handler.runs(), 1);

    let longest = "k".repeat(255);
    assert_eq!(client.charge(&longest).await.status, 201);
    assert_eq!(client.charge(&format!("\"{longest}\"")).await.status, 201);
    assert!(client.charge(&longest).await.replayed());
    assert_eq!(handler.runs(), 2);

    let one = client.charge("x").await;
    assert_eq!(one.status, 201);
    assert_eq!(handler.runs(), 3);
}
