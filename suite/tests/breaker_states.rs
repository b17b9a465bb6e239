//! The breaker's state machine, through its own API, under a paused clock: both ways to open,
//! the cooldown, probes, manual trip and reset, and the event raised on every transition.

use jobguard::{BreakerState, CircuitBreaker, Event, Runtime};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::advance;

use BreakerState::{Closed, HalfOpen, Open};

type Transitions = Arc<Mutex<Vec<(String, BreakerState, BreakerState)>>>;

/// A runtime whose observer records every breaker transition.
fn observed() -> (Runtime, Transitions) {
    let seen: Transitions = Arc::default();
    let sink = seen.clone();
    let runtime = Runtime::builder()
        .observer(move |e: &Event<'_>| {
            if let Event::Breaker { breaker, from, to } = e {
                sink.lock()
                    .unwrap()
                    .push(((*breaker).to_owned(), *from, *to));
            }
        })
        .build();
    (runtime, seen)
}

fn transitions(seen: &Transitions) -> Vec<(BreakerState, BreakerState)> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(_, from, to)| (*from, *to))
        .collect()
}

fn fail(b: &CircuitBreaker) {
    b.acquire().expect("admitted").failure();
}

fn succeed(b: &CircuitBreaker) {
    b.acquire().expect("admitted").success();
}

const SECS_10: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn opens_after_n_failures_in_a_row_and_a_success_resets_the_count() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::new(3, SECS_10);
            fail(&b);
            fail(&b);
            succeed(&b); // the run of failures is broken
            fail(&b);
            fail(&b);
            assert_eq!(b.state(), Closed);
            assert!(transitions(&seen).is_empty());
            fail(&b); // the third in a row
            assert_eq!(b.state(), Open);
            assert_eq!(transitions(&seen), [(Closed, Open)]);
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn open_fails_fast_with_the_time_left_then_turns_half_open_after_the_cooldown() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::new(1, SECS_10);
            fail(&b);
            assert_eq!(b.acquire().err().map(|open| open.retry_in), Some(SECS_10));
            advance(Duration::from_secs(4)).await;
            assert_eq!(
                b.acquire().err().map(|open| open.retry_in),
                Some(Duration::from_secs(6))
            );
            assert_eq!(b.retry_in(), Duration::from_secs(6));
            advance(Duration::from_secs(6) - Duration::from_nanos(1)).await;
            assert_eq!(
                b.acquire().err().map(|open| open.retry_in),
                Some(Duration::from_nanos(1))
            );
            assert_eq!(b.state(), Open);
            advance(Duration::from_nanos(1)).await;
            let probe = b
                .acquire()
                .expect("the cooldown is over: a probe goes through");
            assert!(probe.is_probe());
            assert_eq!(b.state(), HalfOpen);
            assert_eq!(
                b.acquire().err().map(|open| open.retry_in),
                Some(Duration::ZERO),
                "the one probe slot is taken"
            );
            assert_eq!(transitions(&seen), [(Closed, Open), (Open, HalfOpen)]);
            drop(probe);
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn reading_the_state_after_the_cooldown_turns_it_half_open_with_its_event() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::new(1, SECS_10);
            fail(&b);
            advance(SECS_10).await;
            assert_eq!(b.state(), HalfOpen);
            assert_eq!(b.state(), HalfOpen);
            assert_eq!(transitions(&seen), [(Closed, Open), (Open, HalfOpen)]);
            assert!(b.acquire().expect("a probe slot is free").is_probe());
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_good_probe_closes_it_with_the_failure_count_cleared() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::new(2, SECS_10);
            fail(&b);
            fail(&b);
            advance(SECS_10).await;
            succeed(&b); // the probe
            assert_eq!(b.state(), Closed);
            fail(&b); // one failure after closing is not two
            assert_eq!(b.state(), Closed);
            let permit = b.acquire().expect("closed");
            assert!(!permit.is_probe());
            permit.failure();
            assert_eq!(b.state(), Open);
            assert_eq!(
                transitions(&seen),
                [
                    (Closed, Open),
                    (Open, HalfOpen),
                    (HalfOpen, Closed),
                    (Closed, Open)
                ]
            );
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_bad_probe_reopens_it_for_a_fresh_cooldown() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::new(1, SECS_10);
            fail(&b);
            advance(Duration::from_secs(25)).await; // long past the first cooldown
            fail(&b); // the probe
            assert_eq!(b.state(), Open);
            assert_eq!(
                b.acquire().err().map(|open| open.retry_in),
                Some(SECS_10),
                "a fresh cooldown from the bad probe"
            );
            assert_eq!(
                transitions(&seen),
                [(Closed, Open), (Open, HalfOpen), (HalfOpen, Open)]
            );
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_permit_dropped_without_an_outcome_neither_counts_nor_resets() {
    let b = CircuitBreaker::new(2, SECS_10);
    fail(&b);
    drop(b.acquire().expect("closed")); // a permanent failure: neutral
    drop(b.acquire().expect("closed"));
    assert_eq!(b.state(), Closed, "a dropped permit is not a failure");
    fail(&b);
    assert_eq!(b.state(), Open, "nor did it reset the run of failures");
}

#[tokio::test(start_paused = true)]
async fn an_outcome_counts_only_toward_the_state_it_was_admitted_in() {
    let b = CircuitBreaker::new(1, SECS_10);
    let slow_failure = b.acquire().expect("closed");
    let slow_success = b.acquire().expect("closed");
    fail(&b);
    advance(SECS_10).await;
    succeed(&b); // the probe closes it
    assert_eq!(b.state(), Closed);
    slow_failure.failure(); // admitted before the breaker opened: stale
    assert_eq!(b.state(), Closed);
    slow_success.success();
    assert_eq!(b.state(), Closed);
    fail(&b);
    assert_eq!(b.state(), Open, "a failure admitted now counts");
}

#[tokio::test(start_paused = true)]
async fn failure_rate_opens_when_the_share_of_failures_in_the_window_reaches_the_ratio() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::failure_rate(0.5, 4, SECS_10);
            succeed(&b);
            succeed(&b);
            succeed(&b);
            fail(&b); // 1 of 4
            assert_eq!(b.state(), Closed);
            fail(&b); // window: S S F F, 2 of 4
            assert_eq!(b.state(), Open);
            assert_eq!(b.acquire().err().map(|open| open.retry_in), Some(SECS_10));
            assert_eq!(transitions(&seen), [(Closed, Open)]);
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn failure_rate_old_calls_slide_out_of_the_window() {
    let b = CircuitBreaker::failure_rate(0.5, 4, SECS_10);
    succeed(&b);
    fail(&b);
    succeed(&b); // S F S: the window is not full yet, so it cannot open
    for _ in 0..4 {
        succeed(&b); // the failure slides out
    }
    fail(&b); // S S S F: 1 of 4
    assert_eq!(b.state(), Closed);
    succeed(&b);
    fail(&b); // S F S F: 2 of 4
    assert_eq!(b.state(), Open);
}

#[tokio::test(start_paused = true)]
async fn failure_rate_does_not_open_below_the_minimum_throughput() {
    let b = CircuitBreaker::failure_rate(0.5, 10, SECS_10).min_calls(5);
    for _ in 0..4 {
        fail(&b);
    }
    assert_eq!(
        b.state(),
        Closed,
        "4 of 4 failed, but 4 calls are below the minimum of 5"
    );
    fail(&b);
    assert_eq!(b.state(), Open);

    let whole = CircuitBreaker::failure_rate(0.1, 6, SECS_10);
    for _ in 0..5 {
        fail(&whole);
    }
    assert_eq!(
        whole.state(),
        Closed,
        "the default minimum is the whole window"
    );
    fail(&whole);
    assert_eq!(whole.state(), Open);
}

#[tokio::test(start_paused = true)]
async fn failure_rate_probes_close_it_with_an_empty_window_or_reopen_it() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::failure_rate(0.5, 8, SECS_10).min_calls(4);
            for _ in 0..4 {
                fail(&b);
            }
            assert_eq!(b.state(), Open);
            advance(SECS_10).await;
            fail(&b); // a bad probe
            assert_eq!(b.acquire().err().map(|open| open.retry_in), Some(SECS_10));
            advance(SECS_10).await;
            succeed(&b); // a good probe
            assert_eq!(b.state(), Closed);
            for _ in 0..3 {
                fail(&b);
            }
            assert_eq!(
                b.state(),
                Closed,
                "the window emptied on closing: 3 calls < 4"
            );
            fail(&b);
            assert_eq!(b.state(), Open);
            assert_eq!(
                transitions(&seen),
                [
                    (Closed, Open),
                    (Open, HalfOpen),
                    (HalfOpen, Open),
                    (Open, HalfOpen),
                    (HalfOpen, Closed),
                    (Closed, Open)
                ]
            );
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn manual_trip_and_reset_from_every_state() {
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            let b = CircuitBreaker::new(5, SECS_10);
            b.reset(); // closed already: no transition
            b.trip();
            assert_eq!(b.state(), Open);
            assert_eq!(b.acquire().err().map(|open| open.retry_in), Some(SECS_10));
            advance(Duration::from_secs(4)).await;
            b.trip(); // open already: the cooldown starts again, no transition
            assert_eq!(b.retry_in(), SECS_10);
            b.reset();
            assert_eq!(b.state(), Closed);
            assert!(!b.acquire().expect("closed").is_probe());
            b.trip();
            advance(SECS_10).await;
            assert_eq!(b.state(), HalfOpen);
            b.trip(); // from half-open
            assert_eq!(b.retry_in(), SECS_10);
            advance(SECS_10).await;
            let probe = b.acquire().expect("a probe");
            b.reset(); // from half-open, with the probe in flight
            probe.failure(); // stale: the reset ended the half-open state it was admitted in
            assert_eq!(b.state(), Closed);
            assert_eq!(
                transitions(&seen),
                [
                    (Closed, Open),
                    (Open, Closed),
                    (Closed, Open),
                    (Open, HalfOpen),
                    (HalfOpen, Open),
                    (Open, HalfOpen),
                    (HalfOpen, Closed)
                ]
            );
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn reset_clears_the_failure_count() {
    let b = CircuitBreaker::new(2, SECS_10);
    fail(&b);
    b.reset();
    fail(&b);
    assert_eq!(b.state(), Closed);
}

#[tokio::test(start_paused = true)]
async fn events_carry_the_breaker_name() {
    static GATEWAY: CircuitBreaker = CircuitBreaker::new(1, SECS_10).named("gateway");
    let (runtime, seen) = observed();
    runtime
        .scope(async {
            assert_eq!(GATEWAY.name(), "gateway");
            fail(&GATEWAY);
            advance(SECS_10).await;
            succeed(&GATEWAY);
        })
        .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|(name, _, _)| name == "gateway"),
        "{seen:?}"
    );
    assert_eq!(CircuitBreaker::new(1, SECS_10).name(), "unnamed");
}

#[test]
fn as_str_labels_each_state() {
    assert_eq!(
        [
            Closed.as_str(),
            Open.as_str(),
            HalfOpen.to_string().as_str()
        ],
        ["closed", "open", "half_open"]
    );
}
