//! A `#[retry]` future is `Send` whenever its body's is: it can be spawned, and it recovers on
//! another task as it does inline.

use jobguard::{MemoryDeadLetters, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

#[jobguard::retry(attempts = 4, base = "100ms", cap = "1s", jitter = full, timeout = "5s", budget = "1m")]
async fn flaky(calls: Arc<AtomicU32>, fail_times: u32) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(10)).await;
    if n <= fail_times {
        return Err(GatewayError::Timeout);
    }
    Ok(n)
}

#[jobguard::retry(attempts = 2, base = "100ms", cap = "1s", jitter = none)]
async fn borrowing(calls: &AtomicU32) -> Result<u32, GatewayError> {
    Ok(calls.fetch_add(1, Ordering::SeqCst) + 1)
}

fn assert_send<F: Send>(f: F) -> F {
    f
}

#[tokio::test(start_paused = true)]
async fn a_spawned_retry_future_recovers_on_its_own_task() {
    let runtime = Runtime::builder()
        .dead_letters(MemoryDeadLetters::new())
        .seed(1)
        .build();
    let calls = Arc::new(AtomicU32::new(0));
    let start = Instant::now();
    let job = flaky(calls.clone(), 2);
    let task = tokio::spawn(async move { runtime.scope(job).await });
    assert_eq!(task.await.unwrap().unwrap(), 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Three 10ms attempts and two full-jitter delays of at most 100ms and 200ms.
    assert!(
        start.elapsed() >= Duration::from_millis(30),
        "{:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() <= Duration::from_millis(330),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_future_borrowing_its_arguments_is_send_too() {
    let calls = AtomicU32::new(0);
    assert_eq!(assert_send(borrowing(&calls)).await.unwrap(), 1);
}

#[test]
fn many_spawned_jobs_recover_on_a_multi_threaded_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let runtime = Runtime::builder()
            .dead_letters(MemoryDeadLetters::new())
            .build();
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let calls = Arc::new(AtomicU32::new(0));
                let runtime = runtime.clone();
                let job = flaky_fast(calls.clone(), i % 3);
                (calls, tokio::spawn(async move { runtime.scope(job).await }))
            })
            .collect();
        for (calls, task) in tasks {
            let n = task.await.unwrap().unwrap();
            assert_eq!(n, calls.load(Ordering::SeqCst));
        }
    });
}

/// As [`flaky`], with zero delays so that it runs on the real clock.
#[jobguard::retry(attempts = 4, base = "0ms", cap = "0ms", jitter = none, timeout = "5s")]
async fn flaky_fast(calls: Arc<AtomicU32>, fail_times: u32) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::task::yield_now().await;
    if n <= fail_times {
        return Err(GatewayError::Timeout);
    }
    Ok(n)
}

/// An error that is `Send` but not `Sync`: the call's future must still be `Send`, so nothing
/// may hold `&E` across an await (the give-up's dead letter takes the error's message).
#[jobguard::retry(attempts = 2, base = "1ms", jitter = none, on = all)]
async fn send_but_not_sync(calls: &AtomicU32) -> Result<(), Box<dyn std::error::Error + Send>> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut)))
}

#[tokio::test(start_paused = true)]
async fn an_error_that_is_send_but_not_sync_keeps_the_future_send() {
    fn assert_send<F: std::future::Future + Send>(f: F) -> F {
        f
    }
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    let spawned = tokio::spawn(async move {
        runtime
            .scope(assert_send(send_but_not_sync(&CALLS)))
            .await
            .is_err()
    });
    assert!(spawned.await.unwrap());
    assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    assert_eq!(letters.letters()[0].error, "timed out");
}
