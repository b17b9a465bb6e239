//! A call keeps the runtime it started under: a runtime installed while a job is between
//! attempts is the job's next call's, not this one's. (A test binary of its own: `install` is
//! once per process.)

use jobguard::{Event, MemoryDeadLetters, Runtime};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

static CALLS: AtomicU32 = AtomicU32::new(0);

/// Fails twice; signals `first` when attempt 1 has run and waits for `go` before failing it.
#[jobguard::retry(attempts = 2, base = "1s", jitter = full, on = all)]
async fn flaky(first: &Notify, go: &Notify) -> Result<(), std::io::Error> {
    if CALLS.fetch_add(1, Ordering::SeqCst) == 0 {
        first.notify_one();
        go.notified().await;
    }
    Err(std::io::ErrorKind::TimedOut.into())
}

#[tokio::test(start_paused = true)]
async fn a_runtime_installed_mid_call_is_the_next_calls() {
    let (first, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let job = {
        let (first, go) = (first.clone(), go.clone());
        tokio::spawn(async move { flaky(&first, &go).await })
    };
    first.notified().await;

    let seen = Arc::new(Mutex::new(Vec::new()));
    let letters = MemoryDeadLetters::new();
    let runtime = {
        let seen = seen.clone();
        Runtime::builder()
            .observer(move |e: &Event<'_>| seen.lock().unwrap().push(format!("{e:?}")))
            .dead_letters(letters.clone())
            .build()
    };
    runtime.install().expect("the first install");
    go.notify_one();
    assert!(job.await.unwrap().is_err());
    assert!(
        seen.lock().unwrap().is_empty(),
        "the running call stayed on the embedded runtime: {:?}",
        seen.lock().unwrap()
    );
    assert!(letters.is_empty(), "its letter went to the embedded sink");

    // The next call starts under the installed runtime.
    let (first, go) = (Notify::new(), Notify::new());
    go.notify_one();
    assert!(flaky(&first, &go).await.is_err());
    let seen = seen.lock().unwrap();
    assert!(seen[0].starts_with("Attempt {"), "{seen:?}");
    assert_eq!(letters.len(), 1);
}
