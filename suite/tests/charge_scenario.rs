//! The charge example's scenario, end to end on the in-memory store, under a paused clock: the
//! state document must read exactly as the example's documentation shows.

#[allow(dead_code)]
#[path = "../../examples/charge.rs"]
mod example;

use example::{Service, run_scenario};
use jobguard::{MemoryDeadLetters, MemoryStore};

#[tokio::test(start_paused = true)]
async fn the_state_document_reads_as_the_scenario_shows() {
    let letters = MemoryDeadLetters::new();
    let service = Service::start(MemoryStore::new(), letters.clone());
    let started = tokio::time::Instant::now();
    let state = run_scenario(&service).await;
    let expected = serde_json::json!({
        "attempts": [
            "order-A attempt 1",
            "order-A attempt 2",
            "order-A attempt 3",
            "order-A skipped: idempotency key idem-1 already processed",
            "order-B attempt 1",
            "order-B attempt 2",
            "order-B attempt 3",
            "order-B attempt 4",
            "order-B attempt 5"
        ],
        "charges": ["order-A"],
        "backoff_delays": [0.5, 1.0, 0.5, 1.0, 2.0, 4.0],
        "idempotency_store": {
            "idem-1": {"order_id": "order-A", "attempts_used": 3}
        },
        "dead_letter": [
            "order-B key=idem-2 gave up: gateway timeout on order-B (attempt 5)"
        ]
    });
    assert_eq!(serde_json::to_value(&state).unwrap(), expected);
    // 0.5 + 1.0 for order-A, 0.5 + 1.0 + 2.0 + 4.0 for order-B, on the paused clock.
    assert_eq!(started.elapsed(), std::time::Duration::from_millis(9000));
    let kept = letters.letters();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].key.as_deref(), Some("idem-2"));
    assert_eq!(kept[0].attempts, 5);
}
