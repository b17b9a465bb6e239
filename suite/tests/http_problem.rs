//! Every answer the layer gives itself is `application/problem+json` (RFC 9457) with a `type`,
//! a `title`, the `status` and a `detail` a person can act on.

mod http_support;

use http_support::{Client, Handler, app, serve};
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;
use std::collections::BTreeSet;

#[tokio::test]
async fn every_error_is_a_problem_document_with_a_title_and_a_detail() {
    let (handler, gate) = Handler::gated();
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .required(true)
        .max_body(8);
    let addr = serve(app(handler.clone(), layer)).await;
    let client = Client::new(addr);

    let mut titles = BTreeSet::new();
    let mut check = |reply: http_support::Reply, status: u16| {
        reply.problem(status);
        titles.insert(reply.json()["title"].as_str().unwrap().to_owned());
    };
    check(client.send("POST", "/charge/a", None, "").await, 400);
    check(client.send("POST", "/charge/a", Some(""), "").await, 400);
    check(
        client
            .send("POST", "/charge/a", Some("k"), "123456789")
            .await,
        413,
    );

    let first = tokio::spawn({
        let client = client.clone();
        async move { client.send("POST", "/charge/a", Some("k"), "1").await }
    });
    handler.entered.notified().await;
    check(client.send("POST", "/charge/a", Some("k"), "1").await, 409);
    check(client.send("POST", "/charge/a", Some("k"), "2").await, 422);
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, 201);

    assert_eq!(
        titles.into_iter().collect::<Vec<_>>(),
        [
            "A request with this Idempotency-Key is in progress",
            "Idempotency-Key is malformed",
            "Idempotency-Key is missing",
            "Idempotency-Key reused with a different request",
            "Request body too large",
        ]
    );
}
