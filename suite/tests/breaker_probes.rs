//! Half-open probes: at most `probes` at once under concurrency, and a probe that is dropped or
//! fails permanently gives its slot back, so the breaker never sticks half-open; a probe through
//! `#[retry]` that fails, pends, is dropped, or returns an `Ok` that `on_ok` retries.

use jobguard::{BreakerState, CircuitBreaker, Event, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

const COOLDOWN: Duration = Duration::from_secs(30);

/// Tells `entered` it is running, then waits for a permit of `gate`.
#[jobguard::retry(attempts = 1, breaker = breaker)]
async fn held(
    breaker: &CircuitBreaker,
    entered: &mpsc::UnboundedSender<()>,
    gate: &Semaphore,
) -> Result<(), GatewayError> {
    entered.send(()).expect("the test listens");
    gate.acquire().await.expect("open gate").forget();
    Ok(())
}

#[jobguard::retry(attempts = 1, breaker = breaker)]
async fn outcome(breaker: &CircuitBreaker, ok: bool) -> Result<(), GatewayError> {
    if ok {
        Ok(())
    } else {
        Err(GatewayError::Declined)
    }
}

fn is_refused_with_no_wait(r: &Result<(), GatewayError>) -> bool {
    matches!(r, Err(GatewayError::Jobguard(jobguard::Error::CircuitOpen { retry_in })) if retry_in.is_zero())
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_probes_concurrent_calls_and_fails_the_rest_fast() {
    static BREAKER: CircuitBreaker = CircuitBreaker::new(1, COOLDOWN).probes(3);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let runtime = Runtime::builder()
        .observer(move |e: &Event<'_>| {
            if let Event::Breaker { from, to, .. } = e {
                sink.lock().unwrap().push((*from, *to));
            }
        })
        .build();
    runtime.scope(async { BREAKER.trip() }).await;
    tokio::time::advance(COOLDOWN).await;

    let gate = Arc::new(Semaphore::new(0));
    let (entered, mut probes) = mpsc::unbounded_channel();
    let mut calls = JoinSet::new();
    for _ in 0..10 {
        let (runtime, entered, gate) = (runtime.clone(), entered.clone(), gate.clone());
        calls.spawn(async move { runtime.scope(held(&BREAKER, &entered, &gate)).await });
    }
    // Seven calls come back at once, refused; three are inside their bodies, held at the gate.
    for _ in 0..7 {
        let refused = calls.join_next().await.unwrap().unwrap();
        assert!(is_refused_with_no_wait(&refused), "{refused:?}");
    }
    for _ in 0..3 {
        probes.recv().await.unwrap();
    }
    assert!(probes.try_recv().is_err(), "exactly three probes ran");
    assert_eq!(BREAKER.state(), BreakerState::HalfOpen);

    gate.add_permits(3);
    while let Some(done) = calls.join_next().await {
        done.unwrap().unwrap();
    }
    assert_eq!(BREAKER.state(), BreakerState::Closed);
    use BreakerState::*;
    assert_eq!(
        *seen.lock().unwrap(),
        [(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)],
        "the first good probe closes it; the other two are outcomes of a state already left"
    );
}

#[test]
fn under_real_threads_the_probe_limit_holds_in_every_round() {
    const THREADS: usize = 8;
    let breaker = CircuitBreaker::new(1, Duration::ZERO).probes(3);
    for round in 0..200 {
        breaker.trip(); // with no cooldown, the next acquire turns it half-open
        let admitted = AtomicU32::new(0);
        let all_asked = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let permit = breaker.acquire();
                    if permit.is_ok() {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    all_asked.wait(); // hold the permit until every thread has asked
                    drop(permit);
                });
            }
        });
        assert_eq!(admitted.load(Ordering::SeqCst), 3, "round {round}");
        assert_eq!(
            breaker.state(),
            BreakerState::HalfOpen,
            "dropped probes change nothing"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_whose_task_is_aborted_gives_its_slot_back() {
    static BREAKER: CircuitBreaker = CircuitBreaker::new(1, COOLDOWN);
    BREAKER.trip();
    tokio::time::advance(COOLDOWN).await;
    let gate = Arc::new(Semaphore::new(0));
    let (entered, mut probes) = mpsc::unbounded_channel();
    let probe = {
        let gate = gate.clone();
        tokio::spawn(async move { held(&BREAKER, &entered, &gate).await })
    };
    probes.recv().await.unwrap();
    assert!(
        is_refused_with_no_wait(&outcome(&BREAKER, true).await),
        "the slot is taken"
    );

    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    assert_eq!(BREAKER.state(), BreakerState::HalfOpen);
    outcome(&BREAKER, true)
        .await
        .expect("the slot came back: a new probe runs and succeeds");
    assert_eq!(BREAKER.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_dropped_by_a_timeout_around_the_call_gives_its_slot_back() {
    let breaker = CircuitBreaker::new(1, COOLDOWN);
    breaker.trip();
    tokio::time::advance(COOLDOWN).await;
    let gate = Semaphore::new(0);
    let (entered, _probes) = mpsc::unbounded_channel();
    let cut = tokio::time::timeout(Duration::from_secs(1), held(&breaker, &entered, &gate)).await;
    assert!(cut.is_err(), "the call was still waiting, and was dropped");
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    outcome(&breaker, true)
        .await
        .expect("a new probe is admitted");
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_fails_permanently_gives_its_slot_back_and_changes_nothing() {
    let breaker = CircuitBreaker::new(1, COOLDOWN);
    breaker.trip();
    tokio::time::advance(COOLDOWN).await;
    let err = outcome(&breaker, false).await.unwrap_err();
    assert!(matches!(err, GatewayError::Declined), "{err:?}");
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    outcome(&breaker, true)
        .await
        .expect("a new probe is admitted");
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_transient_probe_failure_reopens_it() {
    #[jobguard::retry(attempts = 1, breaker = breaker)]
    async fn times_out(breaker: &CircuitBreaker) -> Result<(), GatewayError> {
        Err(GatewayError::Timeout)
    }
    let breaker = CircuitBreaker::new(1, COOLDOWN);
    breaker.trip();
    tokio::time::advance(COOLDOWN).await;
    times_out(&breaker).await.unwrap_err();
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.retry_in(), COOLDOWN);
}

/// Probes through `#[retry]`: failing, pending, dropped, and an `Ok` that `on_ok` retries.
mod through_retry {

    use jobguard::{BreakerState, CircuitBreaker, Verdict};
    use jobguard_testkit::gateway::GatewayError;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    const COOLDOWN: Duration = Duration::from_secs(30);

    /// A breaker that has just turned half-open: its next call is a probe.
    async fn half_open(failures: u32) -> CircuitBreaker {
        let breaker = CircuitBreaker::new(failures, COOLDOWN);
        breaker.trip();
        tokio::time::advance(COOLDOWN).await;
        breaker
    }

    #[jobguard::retry(attempts = 3, base = "100ms", jitter = none, breaker = breaker)]
    async fn failing(breaker: &CircuitBreaker, calls: &AtomicU32) -> Result<(), GatewayError> {
        calls.fetch_add(1, Ordering::Relaxed);
        Err(GatewayError::Timeout)
    }

    #[jobguard::retry(attempts = 1, breaker = breaker)]
    async fn slow_ok(breaker: &CircuitBreaker, wait: Duration) -> Result<(), GatewayError> {
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// `true` for an `Ok` that `on_ok` should retry: the first answer of every call.
    fn first_answer(answer: &u32) -> Verdict {
        if *answer == 1 {
            Verdict::Retry
        } else {
            Verdict::Fail
        }
    }

    #[jobguard::retry(attempts = 3, base = "100ms", jitter = none, breaker = breaker, on_ok = first_answer)]
    async fn answers(breaker: &CircuitBreaker, calls: &AtomicU32) -> Result<u32, GatewayError> {
        Ok(calls.fetch_add(1, Ordering::Relaxed) + 1)
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_it_and_the_next_attempt_is_refused() {
        let breaker = half_open(1).await;
        let calls = AtomicU32::new(0);
        let err = failing(&breaker, &calls).await.unwrap_err();
        assert!(
            matches!(
                err,
                GatewayError::Jobguard(jobguard::Error::CircuitOpen { .. })
            ),
            "{err:?}"
        );
        assert_eq!(calls.load(Ordering::Relaxed), 1, "only the probe ran");
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_pending_at_its_first_poll_closes_it_when_it_succeeds() {
        let breaker = half_open(1).await;
        slow_ok(&breaker, Duration::from_secs(1)).await.unwrap();
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_probe_dropped_with_its_call_gives_its_slot_back() {
        let breaker = half_open(1).await;
        let cut = tokio::time::timeout(
            Duration::from_secs(1),
            slow_ok(&breaker, Duration::from_secs(60)),
        )
        .await;
        assert!(cut.is_err(), "the probe was still running, and was dropped");
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        slow_ok(&breaker, Duration::ZERO)
            .await
            .expect("the slot came back: a new probe runs");
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_s_ok_that_on_ok_retries_reopens_it() {
        let breaker = half_open(1).await;
        let calls = AtomicU32::new(0);
        let got = answers(&breaker, &calls).await;
        assert!(
            matches!(
                got,
                Err(GatewayError::Jobguard(jobguard::Error::CircuitOpen { .. }))
            ),
            "{got:?}"
        );
        assert_eq!(calls.load(Ordering::Relaxed), 1, "the retry was refused");
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_breaker_counts_a_retried_ok_once_and_the_success_clears_it() {
        let breaker = CircuitBreaker::new(2, COOLDOWN);
        let calls = AtomicU32::new(0);
        assert_eq!(answers(&breaker, &calls).await.unwrap(), 2);
        assert_eq!(breaker.state(), BreakerState::Closed);
        // The retried `Ok` counted one failure and the accepted one cleared it: one more failure
        // does not reach the threshold of two.
        let failures = AtomicU32::new(0);
        #[jobguard::retry(attempts = 1, breaker = breaker)]
        async fn once(breaker: &CircuitBreaker, calls: &AtomicU32) -> Result<(), GatewayError> {
            calls.fetch_add(1, Ordering::Relaxed);
            Err(GatewayError::Timeout)
        }
        once(&breaker, &failures).await.unwrap_err();
        assert_eq!(breaker.state(), BreakerState::Closed);
        once(&breaker, &failures).await.unwrap_err();
        assert_eq!(breaker.state(), BreakerState::Open);
    }
}
