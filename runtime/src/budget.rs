//! The retry budget: retries as a bounded share of the calls, so that a dependency that is down
//! does not get a retry storm on top of its normal load.
//!
//! A [`RetryBudget`] works as tower's `TpsBudget` does: every call deposits, every retry
//! withdraws, and deposits expire after the budget's `window`. Over any window, the retries stay
//! within `retry_ratio` of the calls made in it, plus a floor of `min_per_sec` retries a second
//! for a quiet service that makes too few calls to earn any.
//!
//! With `#[retry(retry_budget = BUDGET)]` a failed attempt that the policy would retry asks the
//! budget first; an empty budget ends the call there, without the retry, and the job gives up as
//! [`GiveUp::RetryBudget`](crate::GiveUp::RetryBudget) (its dead letter says so). The first
//! attempt of a call always runs: only retries are budgeted.
//!
//! # How it keeps count
//!
//! The window is cut into ten slots. Each slot is one atomic word holding the slot's number on
//! [`tokio::time`]'s clock and its balance (deposits minus withdrawals, in thousandths of a
//! retry), so a deposit is one clock reading and one compare-and-swap on that word, and a word
//! whose number is older than the window counts for nothing: no lock, no allocation, no
//! background task, usable in a `static`. A withdrawal adds up the ten slots. Two withdrawals at
//! the same instant can both see the last token, as in tower: the bound is exact to within the
//! retries that race for it.
//!
//! A budget [`share`](RetryBudget::share)d through Redis (feature `redis`) keeps its slots on the
//! server for the whole fleet; see [`crate::fleet`].

use crate::breaker::clock;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The number of slots a window is cut into.
pub(crate) const SLOTS: u64 = 10;

/// What a withdrawal costs, in the thousandths of a retry the balance is kept in.
pub(crate) const WITHDRAWAL: i64 = 1000;

/// The shortest and the longest window (as tower's `TpsBudget`): a shorter or longer one is
/// clamped to these.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// See [`MIN_WINDOW`].
pub const MAX_WINDOW: Duration = Duration::from_secs(60);

/// The largest `retry_ratio` (as tower's `TpsBudget`): a larger one is clamped to this.
pub const MAX_RATIO: f32 = 1000.0;

/// A budget of retries, usually a `static` shared by every job that calls one dependency.
///
/// `RetryBudget::new(retry_ratio, min_per_sec, window)`:
///
/// - `retry_ratio`: retries allowed per call, `0.1` for one retry per ten calls; clamped into
///   `0..=`[`MAX_RATIO`] (NaN reads as 0). Each call deposits `retry_ratio` of a retry.
/// - `min_per_sec`: retries a second allowed whatever the calls, so that a quiet service can
///   still retry: `min_per_sec × window` retries are always in the budget.
/// - `window`: how long a deposit counts; clamped into [`MIN_WINDOW`]`..=`[`MAX_WINDOW`].
///
/// # Examples
///
/// A budget of one retry per ten calls, plus one a second, over ten seconds, in front of a
/// payment gateway (this example needs the default `macros` feature):
///
#[cfg_attr(feature = "macros", doc = "```")]
#[cfg_attr(not(feature = "macros"), doc = "```ignore")]
/// use jobguard::RetryBudget;
/// use std::time::Duration;
///
/// static GATEWAY_RETRIES: RetryBudget = RetryBudget::new(0.1, 1, Duration::from_secs(10));
///
/// #[jobguard::retry(attempts = 3, base = "100ms", retry_budget = GATEWAY_RETRIES)]
/// async fn capture(order_id: &str) -> Result<u64, std::io::Error> {
///     # let _ = order_id;
///     Ok(100)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// assert_eq!(capture("order-A").await.unwrap(), 100);
/// # }
/// ```
///
/// Without the attribute, ask it yourself: [`deposit`](Self::deposit) once per call,
/// [`try_withdraw`](Self::try_withdraw) before each retry.
///
/// ```
/// use jobguard::RetryBudget;
/// use std::time::Duration;
///
/// // No floor: only calls earn retries.
/// static BUDGET: RetryBudget = RetryBudget::new(0.5, 0, Duration::from_secs(1));
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// assert!(!BUDGET.try_withdraw(), "no call made yet");
/// BUDGET.deposit();
/// BUDGET.deposit();
/// assert!(BUDGET.try_withdraw(), "two calls at 0.5 earn one retry");
/// assert!(!BUDGET.try_withdraw());
/// # }
/// ```
pub struct RetryBudget {
    /// What one call deposits, in thousandths of a retry.
    deposit: i64,
    /// What is always in the budget, in thousandths of a retry: `min_per_sec × window`.
    reserve: i64,
    /// The window and each slot's length, in nanoseconds on [`clock`].
    window: Duration,
    slot: u64,
    /// The slots: each `[slot number: 32 bits][balance: i32]`, the slot number on [`clock`].
    slots: [AtomicU64; SLOTS as usize],
    /// The fleet's budget once [`share`](Self::share)d: see [`crate::fleet`].
    pub(crate) link: OnceLock<std::sync::Arc<dyn Link>>,
}

/// What a shared budget asks of the fleet, implemented by [`crate::fleet`] (feature `redis`), so
/// that this module does not depend on it.
pub(crate) trait Link: Send + Sync {
    /// Whether the fleet's budget is in use: `false` while Redis is out of reach, when the
    /// budget is the process's own.
    fn attached(&self) -> bool;
    /// Asks the fleet for one retry, handing it this process's deposits so far; resolves to
    /// whether the retry may go ahead. Out of reach, it falls back to the local budget.
    fn withdraw(self: std::sync::Arc<Self>) -> Asking;
}

/// A shared budget's answer on its way: whether the retry may go ahead.
pub(crate) type Asking = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// The budget's answer to a retry, as the retry engine asks it.
pub(crate) enum Withdrawal {
    /// The retry may go ahead.
    Granted,
    /// The budget is empty: no retry.
    Refused,
    /// A shared budget: the fleet answers after one round trip.
    Asking(Asking),
}

impl std::fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryBudget")
            .field("retry_ratio", &(self.deposit as f64 / WITHDRAWAL as f64))
            .field("window", &self.window)
            .field("balance", &self.balance())
            .field("shared", &self.link.get().is_some())
            .finish()
    }
}

const fn pack(slot: u32, balance: i32) -> u64 {
    ((slot as u64) << 32) | (balance as u32 as u64)
}

const fn unpack(word: u64) -> (u32, i32) {
    ((word >> 32) as u32, word as u32 as i32)
}

impl RetryBudget {
    /// A budget of `retry_ratio` retries per call plus `min_per_sec` retries a second, each
    /// deposit counting for `window`. Usable in a `static`; out-of-range values are clamped (see
    /// the [type's docs](Self)).
    ///
    /// ```
    /// use jobguard::RetryBudget;
    /// use std::time::Duration;
    ///
    /// static SEARCH_RETRIES: RetryBudget = RetryBudget::new(0.2, 10, Duration::from_secs(10));
    /// assert_eq!(SEARCH_RETRIES.window(), Duration::from_secs(10));
    /// ```
    pub const fn new(retry_ratio: f32, min_per_sec: u32, window: Duration) -> Self {
        let ratio = if retry_ratio.is_nan() || retry_ratio <= 0.0 {
            0.0
        } else if retry_ratio > MAX_RATIO {
            MAX_RATIO
        } else {
            retry_ratio
        };
        let window = if window.as_nanos() < MIN_WINDOW.as_nanos() {
            MIN_WINDOW
        } else if window.as_nanos() > MAX_WINDOW.as_nanos() {
            MAX_WINDOW
        } else {
            window
        };
        let millis = window.as_millis() as i64;
        RetryBudget {
            deposit: (ratio as f64 * WITHDRAWAL as f64 + 0.5) as i64,
            reserve: min_per_sec as i64 * millis,
            window,
            slot: window.as_nanos() as u64 / SLOTS,
            slots: [const { AtomicU64::new(0) }; SLOTS as usize],
            link: OnceLock::new(),
        }
    }

    /// How long a deposit counts.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// One slot's length: a tenth of the window.
    #[cfg(feature = "redis")]
    pub(crate) const fn slot(&self) -> Duration {
        Duration::from_nanos(self.slot)
    }

    /// The retries one call earns (`retry_ratio`, to a thousandth).
    pub fn retry_ratio(&self) -> f32 {
        self.deposit as f32 / WITHDRAWAL as f32
    }

    /// Records one call: it earns `retry_ratio` of a retry for `window`. `#[retry]` deposits
    /// once per call, before its first attempt. A clock reading and one compare-and-swap; a
    /// budget with a ratio of 0 does nothing here.
    pub fn deposit(&self) {
        if self.deposit > 0 {
            self.add(self.now(), self.deposit);
        }
    }

    /// Takes one retry from this process's budget: `true` when the budget held one (and it is
    /// spent now), `false` when it is empty. A [`share`](Self::share)d budget asks the fleet
    /// instead when `#[retry]` asks it; this method always reads the local slots, which then
    /// hold only the deposits not yet handed to the fleet.
    pub fn try_withdraw(&self) -> bool {
        let now = self.now();
        if self.sum(now) + self.reserve < WITHDRAWAL {
            return false;
        }
        self.add(now, -WITHDRAWAL);
        true
    }

    /// The retries this process's budget holds now, the floor included (fractions dropped).
    ///
    /// ```
    /// use jobguard::RetryBudget;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let budget = RetryBudget::new(0.1, 2, Duration::from_secs(5));
    /// assert_eq!(budget.balance(), 10, "the floor: 2 a second over 5 seconds");
    /// for _ in 0..20 {
    ///     budget.deposit();
    /// }
    /// assert_eq!(budget.balance(), 12);
    /// tokio::time::advance(Duration::from_secs(6)).await;
    /// assert_eq!(budget.balance(), 10, "the deposits expired");
    /// # }
    /// ```
    pub fn balance(&self) -> i64 {
        (self.sum(self.now()) + self.reserve).max(0) / WITHDRAWAL
    }

    /// What the engine asks before a retry: the local budget's answer, or the fleet's on its way.
    pub(crate) fn withdraw(&self) -> Withdrawal {
        if let Some(link) = self.link.get()
            && link.attached()
        {
            return Withdrawal::Asking(link.clone().withdraw());
        }
        match self.try_withdraw() {
            true => Withdrawal::Granted,
            false => Withdrawal::Refused,
        }
    }

    /// The current slot's number.
    fn now(&self) -> u32 {
        (clock::now() / self.slot) as u32
    }

    /// The sum of the balances of the slots inside the window that ends in slot `now`.
    fn sum(&self, now: u32) -> i64 {
        self.slots
            .iter()
            .map(|s| unpack(s.load(Ordering::Relaxed)))
            .filter(|&(slot, _)| u64::from(now.wrapping_sub(slot)) < SLOTS)
            .map(|(_, balance)| i64::from(balance))
            .sum()
    }

    /// Adds `amount` to slot `now`, starting it afresh when it still holds an older slot's
    /// balance.
    fn add(&self, now: u32, amount: i64) {
        let word = &self.slots[(u64::from(now) % SLOTS) as usize];
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let (slot, balance) = unpack(current);
            // A slot number ahead of ours (this clock reading lost a race with a later one)
            // takes the amount too.
            let next = if slot == now || slot.wrapping_sub(now) < u32::MAX / 2 {
                pack(slot, saturate(i64::from(balance) + amount))
            } else {
                pack(now, saturate(amount))
            };
            match word.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// Takes every deposit out of the local slots (inside the window), to hand to the fleet:
    /// their sum, in thousandths of a retry. [`give_back`](Self::give_back) returns it when the
    /// fleet cannot be reached.
    #[cfg(feature = "redis")]
    pub(crate) fn take_local(&self) -> i64 {
        let now = self.now();
        let mut taken = 0;
        for word in &self.slots {
            let mut current = word.load(Ordering::Relaxed);
            loop {
                let (slot, balance) = unpack(current);
                if u64::from(now.wrapping_sub(slot)) >= SLOTS || balance == 0 {
                    break;
                }
                match word.compare_exchange_weak(
                    current,
                    pack(slot, 0),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        taken += i64::from(balance);
                        break;
                    }
                    Err(seen) => current = seen,
                }
            }
        }
        taken
    }

    /// Puts back what [`take_local`](Self::take_local) took, in the current slot.
    #[cfg(feature = "redis")]
    pub(crate) fn give_back(&self, amount: i64) {
        if amount != 0 {
            self.add(self.now(), amount);
        }
    }

    /// What `min_per_sec × window` is worth, in thousandths of a retry.
    #[cfg(feature = "redis")]
    pub(crate) fn reserve(&self) -> i64 {
        self.reserve
    }
}

fn saturate(n: i64) -> i32 {
    n.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_clamped() {
        let b = RetryBudget::new(f32::NAN, 0, Duration::ZERO);
        assert_eq!((b.deposit, b.window), (0, MIN_WINDOW));
        let b = RetryBudget::new(5000.0, 3, Duration::from_secs(3600));
        assert_eq!((b.deposit, b.window), (1_000_000, MAX_WINDOW));
        assert_eq!(b.reserve, 3 * 60_000);
        assert_eq!(RetryBudget::new(0.1, 0, MIN_WINDOW).deposit, 100);
    }

    #[test]
    fn packing_keeps_a_negative_balance() {
        assert_eq!(unpack(pack(u32::MAX, -7)), (u32::MAX, -7));
        assert_eq!(unpack(pack(3, i32::MAX)), (3, i32::MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stay_within_the_ratio_of_the_calls_plus_the_floor() {
        let b = RetryBudget::new(0.1, 0, Duration::from_secs(10));
        for _ in 0..100 {
            b.deposit();
        }
        let granted = (0..50).filter(|_| b.try_withdraw()).count();
        assert_eq!(granted, 10);
        let b = RetryBudget::new(0.1, 1, Duration::from_secs(10));
        for _ in 0..100 {
            b.deposit();
        }
        let granted = (0..50).filter(|_| b.try_withdraw()).count();
        assert_eq!(
            granted, 20,
            "ten from the calls and ten from one a second for 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deposits_expire_after_the_window_and_only_then() {
        // tower's `tps_slots`: a deposit 900 ms old still counts in a 1 s window.
        let b = RetryBudget::new(0.5, 0, Duration::from_secs(1));
        b.deposit();
        b.deposit();
        tokio::time::advance(Duration::from_millis(850)).await;
        assert!(b.try_withdraw());
        tokio::time::advance(Duration::from_millis(2001)).await;
        b.deposit();
        tokio::time::advance(Duration::from_millis(301)).await;
        b.deposit();
        tokio::time::advance(Duration::from_millis(801)).await;
        b.deposit();
        // The first of the three expired; the second and third make one retry.
        assert!(b.try_withdraw());
        assert!(!b.try_withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn a_withdrawal_stays_spent_for_the_window() {
        let b = RetryBudget::new(1.0, 0, Duration::from_secs(1));
        b.deposit();
        assert!(b.try_withdraw());
        b.deposit();
        assert!(b.try_withdraw(), "the second call earned its own retry");
        assert!(!b.try_withdraw());
        tokio::time::advance(Duration::from_secs(2)).await;
        b.deposit();
        assert!(
            b.try_withdraw(),
            "the old withdrawals expired with their deposits"
        );
    }

    #[cfg(feature = "redis")]
    #[tokio::test(start_paused = true)]
    async fn what_is_taken_for_the_fleet_leaves_the_local_budget_until_given_back() {
        let b = RetryBudget::new(1.0, 0, Duration::from_secs(1));
        b.deposit();
        b.deposit();
        assert_eq!(b.take_local(), 2000);
        assert!(!b.try_withdraw());
        b.give_back(2000);
        assert_eq!(b.balance(), 2);
    }
}
