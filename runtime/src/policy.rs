//! The retry policy: how many attempts, on what curve, within what limits.

use crate::Jitter;
use std::time::Duration;

/// A retry policy: attempts, the capped exponential curve, jitter, and the per-attempt `timeout`
/// and total `budget`. Each setter has a getter of the same name with `get_` before it.
///
/// Built in `const` context, so a policy can live in a `const` or `static`:
///
/// ```
/// use jobguard::{Jitter, Policy};
/// use std::time::Duration;
///
/// const GATEWAY: Policy = Policy::new()
///     .attempts(5)
///     .base(Duration::from_millis(500))
///     .cap(Duration::from_secs(8))
///     .jitter(Jitter::None);
///
/// assert_eq!(GATEWAY.delay(1), Duration::from_millis(500));
/// assert_eq!(GATEWAY.delay(4), Duration::from_secs(4));
/// assert_eq!(GATEWAY.delay(9), Duration::from_secs(8)); // capped
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    pub(crate) attempts: u32,
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    pub(crate) jitter: Jitter,
    pub(crate) budget: Option<Duration>,
    pub(crate) timeout: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Self::new()
    }
}

impl Policy {
    /// The defaults: 5 attempts, base 500ms, cap 8s, full jitter, no timeout, no budget.
    pub const fn new() -> Self {
        Policy {
            attempts: 5,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(8),
            jitter: Jitter::Full,
            budget: None,
            timeout: None,
        }
    }

    /// Total attempts, the first included. `0` is taken as `1`: the job always runs once.
    pub const fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = if attempts == 0 { 1 } else { attempts };
        self
    }

    /// The delay before the first retry; each later one doubles it, up to `cap`.
    pub const fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The longest delay before jitter.
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// How delays are randomised.
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Total time for the job, measured from the start of the first attempt. No attempt starts
    /// that could not start inside it (the loop gives up at once rather than sleep past it), and
    /// an attempt still running when it runs out is cut and fails with
    /// [`Error::Budget`](crate::Error::Budget).
    pub const fn budget(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The longest one attempt may run; a cut attempt fails with
    /// [`Error::Timeout`](crate::Error::Timeout), which is transient.
    pub const fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// What [`attempts`](Self::attempts) set: total attempts, the first included.
    pub const fn get_attempts(&self) -> u32 {
        self.attempts
    }

    /// What [`base`](Self::base) set: the delay before the first retry.
    pub const fn get_base(&self) -> Duration {
        self.base
    }

    /// What [`cap`](Self::cap) set: the longest delay before jitter.
    pub const fn get_cap(&self) -> Duration {
        self.cap
    }

    /// What [`jitter`](Self::jitter) set.
    pub const fn get_jitter(&self) -> Jitter {
        self.jitter
    }

    /// What [`budget`](Self::budget) set, if anything.
    pub const fn get_budget(&self) -> Option<Duration> {
        self.budget
    }

    /// What [`timeout`](Self::timeout) set, if anything.
    pub const fn get_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The delay before retry `retry` (counting from 1) before jitter:
    /// `min(cap, base * 2^(retry - 1))`, saturating rather than overflowing.
    pub const fn delay(&self, retry: u32) -> Duration {
        let shift = retry.saturating_sub(1);
        let grown = if shift >= 32 {
            Duration::MAX
        } else {
            self.base.saturating_mul(1u32 << shift)
        };
        if grown.as_nanos() < self.cap.as_nanos() {
            grown
        } else {
            self.cap
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curve_doubles_and_caps() {
        let p = Policy::new();
        let ms = |n| p.delay(n).as_millis();
        assert_eq!(
            [ms(1), ms(2), ms(3), ms(4), ms(5), ms(6)],
            [500, 1000, 2000, 4000, 8000, 8000]
        );
        assert_eq!(p.delay(0), Duration::from_millis(500));
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(8));
        let huge = Policy::new().base(Duration::MAX).cap(Duration::MAX);
        assert_eq!(huge.delay(40), Duration::MAX);
    }

    #[test]
    fn zero_attempts_is_one() {
        assert_eq!(Policy::new().attempts(0).get_attempts(), 1);
    }
}
