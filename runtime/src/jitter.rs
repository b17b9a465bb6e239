//! Jitter: spreading retries so that a fleet of workers does not retry in lockstep.
//!
//! The four strategies are those of the AWS Architecture Blog's "Exponential Backoff And Jitter"
//! (Marc Brooker, 2015), applied to the capped exponential curve `min(cap, base * 2^(n-1))`.

use rand::Rng;
use std::time::Duration;

/// How a retry delay is randomised. Default [`Jitter::Full`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Jitter {
    /// No randomness: exactly the curve. Readable, and what tests and demos use; a fleet of
    /// workers retrying a shared dependency should not.
    None,
    /// Uniform in `[0, delay]`. The best spread of the four and the default.
    #[default]
    Full,
    /// `delay / 2` plus uniform in `[0, delay / 2]`: never shorter than half the curve.
    Equal,
    /// `min(cap, uniform in [base, previous * 3])`, starting from `previous = base`: always inside
    /// `[base, cap]`, each delay growing from the one before rather than from the attempt count.
    Decorrelated,
}

impl Jitter {
    /// The jittered delay for one retry. `curve` is the un-jittered delay for this retry
    /// ([`Policy::delay`](crate::Policy::delay)), `previous` the delay drawn for the retry before
    /// it (or `base` for the first).
    pub fn apply<R: Rng + ?Sized>(
        self,
        curve: Duration,
        previous: Duration,
        base: Duration,
        cap: Duration,
        rng: &mut R,
    ) -> Duration {
        match self {
            Jitter::None => curve,
            Jitter::Full => uniform(rng, Duration::ZERO, curve),
            Jitter::Equal => {
                let half = curve / 2;
                half + uniform(rng, Duration::ZERO, curve - half)
            }
            Jitter::Decorrelated => {
                let low = base.min(cap);
                let high = previous.max(low).saturating_mul(3).min(cap);
                uniform(rng, low, high.max(low))
            }
        }
    }

    /// Whether this strategy draws random numbers at all.
    pub const fn is_random(self) -> bool {
        !matches!(self, Jitter::None)
    }
}

/// Uniform in `[low, high]`, at nanosecond resolution.
fn uniform<R: Rng + ?Sized>(rng: &mut R, low: Duration, high: Duration) -> Duration {
    if high <= low {
        return low;
    }
    let span = (high - low).as_nanos().min(u64::MAX as u128) as u64;
    low + Duration::from_nanos(rng.random_range(0..=span))
}
