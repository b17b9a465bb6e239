//! `jobguard::attempt()` inside a guarded call: the attempt's number from 1 under `#[retry]`,
//! `#[idempotent]` and `Policy::run`, the delivery a job runner put in scope, and `None`
//! outside any guarded call (and again after one).

use jobguard::{Delivery, Jitter, Policy};
use std::io;
use std::time::Duration;

#[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms", jitter = none, on = all)]
async fn numbered(seen: &std::sync::Mutex<Vec<u32>>) -> Result<u32, io::Error> {
    let attempt = jobguard::attempt().expect("inside #[retry]");
    seen.lock().unwrap().push(attempt.number);
    if attempt.number < 3 {
        // A pending poll in between: the attempt is still the same one afterwards.
        tokio::task::yield_now().await;
        assert_eq!(jobguard::attempt().map(|a| a.number), Some(attempt.number));
        return Err(io::ErrorKind::ConnectionReset.into());
    }
    Ok(attempt.number)
}

#[jobguard::idempotent(key = id)]
async fn claimed(id: &str) -> Result<u32, jobguard::Error> {
    let _ = id;
    Ok(jobguard::attempt().expect("inside #[idempotent]").number)
}

#[jobguard::retry(attempts = 1)]
async fn delivered() -> Result<Option<Delivery>, io::Error> {
    Ok(jobguard::attempt().and_then(|a| a.delivery))
}

#[tokio::test(start_paused = true)]
async fn retry_numbers_its_attempts_from_one() {
    let seen = std::sync::Mutex::new(Vec::new());
    assert_eq!(numbered(&seen).await.unwrap(), 3);
    assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
    assert!(jobguard::attempt().is_none());
}

#[tokio::test(start_paused = true)]
async fn idempotent_alone_is_attempt_one() {
    assert_eq!(claimed("attempt-1").await.unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn policy_run_numbers_its_attempts() {
    let policy = Policy::new()
        .attempts(2)
        .base(Duration::from_millis(5))
        .jitter(Jitter::None);
    let got = policy
        .run("attempt", async |n| {
            let attempt = jobguard::attempt().expect("inside Policy::run");
            assert_eq!(attempt.number, n);
            if n == 1 {
                Err(io::Error::from(io::ErrorKind::ConnectionReset))
            } else {
                Ok(attempt.number)
            }
        })
        .await;
    assert_eq!(got.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_start_is_the_attempt_s_own() {
    let policy = Policy::new()
        .attempts(2)
        .base(Duration::from_secs(1))
        .jitter(Jitter::None);
    let begin = tokio::time::Instant::now();
    let starts = policy
        .run("attempt", async |n| {
            let started = jobguard::attempt().expect("inside").started;
            if n == 1 {
                Err(io::Error::from(io::ErrorKind::ConnectionReset))
            } else {
                Ok(started)
            }
        })
        .await
        .unwrap();
    assert_eq!(starts - begin, Duration::from_secs(1));
}

#[tokio::test]
async fn the_delivery_in_scope_is_carried() {
    let delivery = Delivery {
        number: 3,
        last: true,
    };
    assert_eq!(delivered().await.unwrap(), None);
    assert_eq!(delivery.scope(delivered()).await.unwrap(), Some(delivery));
    assert_eq!(Delivery::current(), None);
}

#[test]
fn outside_a_guarded_call_there_is_no_attempt() {
    assert!(jobguard::attempt().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_start_read_before_a_pending_poll_is_the_same_after_it() {
    let policy = Policy::new().attempts(1);
    let (before, after) = policy
        .run("attempt", async |_| {
            let before = jobguard::attempt().expect("inside").started;
            // Later in the same poll (so a start taken when the poll ends would differ), then a
            // poll that is pending.
            tokio::time::advance(Duration::from_secs(1)).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let after = jobguard::attempt().expect("inside").started;
            Ok::<_, io::Error>((before, after))
        })
        .await
        .unwrap();
    assert_eq!(before, after);
}

#[tokio::test(start_paused = true)]
async fn an_inner_call_s_start_is_its_own_and_the_outer_one_is_kept() {
    let policy = Policy::new().attempts(1);
    let begin = tokio::time::Instant::now();
    let (outer_before, inner, outer_after) = policy
        .run("outer", async |_| {
            let outer_before = jobguard::attempt().expect("outer").started;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let inner = policy
                .run("inner", async |_| {
                    let before = jobguard::attempt().expect("inner").started;
                    tokio::time::advance(Duration::from_millis(500)).await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    assert_eq!(jobguard::attempt().expect("inner").started, before);
                    Ok::<_, io::Error>(before)
                })
                .await?;
            let outer_after = jobguard::attempt().expect("outer").started;
            Ok::<_, io::Error>((outer_before, inner, outer_after))
        })
        .await
        .unwrap();
    assert_eq!(outer_before, begin);
    assert_eq!(inner - begin, Duration::from_secs(1));
    assert_eq!(outer_after, outer_before);
}
