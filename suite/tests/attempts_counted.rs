//! A dead letter's `attempts` is the job's count in its key's record, over every delivery: a
//! delivery cut short (its worker stopped mid-job) counts the attempts it made, where a count
//! inferred from the delivery's number would take it to have made all of the policy's. The
//! claim counts a job's first attempt and the engine each retry inside the claim, so the count
//! needs no round trip on the success path. On the in-memory store, under a paused clock.

use jobguard::{Delivery, GiveUp, MemoryDeadLetters, MemoryStore, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[jobguard::idempotent(key = order, scope = "attempts.counted", lease = "10s")]
#[jobguard::retry(attempts = 3, base = "1s", cap = "1s", jitter = none, on = transient)]
async fn charge(order: &str, tries: &AtomicU32) -> Result<(), GatewayError> {
    tries.fetch_add(1, Ordering::SeqCst);
    Err(GatewayError::Timeout)
}

#[tokio::test(start_paused = true)]
async fn a_delivery_cut_short_counts_the_attempts_it_made() {
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .store(MemoryStore::new())
        .dead_letters(letters.clone())
        .build();
    let tries = AtomicU32::new(0);

    // Delivery 1 of 2: two attempts (at 0 s and 1 s), then its worker stops during the second
    // backoff; the claim is released, as a graceful stop releases it.
    let first = Delivery {
        number: 1,
        last: false,
    };
    let cut = tokio::time::timeout(
        Duration::from_millis(1_500),
        runtime.scope(first.scope(charge("order-A", &tries))),
    )
    .await;
    assert!(cut.is_err(), "cut short: {cut:?}");
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    assert!(letters.is_empty());

    // Delivery 2, the last: its three attempts fail, and its letter counts all five.
    let last = Delivery {
        number: 2,
        last: true,
    };
    let result = runtime.scope(last.scope(charge("order-A", &tries))).await;
    assert!(matches!(result, Err(GatewayError::Timeout)), "{result:?}");
    assert_eq!(tries.load(Ordering::SeqCst), 5);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
    // Inferred from the delivery's number, it would say (2 - 1) × 3 + 3 = 6.
    assert_eq!(letters[0].attempts, 5, "{:?}", letters[0]);
}

#[tokio::test(start_paused = true)]
async fn a_job_without_a_runner_counts_its_attempts_in_one_claim() {
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .store(MemoryStore::new())
        .dead_letters(letters.clone())
        .build();
    let tries = AtomicU32::new(0);
    let result = runtime.scope(charge("order-B", &tries)).await;
    assert!(result.is_err());
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    assert_eq!(letters.letters()[0].attempts, 3);
}
