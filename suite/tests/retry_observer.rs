//! The observer sees every attempt, every retry delay, the success and the dead letter, in the
//! order they happen, on the job's task.

use jobguard::{Event, GiveUp, MemoryDeadLetters, Runtime, Transient, Verdict};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway timeout")
    }
}

#[jobguard::retry(attempts = 3, base = "200ms", cap = "1s", jitter = none)]
async fn flaky(calls: &AtomicU32, fail_times: u32) -> Result<u32, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= fail_times {
        return Err(GatewayError::Timeout);
    }
    Ok(n)
}

/// A runtime whose observer writes each event as one line.
fn recording() -> (Runtime, Arc<Mutex<Vec<String>>>, MemoryDeadLetters) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let letters = MemoryDeadLetters::new();
    let seen = lines.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |e: &Event<'_>| {
            let line = match e {
                Event::Attempt { job, key, attempt } => {
                    format!("attempt {attempt} of {} key={key:?}", short(job))
                }
                Event::Retry {
                    attempt,
                    delay,
                    verdict,
                    error,
                    ..
                } => {
                    format!("attempt {attempt} failed ({error}, {verdict:?}); retry in {delay:?}")
                }
                Event::Succeeded { job, attempts, .. } => {
                    format!("{} succeeded after {attempts}", short(job))
                }
                Event::DeadLetter(letter) => format!(
                    "dead letter {} {:?} after {}: {}",
                    short(&letter.job),
                    letter.reason,
                    letter.attempts,
                    letter.error
                ),
                _ => return,
            };
            seen.lock().unwrap().push(line);
        })
        .build();
    (runtime, lines, letters)
}

fn short(job: &str) -> &str {
    job.rsplit("::").next().unwrap_or(job)
}

#[tokio::test(start_paused = true)]
async fn sees_every_attempt_delay_and_the_success_in_order() {
    let (runtime, lines, _) = recording();
    let calls = AtomicU32::new(0);
    runtime.scope(flaky(&calls, 2)).await.unwrap();
    assert_eq!(
        *lines.lock().unwrap(),
        [
            "attempt 1 of flaky key=None",
            "attempt 1 failed (gateway timeout, Retry); retry in 200ms",
            "attempt 2 of flaky key=None",
            "attempt 2 failed (gateway timeout, Retry); retry in 400ms",
            "attempt 3 of flaky key=None",
            "flaky succeeded after 3",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn sees_the_dead_letter_of_an_exhausted_job_and_no_success() {
    let (runtime, lines, letters) = recording();
    let calls = AtomicU32::new(0);
    runtime.scope(flaky(&calls, 99)).await.unwrap_err();
    assert_eq!(
        *lines.lock().unwrap(),
        [
            "attempt 1 of flaky key=None",
            "attempt 1 failed (gateway timeout, Retry); retry in 200ms",
            "attempt 2 of flaky key=None",
            "attempt 2 failed (gateway timeout, Retry); retry in 400ms",
            "attempt 3 of flaky key=None",
            "dead letter flaky Exhausted after 3: gateway timeout",
        ]
    );
    assert_eq!(letters.letters()[0].reason, GiveUp::Exhausted);
}

#[tokio::test(start_paused = true)]
async fn each_event_is_raised_when_it_happens_on_the_paused_clock() {
    let times = Arc::new(Mutex::new(Vec::new()));
    let seen = times.clone();
    let start = tokio::time::Instant::now();
    let runtime = Runtime::builder()
        .dead_letters(MemoryDeadLetters::new())
        .observer(move |e: &Event<'_>| {
            let what = match e {
                Event::Attempt { attempt, .. } => format!("attempt {attempt}"),
                Event::Retry { delay, verdict, .. } => {
                    assert_eq!(*verdict, Verdict::Retry);
                    format!("retry in {delay:?}")
                }
                Event::Succeeded { .. } => "succeeded".to_owned(),
                _ => return,
            };
            seen.lock().unwrap().push((start.elapsed(), what));
        })
        .build();
    let calls = AtomicU32::new(0);
    runtime.scope(flaky(&calls, 2)).await.unwrap();
    let ms = |n| Duration::from_millis(n);
    assert_eq!(
        *times.lock().unwrap(),
        [
            (ms(0), "attempt 1".to_owned()),
            (ms(0), "retry in 200ms".to_owned()),
            (ms(200), "attempt 2".to_owned()),
            (ms(200), "retry in 400ms".to_owned()),
            (ms(600), "attempt 3".to_owned()),
            (ms(600), "succeeded".to_owned()),
        ]
    );
}
