//! `#[retry]` at work: a flaky call recovers on its third attempt, and a permanent failure
//! fails fast with one attempt and a dead letter. An observer prints each attempt and each delay
//! as it happens.
//!
//! ```text
//! cargo run --example retry
//! ```
//!
//! Real (short) delays, and `jitter = none` so that they read 200ms, 400ms; production keeps the
//! default full jitter.

use jobguard::{Event, MemoryDeadLetters, Runtime, Transient};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::time::Instant;

/// What the remote service answers.
#[derive(Debug, Transient)]
pub enum FetchError {
    /// 503: worth another try.
    #[transient]
    Unavailable,
    /// 404: no retry can help.
    NotFound,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Unavailable => f.write_str("503 service unavailable"),
            FetchError::NotFound => f.write_str("404 not found"),
        }
    }
}

/// Unavailable twice, then answers.
#[jobguard::retry(attempts = 4, base = "200ms", cap = "1s", jitter = none)]
pub async fn flaky_fetch(calls: &AtomicU32) -> Result<&'static str, FetchError> {
    if calls.fetch_add(1, Ordering::SeqCst) < 2 {
        return Err(FetchError::Unavailable);
    }
    Ok("200 OK: order-A")
}

/// Never there: a permanent failure.
#[jobguard::retry(attempts = 4, base = "200ms", cap = "1s", jitter = none)]
pub async fn missing_fetch() -> Result<&'static str, FetchError> {
    Err(FetchError::NotFound)
}

/// The job's name without its module path.
fn short(job: &str) -> &str {
    job.rsplit("::").next().unwrap_or(job)
}

/// Runs both calls, handing each line of the story to `say` as it happens.
pub async fn run(say: Arc<dyn Fn(String) + Send + Sync>) {
    let start = Instant::now();
    let letters = MemoryDeadLetters::new();
    let observer = {
        let say = say.clone();
        move |event: &Event<'_>| {
            let at = start.elapsed().as_millis();
            let line = match event {
                Event::Attempt { job, attempt, .. } => format!("{}: attempt {attempt}", short(job)),
                Event::Retry {
                    job,
                    attempt,
                    delay,
                    error,
                    ..
                } => format!(
                    "{}: attempt {attempt} failed: {error}; retrying in {delay:?}",
                    short(job)
                ),
                Event::Succeeded { job, attempts, .. } => {
                    format!("{}: succeeded after {attempts} attempt(s)", short(job))
                }
                Event::DeadLetter(letter) => format!(
                    "{}: gave up ({}) after {} attempt(s): {}",
                    short(&letter.job),
                    letter.reason,
                    letter.attempts,
                    letter.error
                ),
                _ => return,
            };
            say(format!("[{at:>4}ms] {line}"));
        }
    };
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(observer)
        .build();

    let calls = AtomicU32::new(0);
    let got = runtime.scope(flaky_fetch(&calls)).await;
    say(format!("flaky_fetch returned {got:?}"));

    let got = runtime.scope(missing_fetch()).await;
    say(format!("missing_fetch returned {got:?}"));

    for letter in letters.letters() {
        say(format!(
            "dead letter: {} ({}, {} attempt(s)): {}",
            short(&letter.job),
            letter.reason,
            letter.attempts,
            letter.error
        ));
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    run(Arc::new(|line| println!("{line}"))).await;
}
