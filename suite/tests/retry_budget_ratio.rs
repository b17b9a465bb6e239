//! `retry_budget`: a `RetryBudget` in one process. Each call deposits, each retry withdraws; a
//! retry the budget cannot pay for is not made, the call returns its attempt's own error, and
//! its one dead letter says `retry_budget`. The deposits expire after the window.

use jobguard::{GiveUp, MemoryDeadLetters, RetryBudget, Runtime};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static BUDGET: RetryBudget = RetryBudget::new(0.1, 0, Duration::from_secs(10));
static CALLS: AtomicU32 = AtomicU32::new(0);

/// Fails the first attempt of every call, with a transient error.
#[jobguard::retry(attempts = 3, base = "100ms", jitter = none, retry_budget = BUDGET)]
async fn flaky(id: u32) -> Result<u32, std::io::Error> {
    CALLS.fetch_add(1, Ordering::SeqCst);
    match jobguard::attempt().map(|a| a.number) {
        Some(1) => Err(std::io::ErrorKind::ConnectionReset.into()),
        _ => Ok(id),
    }
}

#[tokio::test(start_paused = true)]
async fn retries_beyond_the_budget_are_not_made_and_the_letter_says_so() {
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    runtime
        .scope(async {
            // Ten calls at 0.1 earn one retry: the tenth call's retry goes through.
            let mut ok = 0;
            for id in 0..10 {
                match flaky(id).await {
                    Ok(_) => ok += 1,
                    Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
                }
            }
            assert_eq!(ok, 1, "one retry for ten calls");
            assert_eq!(CALLS.load(Ordering::SeqCst), 11);
            let letters = letters.letters();
            assert_eq!(letters.len(), 9);
            assert!(
                letters
                    .iter()
                    .all(|l| l.reason == GiveUp::RetryBudget && l.attempts == 1)
            );
            assert_eq!(letters[0].reason.as_str(), "retry_budget");

            // Past the window, the deposits are gone: ten more calls earn the next retry.
            tokio::time::advance(Duration::from_secs(11)).await;
            assert_eq!(BUDGET.balance(), 0);
            for id in 0..9 {
                assert!(flaky(id).await.is_err());
            }
            assert_eq!(flaky(9).await.unwrap(), 9);
        })
        .await;
}
