//! The server example's service over real HTTP on a loopback port: the charge scenario's three
//! requests answer `queued` at once, `GET /state` then shows the scenario's document, and
//! `GET /metrics` the attempts and dead-letter counters in the Prometheus text format.

#[allow(dead_code)]
#[path = "../../examples/server.rs"]
mod example;

use example::{Service, router};
use jobguard::observe::metrics as names;
use jobguard::{MemoryDeadLetters, MemoryStore};
use jobguard_testkit::prometheus::{samples, types};
use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The job label of the scenario's charge job: its pinned idempotency scope, its one name.
const JOB: &str = "payments.charge";

/// One HTTP/1.1 request; returns the status code, the head (status line and headers) and the
/// body.
async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// One HTTP/1.1 request with a JSON answer; returns the status code and the body.
async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, serde_json::Value) {
    let (status, _, body) = request(addr, method, path).await;
    (status, serde_json::from_str(&body).unwrap())
}

/// Starts a service and its server on a free loopback port.
async fn serve() -> (Service, std::net::SocketAddr) {
    let service = Service::start(MemoryStore::new(), MemoryDeadLetters::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, router(service.clone())).into_future());
    (service, addr)
}

/// Sends the scenario's three requests, each answered `queued` at once, and waits until the
/// three jobs have finished.
async fn run_scenario(service: &Service, addr: std::net::SocketAddr) {
    for (order, key) in [
        ("order-A", "idem-1"),
        ("order-A", "idem-1"),
        ("order-B", "idem-2"),
    ] {
        let (status, body) = http(addr, "POST", &format!("/charge/{order}?key={key}")).await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            serde_json::json!({"order_id": order, "idempotency_key": key, "status": "queued"})
        );
    }
    service.finished(3).await;
}

#[tokio::test(start_paused = true)]
async fn queued_at_once_then_the_state_document() {
    let (service, addr) = serve().await;
    run_scenario(&service, addr).await;
    let (status, state) = http(addr, "GET", "/state").await;
    assert_eq!(status, 200);
    assert_eq!(state["charges"], serde_json::json!(["order-A"]));
    assert_eq!(
        state["backoff_delays"],
        serde_json::json!([0.5, 1.0, 0.5, 1.0, 2.0, 4.0])
    );
    assert_eq!(
        state["idempotency_store"],
        serde_json::json!({"idem-1": {"order_id": "order-A", "attempts_used": 3}})
    );
    assert_eq!(
        state["dead_letter"],
        serde_json::json!(["order-B key=idem-2 gave up: gateway timeout on order-B (attempt 5)"])
    );
    assert_eq!(state["attempts"].as_array().unwrap().len(), 9);
}

#[tokio::test(start_paused = true)]
async fn metrics_show_the_attempts_and_the_dead_letter() {
    let (service, addr) = serve().await;
    let (status, _, before) = request(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(samples(&before).is_empty(), "no job has run yet:\n{before}");

    run_scenario(&service, addr).await;
    let (status, head, rendered) = request(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        head.lines()
            .any(|h| h.eq_ignore_ascii_case("content-type: text/plain; version=0.0.4")),
        "{head}"
    );
    assert!(!rendered.contains("_total_total"), "{rendered}");
    assert_eq!(
        types(&rendered),
        BTreeMap::from([
            (names::ATTEMPTS, "counter"),
            (names::RETRIES, "counter"),
            (names::DEAD_LETTERED, "counter"),
            (names::REPLAYS, "counter"),
        ]),
        "{rendered}"
    );
    for name in [names::ATTEMPTS, names::DEAD_LETTERED] {
        let help = format!("# HELP {name} ");
        assert_eq!(rendered.matches(&help).count(), 1, "{rendered}");
    }
    // order-A: 3 attempts, 2 retries, then a replay; order-B: 5 attempts, 4 retries, exhausted.
    let attempts = format!(r#"{}{{job="{JOB}"}}"#, names::ATTEMPTS);
    let retries = format!(r#"{}{{job="{JOB}"}}"#, names::RETRIES);
    let dead = format!(
        r#"{}{{job="{JOB}",reason="exhausted"}}"#,
        names::DEAD_LETTERED
    );
    let replays = format!(r#"{}{{job="payments.charge"}}"#, names::REPLAYS);
    assert_eq!(
        samples(&rendered),
        BTreeMap::from([
            (attempts.as_str(), "8"),
            (retries.as_str(), "6"),
            (dead.as_str(), "1"),
            (replays.as_str(), "1"),
        ]),
        "{rendered}"
    );
}

/// One HTTP/1.1 POST with an `Idempotency-Key` header; returns the status code, the head and
/// the body.
async fn post_with_key(addr: std::net::SocketAddr, path: &str, key: &str) -> (u16, String, String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nIdempotency-Key: {key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

#[tokio::test(start_paused = true)]
async fn a_client_key_replays_the_first_answer_and_queues_one_job() {
    let (service, addr) = serve().await;
    let (status, head, first) = post_with_key(addr, "/charge/order-A", "idem-7").await;
    assert_eq!(status, 200, "{head}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&first).unwrap(),
        serde_json::json!({"order_id": "order-A", "idempotency_key": "idem-7", "status": "queued"})
    );
    service.finished(1).await;

    // The client's retry: the layer replays the stored answer byte for byte; no job is queued.
    let (status, head, again) = post_with_key(addr, "/charge/order-A", "idem-7").await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.lines()
            .any(|h| h.eq_ignore_ascii_case("idempotent-replayed: true")),
        "{head}"
    );
    assert_eq!(again, first);

    // The same key on another request is refused, and queues nothing either.
    let (status, head, problem) = post_with_key(addr, "/charge/order-B", "idem-7").await;
    assert_eq!(status, 422, "{head}\n{problem}");
    assert!(
        head.lines()
            .any(|h| h.eq_ignore_ascii_case("content-type: application/problem+json")),
        "{head}"
    );

    let (_, state) = http(addr, "GET", "/state").await;
    assert_eq!(state["charges"], serde_json::json!(["order-A"]));
    // One job ran: order-A's gateway times out twice, then charges.
    assert_eq!(state["attempts"].as_array().unwrap().len(), 3, "{state}");
}
