//! `#[idempotent]`: replay, composition with `#[retry]` in both orders, release on failure.

use jobguard::{Event, MemoryDeadLetters, MemoryStore, Runtime, Transient};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_id: String,
    attempts_used: u32,
}

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout => f.write_str("gateway timeout"),
            GatewayError::Jobguard(e) => e.fmt(f),
        }
    }
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

struct Gateway {
    attempts: AtomicU32,
    fail_first: u32,
}

impl Gateway {
    fn new(fail_first: u32) -> Self {
        Gateway {
            attempts: AtomicU32::new(0),
            fail_first,
        }
    }
    fn capture(&self, order_id: &str) -> Result<Receipt, GatewayError> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.fail_first {
            return Err(GatewayError::Timeout);
        }
        Ok(Receipt {
            order_id: order_id.to_owned(),
            attempts_used: n,
        })
    }
}

#[jobguard::idempotent(key = key)]
#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = none)]
async fn idempotency_outside(
    gateway: &Gateway,
    order_id: &str,
    key: &str,
) -> Result<Receipt, GatewayError> {
    gateway.capture(order_id)
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = none)]
#[jobguard::idempotent(key = key)]
async fn retry_written_first(
    gateway: &Gateway,
    order_id: &str,
    key: &str,
) -> Result<Receipt, GatewayError> {
    gateway.capture(order_id)
}

fn runtime() -> (Runtime, Arc<Mutex<Vec<String>>>, MemoryDeadLetters) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let letters = MemoryDeadLetters::new();
    let rt = Runtime::builder()
        .store(MemoryStore::new())
        .dead_letters(letters.clone())
        .observer(move |e: &Event<'_>| {
            let line = match e {
                Event::Attempt { attempt, .. } => format!("attempt {attempt}"),
                Event::Replayed { key, .. } => format!("replayed {key}"),
                Event::Claimed { key, .. } => format!("claimed {key}"),
                Event::Released { key, .. } => format!("released {key}"),
                _ => return,
            };
            seen.lock().unwrap().push(line);
        })
        .build();
    (rt, events, letters)
}

#[tokio::test(start_paused = true)]
async fn idempotency_wraps_retry_in_either_order_and_a_replay_runs_zero_attempts() {
    for order in ["idempotent first", "retry first"] {
        let (rt, events, _) = runtime();
        let gateway = Gateway::new(2);
        let call = || async {
            if order == "idempotent first" {
                idempotency_outside(&gateway, "order-A", "idem-1").await
            } else {
                retry_written_first(&gateway, "order-A", "idem-1").await
            }
        };
        let first = rt.scope(call()).await.unwrap();
        let second = rt.scope(call()).await.unwrap();
        assert_eq!(
            first,
            Receipt {
                order_id: "order-A".into(),
                attempts_used: 3
            },
            "{order}"
        );
        assert_eq!(second, first, "{order}: replayed");
        assert_eq!(
            gateway.attempts.load(Ordering::SeqCst),
            3,
            "{order}: charged once"
        );
        assert_eq!(
            *events.lock().unwrap(),
            [
                "claimed idem-1",
                "attempt 1",
                "attempt 2",
                "attempt 3",
                "replayed idem-1"
            ],
            "{order}: the key is checked once, outside the loop; the replay runs no attempt"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_job_releases_its_claim_and_a_redelivery_runs_again() {
    let (rt, events, letters) = runtime();
    let gateway = Gateway::new(5);
    let err = rt
        .scope(idempotency_outside(&gateway, "order-B", "idem-2"))
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Timeout));
    assert_eq!(letters.letters()[0].key.as_deref(), Some("idem-2"));
    // released, so the redelivery claims it again and (the gateway now healthy) succeeds
    let ok = rt
        .scope(idempotency_outside(&gateway, "order-B", "idem-2"))
        .await
        .unwrap();
    assert_eq!(ok.attempts_used, 6);
    let ev = events.lock().unwrap();
    assert_eq!(ev.iter().filter(|e| *e == "claimed idem-2").count(), 2);
    assert!(ev.contains(&"released idem-2".to_owned()));
}
