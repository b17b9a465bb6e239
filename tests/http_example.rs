//! `examples/http_idempotency.rs` over real HTTP: a charge, its repeat replayed, another body
//! under the same key refused with `422`, a request without a key refused with `400`; the
//! gateway charged once per key.

#[allow(dead_code)]
#[path = "../examples/http_idempotency.rs"]
mod example;

mod http_support;

use http_support::Client;
use jobguard::MemoryStore;
use std::time::Duration;

#[tokio::test]
async fn the_example_charges_once_per_key() {
    let app = example::app(MemoryStore::new(), Duration::ZERO);
    let client = Client::new(http_support::serve(app).await);
    let body = "{\"amount\":100}";

    let first = client
        .send("POST", "/charge/order-A", Some("idem-1"), body)
        .await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["charge_id"], "ch_1");
    assert_eq!(first.json()["amount"], 100);
    let again = client
        .send("POST", "/charge/order-A", Some("idem-1"), body)
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);

    client
        .send(
            "POST",
            "/charge/order-A",
            Some("idem-1"),
            "{\"amount\":999}",
        )
        .await
        .problem(422);
    client
        .send("POST", "/charge/order-A", None, body)
        .await
        .problem(400);
    let other = client
        .send("POST", "/charge/order-B", Some("idem-2"), body)
        .await;
    assert_eq!(
        other.json()["charge_id"],
        "ch_2",
        "one gateway charge per key"
    );
}
