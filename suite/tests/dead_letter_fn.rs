//! A sink from a closure, `dead_letter::from_fn`: it receives every give-up of the runtime (or of
//! one job, with `dead_letter = ...`), and a failing closure never masks the job's own error.

use jobguard::{DeadLetter, DeadLetterSink, GiveUp, MemoryDeadLetters, Runtime};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

#[derive(Debug, jobguard::Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    Declined,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout => f.write_str("gateway timeout"),
            GatewayError::Declined => f.write_str("card declined"),
        }
    }
}

#[jobguard::retry(attempts = 3, base = "500ms", jitter = none)]
async fn times_out() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 3, base = "500ms", jitter = none)]
async fn declined() -> Result<(), GatewayError> {
    Err(GatewayError::Declined)
}

#[jobguard::retry(attempts = 3, base = "500ms", jitter = none, dead_letter = sink)]
async fn declined_to(sink: &dyn DeadLetterSink) -> Result<(), GatewayError> {
    let _ = sink;
    Err(GatewayError::Declined)
}

#[tokio::test(start_paused = true)]
async fn a_closure_sink_receives_every_give_up_of_the_runtime() {
    let (tx, mut rx) = mpsc::unbounded_channel::<DeadLetter>();
    let sink = jobguard::dead_letter::from_fn(move |letter| {
        let tx = tx.clone();
        async move {
            tx.send(letter)
                .map_err(|_| jobguard::Error::Store("channel closed".into()))
        }
    });
    let runtime = Runtime::builder().dead_letters(sink).build();
    assert!(runtime.scope(times_out()).await.is_err());
    assert!(runtime.scope(declined()).await.is_err());

    let first = rx.try_recv().unwrap();
    assert_eq!(first.job, "dead_letter_fn::times_out");
    assert_eq!((first.reason, first.attempts), (GiveUp::Exhausted, 3));
    assert_eq!(first.error, "gateway timeout");
    let second = rx.try_recv().unwrap();
    assert_eq!(second.job, "dead_letter_fn::declined");
    assert_eq!((second.reason, second.attempts), (GiveUp::Permanent, 1));
    assert!(rx.try_recv().is_err(), "one letter per give-up");
}

#[tokio::test(start_paused = true)]
async fn a_closure_sink_given_to_one_job_takes_its_letters_instead_of_the_runtime() {
    let runtime_letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder()
        .dead_letters(runtime_letters.clone())
        .build();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let sink = jobguard::dead_letter::from_fn(move |letter: DeadLetter| {
        kept.lock().unwrap().push(letter.job);
        async { Ok(()) }
    });
    assert!(runtime.scope(declined_to(&sink)).await.is_err());
    assert_eq!(*seen.lock().unwrap(), ["dead_letter_fn::declined_to"]);
    assert!(runtime_letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failing_closure_sink_does_not_mask_the_job_error() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let sink = jobguard::dead_letter::from_fn(move |_letter| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Err(jobguard::Error::Store("queue unreachable".into())) }
    });
    let runtime = Runtime::builder().dead_letters(sink).build();
    let result = runtime.scope(declined()).await;
    assert!(matches!(result, Err(GatewayError::Declined)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
