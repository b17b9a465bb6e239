//! Keys are scoped by `.scope(...)`: two tenants' equal keys never meet.

mod http_support;

use http_body_util::Full;
use http_support::{Client, Handler, app, serve};
use jobguard::http::IdempotencyLayer;
use jobguard::{MemoryStore, StoreKey};

fn tenant(parts: &http::request::Parts) -> String {
    parts
        .headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned()
}

#[tokio::test]
async fn two_tenants_equal_keys_never_meet() {
    let store = MemoryStore::new();
    let handler = Handler::default();
    let addr = serve(app(
        handler.clone(),
        IdempotencyLayer::new(store.clone()).scope(tenant),
    ))
    .await;
    let client = Client::new(addr);
    let send = async |tenant: &str, body: &str| {
        let request = http::Request::post("/charge/order-A")
            .header("x-tenant", tenant)
            .header("idempotency-key", "idem-1")
            .body(Full::from(body.to_owned()))
            .unwrap();
        client.send_request(request).await
    };

    let alice = send("alice", "{\"amount\":100}").await;
    let bob = send("bob:eu", "{\"amount\":7}").await;
    assert_eq!(
        (alice.status.as_u16(), bob.status.as_u16()),
        (201, 201),
        "no 422 across tenants"
    );
    assert!(!bob.replayed());
    assert_eq!(handler.runs(), 2);
    let alice_again = send("alice", "{\"amount\":100}").await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    let bob_again = send("bob:eu", "{\"amount\":7}").await;
    assert_eq!(bob_again.body, bob.body);
    assert_eq!(handler.runs(), 2);
    assert!(
        store
            .completed(StoreKey {
                scope: "http.alice",
                key: "idem-1"
            })
            .is_some()
    );
    assert!(
        store
            .completed(StoreKey {
                scope: "http.bob%3Aeu",
                key: "idem-1"
            })
            .is_some()
    );
}
