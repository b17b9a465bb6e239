//! The circuit breaker: fail fast in front of a dependency that is down.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// The state of a [`CircuitBreaker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go through; failures are counted.
    Closed,
    /// Calls fail fast with [`Error::CircuitOpen`](crate::Error::CircuitOpen) until the cooldown ends.
    Open,
    /// The cooldown ended: a bounded number of probes go through; the rest fail fast.
    HalfOpen,
}

const CLOSED: u32 = 0;
const OPEN: u32 = 1;
const HALF_OPEN: u32 = 2;

/// A circuit breaker, usually a `static` shared by every job that calls one dependency.
///
/// It opens after `failures` consecutive transient failures, stays open for `cooldown`, then lets
/// one probe through: a good probe closes it, a bad one re-opens it.
///
/// ```
/// use jobguard::{BreakerState, CircuitBreaker};
/// use std::time::Duration;
///
/// static GATEWAY: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));
/// assert_eq!(GATEWAY.state(), BreakerState::Closed);
/// ```
#[derive(Debug)]
pub struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
    state: AtomicU32,
    consecutive: AtomicU32,
    probes: AtomicU32,
    /// When the breaker opened, in nanoseconds on the [`clock`].
    opened_at: AtomicU64,
}

impl CircuitBreaker {
    /// Opens after `failures` consecutive transient failures (at least 1), for `cooldown`.
    pub const fn new(failures: u32, cooldown: Duration) -> Self {
        CircuitBreaker {
            threshold: if failures == 0 { 1 } else { failures },
            cooldown,
            state: AtomicU32::new(CLOSED),
            consecutive: AtomicU32::new(0),
            probes: AtomicU32::new(0),
            opened_at: AtomicU64::new(0),
        }
    }

    /// The current state. An open breaker whose cooldown has ended reads half-open.
    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            CLOSED => BreakerState::Closed,
            OPEN if self.remaining(clock::now()).is_zero() => BreakerState::HalfOpen,
            OPEN => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    fn remaining(&self, now: u64) -> Duration {
        let opened = self.opened_at.load(Ordering::Acquire);
        let end = opened.saturating_add(self.cooldown.as_nanos().min(u64::MAX as u128) as u64);
        Duration::from_nanos(end.saturating_sub(now))
    }

    /// Asks to make one call. `Err(retry_in)` when the breaker is open, or half-open with its
    /// probe taken.
    pub(crate) fn acquire(&self) -> Result<Permit<'_>, Duration> {
        loop {
            match self.state.load(Ordering::Acquire) {
                CLOSED => return Ok(Permit { breaker: self, probe: false }),
                OPEN => {
                    let left = self.remaining(clock::now());
                    if !left.is_zero() {
                        return Err(left);
                    }
                    if self
                        .state
                        .compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                }
                _ => {}
            }
            // Half-open: one probe at a time.
            return match self.probes.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => Ok(Permit { breaker: self, probe: true }),
                Err(_) => Err(Duration::ZERO),
            };
        }
    }

    fn open(&self) {
        self.opened_at.store(clock::now(), Ordering::Release);
        self.state.store(OPEN, Ordering::Release);
    }
}

/// Permission to make one call through a breaker. Dropped without a verdict (a permanent failure,
/// or the call's future dropped), it gives its probe back and changes nothing.
#[must_use]
pub(crate) struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    probe: bool,
}

impl Permit<'_> {
    pub(crate) fn success(self) {
        let b = self.breaker;
        b.consecutive.store(0, Ordering::Release);
        if self.probe {
            b.state.store(CLOSED, Ordering::Release);
        }
    }

    pub(crate) fn failure(self) {
        let b = self.breaker;
        if self.probe {
            b.open();
            return;
        }
        let n = b.consecutive.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= b.threshold && b.state.load(Ordering::Acquire) == CLOSED {
            b.consecutive.store(0, Ordering::Release);
            b.open();
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.probes.store(0, Ordering::Release);
        }
    }
}

/// Monotonic nanoseconds from `tokio::time`, so a paused test clock drives the breaker.
pub(crate) mod clock {
    use std::sync::OnceLock;
    use tokio::time::Instant;

    static EPOCH: OnceLock<Instant> = OnceLock::new();

    pub(crate) fn now() -> u64 {
        let now = Instant::now();
        let epoch = *EPOCH.get_or_init(|| now);
        // Never 0, so that "opened at 0" cannot be mistaken for a real time.
        (now.saturating_duration_since(epoch).as_nanos() as u64).saturating_add(1)
    }
}
