//! The server example's service over real HTTP on a loopback port: the three requests of
//! SCENARIO.md answer `queued` at once, and `GET /state` then shows the scenario's document.

use jobguard::{MemoryDeadLetters, MemoryStore};
use jobguard_workspace::scenario::{Service, router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.1 request; returns the status code and the body.
async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, serde_json::Value) {
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
    (status, serde_json::from_str(body).unwrap())
}

#[tokio::test(start_paused = true)]
async fn queued_at_once_then_the_state_document() {
    let service = Service::start(MemoryStore::new(), MemoryDeadLetters::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, router(service.clone())).into_future());

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
