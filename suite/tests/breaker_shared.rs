//! One breaker `static` shared by two annotated functions opens after N failures across both,
//! fails fast, and closes after one good probe.

use jobguard::{BreakerState, CircuitBreaker, Event, GiveUp, MemoryDeadLetters, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{Instant, sleep};

static GATEWAY: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(30)).named("gateway");

/// Whether the payment gateway answers, and how many calls reached it.
static GATEWAY_UP: AtomicBool = AtomicBool::new(false);
static GATEWAY_CALLS: AtomicU32 = AtomicU32::new(0);

async fn gateway(order_id: &str) -> Result<String, GatewayError> {
    GATEWAY_CALLS.fetch_add(1, Ordering::SeqCst);
    if GATEWAY_UP.load(Ordering::SeqCst) {
        Ok(order_id.to_owned())
    } else {
        Err(GatewayError::Timeout)
    }
}

#[jobguard::retry(attempts = 2, base = "1s", jitter = none, breaker = GATEWAY)]
async fn charge(order_id: &str) -> Result<String, GatewayError> {
    gateway(order_id).await
}

#[jobguard::retry(attempts = 2, base = "1s", jitter = none, breaker = GATEWAY)]
async fn refund(order_id: &str) -> Result<String, GatewayError> {
    gateway(order_id).await
}

fn is_circuit_open(r: &Result<String, GatewayError>) -> bool {
    matches!(
        r,
        Err(GatewayError::Jobguard(jobguard::Error::CircuitOpen { .. }))
    )
}

#[tokio::test(start_paused = true)]
async fn a_breaker_shared_by_two_jobs_opens_after_n_failures_across_both_fails_fast_and_closes_after_one_good_probe()
 {
    let letters = MemoryDeadLetters::new();
    let transitions = Arc::new(Mutex::new(Vec::new()));
    let sink = transitions.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |e: &Event<'_>| {
            if let Event::Breaker { breaker, from, to } = e {
                sink.lock()
                    .unwrap()
                    .push(format!("{breaker}: {from} -> {to}"));
            }
        })
        .build();
    let calls = || GATEWAY_CALLS.load(Ordering::SeqCst);

    runtime
        .scope(async {
            // The gateway is down. `charge` fails twice (failures 1 and 2) and gives up exhausted.
            assert!(charge("order-A").await.is_err());
            assert_eq!((calls(), GATEWAY.state()), (2, BreakerState::Closed));
            // `refund`'s first failure is the third across both jobs: the breaker opens, and its
            // own second attempt is refused before it reaches the gateway.
            assert!(is_circuit_open(&refund("order-B").await));
            assert_eq!((calls(), GATEWAY.state()), (3, BreakerState::Open));

            // Open: both jobs fail fast, without a call to the gateway and without waiting.
            let start = Instant::now();
            assert!(is_circuit_open(&charge("order-C").await));
            assert!(is_circuit_open(&refund("order-D").await));
            assert_eq!(calls(), 3);
            assert_eq!(start.elapsed(), Duration::ZERO);

            // The gateway recovers; after the cooldown, one good probe closes the breaker.
            GATEWAY_UP.store(true, Ordering::SeqCst);
            sleep(GATEWAY.retry_in()).await;
            assert_eq!(refund("order-E").await.unwrap(), "order-E");
            assert_eq!((calls(), GATEWAY.state()), (4, BreakerState::Closed));
            assert_eq!(charge("order-F").await.unwrap(), "order-F");
            assert_eq!(calls(), 5);
        })
        .await;

    assert_eq!(
        *transitions.lock().unwrap(),
        [
            "gateway: closed -> open",
            "gateway: open -> half_open",
            "gateway: half_open -> closed"
        ]
    );
    let reasons: Vec<(String, GiveUp, u32)> = letters
        .letters()
        .into_iter()
        .map(|l| {
            (
                l.job.rsplit("::").next().unwrap().to_owned(),
                l.reason,
                l.attempts,
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("charge".to_owned(), GiveUp::Exhausted, 2),
            ("refund".to_owned(), GiveUp::CircuitOpen, 1),
            ("charge".to_owned(), GiveUp::CircuitOpen, 0),
            ("refund".to_owned(), GiveUp::CircuitOpen, 0),
        ]
    );
}
