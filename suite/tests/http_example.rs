//! `examples/http_idempotency.rs` over real HTTP: a charge, its repeat replayed, another body
//! under the same key refused with `422`, a request without a key refused with `400`; the
//! gateway charged once per key.

#[allow(dead_code)]
#[path = "../../examples/http_idempotency.rs"]
mod example;

mod http_support;

use http_body_util::Full;
use http_support::{Client, Reply};
use jobguard::MemoryStore;
use std::time::Duration;

/// `POST path` with a JSON body and, when given, `Idempotency-Key: key`.
async fn post(client: &Client, path: &str, key: Option<&str>, body: &str) -> Reply {
    let mut request = http::Request::post(path).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    client
        .send_request(request.body(Full::from(body.to_owned())).unwrap())
        .await
}

#[tokio::test]
async fn the_example_charges_once_per_key() {
    let app = example::app(MemoryStore::new(), Duration::ZERO);
    let client = Client::new(http_support::serve(app).await);
    let body = "{\"amount\":100}";

    let first = post(&client, "/charge/order-A", Some("idem-1"), body).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["charge_id"], "ch_1");
    assert_eq!(first.json()["amount"], 100);
    let again = post(&client, "/charge/order-A", Some("idem-1"), body).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);

    let other_body = "{\"amount\":999}";
    post(&client, "/charge/order-A", Some("idem-1"), other_body)
        .await
        .problem(422);
    post(&client, "/charge/order-A", None, body)
        .await
        .problem(400);
    let other = post(&client, "/charge/order-B", Some("idem-2"), body).await;
    assert_eq!(
        other.json()["charge_id"],
        "ch_2",
        "one gateway charge per key"
    );
}
