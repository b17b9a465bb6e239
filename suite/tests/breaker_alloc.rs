//! A counting global allocator shows that asking a breaker and recording a success allocates
//! nothing, alone and inside a `#[retry(breaker = ...)]` call, and that a full
//! open → half-open → closed cycle allocates nothing either.

use jobguard::{BreakerState, CircuitBreaker};
use jobguard_testkit::alloc::{self, Counting};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Counts allocations made on the current thread, so other test threads do not interfere.
#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    alloc::during(f).0
}

/// Polls a future that completes without waiting, with no executor (whose own bookkeeping would
/// be counted).
fn ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the call was expected to complete at once"),
    }
}

static CONSECUTIVE: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));
static RATE: CircuitBreaker = CircuitBreaker::failure_rate(0.5, 20, Duration::from_secs(30));
static CYCLED: CircuitBreaker = CircuitBreaker::new(1, Duration::ZERO).named("cycled");
static GATEWAY: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));

#[jobguard::retry(attempts = 5, breaker = GATEWAY)]
async fn capture(amount: u64) -> Result<u64, std::io::Error> {
    Ok(amount)
}

fn check_and_record(breaker: &CircuitBreaker) {
    match breaker.acquire() {
        Ok(permit) => permit.success(),
        Err(_) => panic!("closed"),
    }
}

#[test]
fn the_success_path_allocates_nothing() {
    // One warm-up each, so that lazily built process state (the embedded runtime, the clock's
    // epoch, thread-locals) is not counted as the breaker's.
    for breaker in [&CONSECUTIVE, &RATE] {
        check_and_record(breaker);
        let n = allocations_during(|| {
            for _ in 0..10_000 {
                check_and_record(breaker);
            }
        });
        assert_eq!(n, 0, "check + record on a closed breaker allocated");
    }

    assert_eq!(ready(capture(7)).unwrap(), 7);
    let n = allocations_during(|| {
        for i in 0..1_000 {
            assert_eq!(ready(capture(i)).unwrap(), i);
        }
    });
    assert_eq!(
        n, 0,
        "a #[retry(breaker = ...)] call that succeeds first time allocated"
    );
    assert_eq!(GATEWAY.state(), BreakerState::Closed);

    let cycle = || {
        CYCLED.acquire().expect("closed").failure(); // closed -> open
        let probe = CYCLED.acquire().expect("no cooldown: open -> half-open");
        assert!(probe.is_probe());
        probe.success(); // half-open -> closed
    };
    cycle();
    let n = allocations_during(|| {
        for _ in 0..100 {
            cycle();
        }
    });
    assert_eq!(
        n, 0,
        "transitions (and their events to the runtime's observer) allocated"
    );
}
