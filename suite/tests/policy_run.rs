//! `Policy::run`: the loop behind `#[retry]` for closures, under a paused clock. The same
//! delays, verdicts, timeout, budget, dead letters and events as the attribute.

use jobguard::{Event, GiveUp, Jitter, MemoryDeadLetters, Policy, Runtime, Transient};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, PartialEq, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(after = wait)]
    Limited {
        wait: Duration,
    },
    Declined,
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Jobguard(e) => write!(f, "{e}"),
            other => write!(f, "{other:?}"),
        }
    }
}

const POLICY: Policy = Policy::new()
    .attempts(5)
    .base(Duration::from_millis(500))
    .cap(Duration::from_secs(8))
    .jitter(Jitter::None);

/// A runtime that records each retry delay and keeps dead letters.
fn recording() -> (Runtime, Arc<Mutex<Vec<Duration>>>, MemoryDeadLetters) {
    let delays = Arc::new(Mutex::new(Vec::new()));
    let letters = MemoryDeadLetters::new();
    let seen = delays.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |e: &Event<'_>| {
            if let Event::Retry { delay, .. } = e {
                seen.lock().unwrap().push(*delay);
            }
        })
        .build();
    (runtime, delays, letters)
}

#[tokio::test(start_paused = true)]
async fn recovers_with_the_exact_curve_and_passes_the_attempt_number() {
    let (runtime, delays, letters) = recording();
    let start = Instant::now();
    let mut seen = Vec::new();
    let got = runtime
        .scope(POLICY.run("fetch", async |attempt| {
            seen.push(attempt);
            if attempt < 4 {
                Err(GatewayError::Timeout)
            } else {
                Ok(attempt * 10)
            }
        }))
        .await;
    assert_eq!(got, Ok(40));
    assert_eq!(seen, [1, 2, 3, 4]);
    assert_eq!(
        *delays.lock().unwrap(),
        [500, 1000, 2000].map(Duration::from_millis)
    );
    assert_eq!(start.elapsed(), Duration::from_millis(3500));
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn exhausts_and_sends_one_dead_letter_named_after_the_job() {
    let (runtime, delays, letters) = recording();
    let start = Instant::now();
    let got: Result<(), _> = runtime
        .scope(
            POLICY
                .attempts(3)
                .run("payments.capture", async |_| Err(GatewayError::Timeout)),
        )
        .await;
    assert_eq!(got, Err(GatewayError::Timeout));
    assert_eq!(delays.lock().unwrap().len(), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.job, "payments.capture");
    assert_eq!(letter.key, None);
    assert_eq!((letter.reason, letter.attempts), (GiveUp::Exhausted, 3));
    assert_eq!(letter.error, "Timeout");
    assert!(letter.first_attempt <= letter.last_attempt);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_fails_fast() {
    let (runtime, delays, letters) = recording();
    let start = Instant::now();
    let mut calls = 0;
    let got: Result<(), _> = runtime
        .scope(POLICY.run("charge", async |_| {
            calls += 1;
            Err(GatewayError::Declined)
        }))
        .await;
    assert_eq!(got, Err(GatewayError::Declined));
    assert_eq!(calls, 1);
    assert!(delays.lock().unwrap().is_empty());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(letters.letters()[0].reason, GiveUp::Permanent);
}

#[tokio::test(start_paused = true)]
async fn retry_after_waits_exactly_that_long() {
    let (runtime, delays, _) = recording();
    let start = Instant::now();
    let wait = Duration::from_millis(2_750);
    let got = runtime
        .scope(POLICY.jitter(Jitter::Full).run("limited", async |attempt| {
            if attempt == 1 {
                Err(GatewayError::Limited { wait })
            } else {
                Ok(attempt)
            }
        }))
        .await;
    assert_eq!(got, Ok(2));
    assert_eq!(*delays.lock().unwrap(), [wait]);
    assert_eq!(start.elapsed(), wait);
}

#[tokio::test(start_paused = true)]
async fn timeout_cuts_an_attempt_which_is_retried() {
    let (runtime, delays, _) = recording();
    let start = Instant::now();
    let got = runtime
        .scope(
            POLICY
                .timeout(Duration::from_secs(2))
                .run("hangs once", async |attempt| {
                    if attempt == 1 {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, GatewayError>(attempt)
                }),
        )
        .await;
    assert_eq!(got, Ok(2));
    assert_eq!(*delays.lock().unwrap(), [Duration::from_millis(500)]);
    assert_eq!(start.elapsed(), Duration::from_millis(2500));
}

#[tokio::test(start_paused = true)]
async fn budget_gives_up_at_once_when_the_next_attempt_could_not_start_inside_it() {
    let (runtime, _, letters) = recording();
    let start = Instant::now();
    let mut calls = 0;
    let got: Result<(), _> = runtime
        .scope(
            POLICY
                .attempts(10)
                .budget(Duration::from_secs(2))
                .run("down", async |_| {
                    calls += 1;
                    Err(GatewayError::Timeout)
                }),
        )
        .await;
    // Attempts at 0ms, 500ms and 1500ms; the fourth would start at 3500ms, past the 2s budget:
    // give up at 1500ms rather than sleep.
    assert_eq!(got, Err(GatewayError::Timeout));
    assert_eq!(calls, 3);
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    let letters = letters.letters();
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Budget, 3)
    );
}

#[tokio::test(start_paused = true)]
async fn budget_cuts_an_attempt_still_running_at_its_end() {
    let (runtime, _, letters) = recording();
    let start = Instant::now();
    let got: Result<(), _> = runtime
        .scope(
            POLICY
                .budget(Duration::from_secs(3))
                .run("slow", async |_| std::future::pending().await),
        )
        .await;
    assert_eq!(got, Err(GatewayError::Jobguard(jobguard::Error::Budget)));
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert_eq!(letters.letters()[0].reason, GiveUp::Budget);
}

#[tokio::test(start_paused = true)]
async fn io_errors_are_classified_by_kind() {
    let (runtime, delays, letters) = recording();
    let got: std::io::Result<()> = runtime
        .scope(POLICY.run("io", async |attempt| match attempt {
            1 => Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            2 => Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }))
        .await;
    assert_eq!(got.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    assert_eq!(delays.lock().unwrap().len(), 2);
    let letters = letters.letters();
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Permanent, 3)
    );
}

#[tokio::test(start_paused = true)]
async fn the_observer_sees_each_attempt_and_the_verdict() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let runtime = Runtime::builder()
        .dead_letters(MemoryDeadLetters::new())
        .observer(move |e: &Event<'_>| {
            let line = match e {
                Event::Attempt { job, attempt, .. } => format!("{job} attempt {attempt}"),
                Event::Retry { verdict, delay, .. } => format!("{verdict:?} in {delay:?}"),
                Event::Succeeded { job, attempts, .. } => format!("{job} ok after {attempts}"),
                _ => return,
            };
            seen.lock().unwrap().push(line);
        })
        .build();
    let got = runtime
        .scope(POLICY.run("job", async |attempt| {
            if attempt == 1 {
                Err(GatewayError::Timeout)
            } else {
                Ok(())
            }
        }))
        .await;
    assert_eq!(got, Ok(()));
    assert_eq!(
        *events.lock().unwrap(),
        [
            "job attempt 1",
            "Retry in 500ms",
            "job attempt 2",
            "job ok after 2"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn limits_too_far_out_to_represent_are_no_limits_and_never_panic() {
    let (runtime, delays, letters) = recording();
    let start = Instant::now();
    let policy = POLICY.timeout(Duration::MAX).budget(Duration::MAX);
    let got = runtime
        .scope(policy.run("far", async |attempt| {
            if attempt == 1 {
                Err(GatewayError::Timeout)
            } else {
                Ok(attempt)
            }
        }))
        .await;
    assert_eq!(got, Ok(2));
    assert_eq!(*delays.lock().unwrap(), [Duration::from_millis(500)]);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert!(letters.is_empty());
}

/// The closure is called once per attempt, also when it does work before its `async` part.
mod closure_calls {

    use jobguard::{Jitter, Policy};
    use jobguard_testkit::gateway::GatewayError;
    use std::time::Duration;

    const POLICY: Policy = Policy::new()
        .attempts(5)
        .base(Duration::from_millis(500))
        .cap(Duration::from_secs(8))
        .jitter(Jitter::None);

    /// With nobody watching, a call starts with its first attempt alone, as `#[retry]` does; a
    /// closure that does work before its `async` part still does it once per attempt.
    #[tokio::test(start_paused = true)]
    async fn a_call_nobody_watches_calls_its_closure_once_per_attempt() {
        let calls = std::cell::Cell::new(0u32);
        let eager = |attempt: u32| {
            calls.set(calls.get() + 1);
            async move {
                assert_eq!(jobguard::attempt().map(|a| a.number), Some(attempt));
                if attempt < 3 {
                    Err(GatewayError::Timeout)
                } else {
                    Ok(attempt)
                }
            }
        };
        assert_eq!(POLICY.run("eager", eager).await, Ok(3));
        assert_eq!(calls.get(), 3);

        calls.set(0);
        let declined = |_: u32| {
            calls.set(calls.get() + 1);
            async { Err::<u32, _>(GatewayError::Declined) }
        };
        assert_eq!(
            POLICY.run("declined", declined).await,
            Err(GatewayError::Declined)
        );
        assert_eq!(calls.get(), 1, "a permanent failure is not tried again");

        calls.set(0);
        let at_once = |attempt: u32| {
            calls.set(calls.get() + 1);
            async move { Ok::<u32, GatewayError>(attempt) }
        };
        assert_eq!(POLICY.run("at_once", at_once).await, Ok(1));
        assert_eq!(calls.get(), 1);
    }
}
