//! Half-open probes: at most `probes` at once under concurrency, and a probe that is dropped or
//! fails permanently gives its slot back, so the breaker never sticks half-open. This file builds
//! an observer, so its calls leave the inline path; `tests/breaker_inline.rs` runs probes on it.

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
