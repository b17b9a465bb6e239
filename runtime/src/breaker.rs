//! The circuit breaker: fail fast in front of a dependency that is down.
//!
//! Retries turn a fast failure into a slow one: when a dependency is down, a pool of workers
//! retrying against it saturates itself. A [`CircuitBreaker`] shared by every job that calls the
//! dependency notices the failures and, once it opens, makes every call fail at once with
//! [`Error::CircuitOpen`](crate::Error::CircuitOpen) until a cooldown has passed. Then it lets a
//! bounded number of probes through: a good probe closes it, a bad one re-opens it.
//!
//! ```text
//!            N failures in a row,               cooldown
//!            or the failure rate                over
//!   Closed ─────────────────────▶ Open ─────────────────▶ HalfOpen
//!     ▲                            ▲                          │
//!     │                            └──── a probe fails ───────┤
//!     └────────────────────────────── a probe succeeds ───────┘
//! ```
//!
//! With `#[retry(breaker = GATEWAY)]` the loop asks the breaker before every attempt, so a breaker
//! that opens mid-loop stops the loop: at once, when it will still be open once the next
//! attempt's wait is over (no retry is announced, nothing sleeps), else when that attempt is
//! refused or probes the half-open breaker. Only transient failures count against it: a permanent
//! failure says nothing about the dependency's health. Code that cannot take the attribute asks the
//! breaker itself with [`CircuitBreaker::acquire`] and reports through the [`Permit`].
//!
//! The breaker is a handful of atomics: no lock, no allocation, usable in a `static`. It reads
//! [`tokio::time`], so tests drive the cooldown with a paused clock.

use crate::observe::Event;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A shared breaker's failure on its way to the fleet: resolves once the fleet's answer (the
/// count, or an opening) is applied to the local breaker.
pub(crate) type Reporting = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a shared breaker asks of the fleet, implemented by `crate::fleet` (feature `redis`), so
/// that this module does not depend on it. While [`attached`](Link::attached) is `false` (Redis
/// out of reach) the breaker is the process's own, and none of the rest is called.
pub(crate) trait Link: Send + Sync {
    /// Whether the fleet decides the breaker's transitions.
    fn attached(&self) -> bool;
    /// Whether the fleet counts failures now (a failure-rate breaker's successes are then
    /// reported, to weigh against them).
    fn dirty(&self) -> bool;
    /// A transient failure of a call admitted closed in local `epoch`: counted in Redis, and the
    /// fleet's answer applied; out of reach, counted by the local rule.
    fn failed(self: std::sync::Arc<Self>, epoch: u32) -> Reporting;
    /// The outcome of the probe this process holds: the fleet's breaker closes or re-opens.
    fn settled(self: std::sync::Arc<Self>, closed: bool) -> Reporting;
    /// A success to report, in the background: resets the fleet's count of failures in a row,
    /// or hands over this process's window.
    fn succeeded(&self);
    /// The local cooldown is over: the fleet is asked for the probe, in the background.
    fn probe_wanted(&self);
}

impl std::fmt::Debug for dyn Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("attached", &self.attached())
            .finish()
    }
}

/// The fleet's state, as a shared breaker applies it (see [`CircuitBreaker::adopt`]).
#[cfg(feature = "redis")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fleet {
    /// Closed, with this many failures counted (in a row, or in the windows).
    Closed { failures: u64 },
    /// Open for `left` more (or half-open with another process holding the probe for `left`).
    Open { left: Duration },
    /// Half-open with this process holding the probe.
    Probing,
}

/// A breaker's rule for opening, as the fleet's scripts take it.
#[cfg(feature = "redis")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// After `threshold` transient failures in a row.
    Consecutive { threshold: u32 },
    /// When the failures reach `ppm` parts per million of at least `min_calls` calls.
    Rate { ppm: u32, min_calls: u32 },
}

/// Runs a report whose outcome nobody waits for on the tokio runtime in scope, if any.
fn spawn(reporting: Reporting) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(reporting);
    }
}

pub use crate::record::BreakerState;

/// The largest sliding window a [`CircuitBreaker::failure_rate`] breaker keeps: 63 calls, one bit
/// each in a single atomic word. A larger window is clamped to this.
pub const MAX_WINDOW: u32 = 63;

/// The most concurrent half-open probes a breaker admits; a larger [`CircuitBreaker::probes`] is
/// clamped to this.
pub const MAX_PROBES: u32 = u16::MAX as u32;

/// The word that holds the state: `[epoch: 32 bits][probes in flight: 16 bits][0: 14][state: 2]`.
///
/// The epoch changes on every transition, so that a permit knows whether the state it was admitted
/// in still holds: an outcome only counts toward the state it was admitted in.
const STATE: u64 = 0b11;
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const PROBE: u64 = 1 << 16;

const fn pack(epoch: u32, probes: u32, state: u64) -> u64 {
    ((epoch as u64) << 32) | ((probes as u64 & 0xFFFF) << 16) | state
}

const fn epoch_of(word: u64) -> u32 {
    (word >> 32) as u32
}

const fn probes_of(word: u64) -> u32 {
    ((word >> 16) & 0xFFFF) as u32
}

const fn state_of(word: u64) -> BreakerState {
    match word & STATE {
        CLOSED => BreakerState::Closed,
        OPEN => BreakerState::Open,
        _ => BreakerState::HalfOpen,
    }
}

/// An empty sliding window: the marker bit alone, at position 0 (no calls recorded).
const EMPTY_WINDOW: u64 = 1;

/// How a closed breaker decides to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// After `threshold` transient failures in a row.
    Consecutive { threshold: u32 },
    /// When, over the last `window` calls (at least `min_calls` of them), the share of failures
    /// reaches `ppm` parts per million.
    Rate {
        ppm: u32,
        window: u32,
        min_calls: u32,
    },
}

/// A circuit breaker, usually a `static` shared by every job that calls one dependency.
///
/// Two ways to open:
///
/// - [`CircuitBreaker::new`]`(failures, cooldown)` opens after `failures` transient failures in a
///   row; a success resets the count.
/// - [`CircuitBreaker::failure_rate`]`(ratio, window, cooldown)` opens when the share of failures
///   over the last `window` calls reaches `ratio`, once at least [`min_calls`](Self::min_calls)
///   calls are in the window.
///
/// Once open it fails every call fast for `cooldown`, then turns half-open and admits at most
/// [`probes`](Self::probes) concurrent calls (default 1), failing the rest fast. A probe that
/// succeeds closes the breaker; one that fails re-opens it for a fresh cooldown. A probe whose
/// future is dropped, or that fails permanently, gives its slot back and changes nothing, so the
/// breaker never sticks half-open.
///
/// Every transition raises [`Event::Breaker`] on the runtime in scope, at the moment it happens (on
/// the task whose call caused it). Open → half-open happens lazily: at the first
/// [`acquire`](Self::acquire) or [`state`](Self::state) after the cooldown.
///
/// # Examples
///
/// One breaker in front of a payment gateway, shared by every job that calls it (this example
/// needs the default `macros` feature):
///
#[cfg_attr(feature = "macros", doc = "```")]
#[cfg_attr(not(feature = "macros"), doc = "```ignore")]
/// use jobguard::{BreakerState, CircuitBreaker};
/// use std::time::Duration;
///
/// static GATEWAY: CircuitBreaker =
///     CircuitBreaker::new(5, Duration::from_secs(30)).named("gateway");
///
/// #[derive(Debug)]
/// enum GatewayError {
///     Timeout,
///     Jobguard(jobguard::Error),
/// }
/// # impl std::fmt::Display for GatewayError {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
/// # }
/// impl jobguard::Transient for GatewayError {
///     fn verdict(&self) -> jobguard::Verdict {
///         match self {
///             GatewayError::Timeout => jobguard::Verdict::Retry,
///             GatewayError::Jobguard(e) => e.verdict(),
///         }
///     }
/// }
/// impl From<jobguard::Error> for GatewayError {
///     fn from(e: jobguard::Error) -> Self {
///         GatewayError::Jobguard(e)
///     }
/// }
///
/// #[jobguard::retry(attempts = 3, breaker = GATEWAY)]
/// async fn capture(order_id: &str) -> Result<u64, GatewayError> {
///     # let _ = order_id;
///     Ok(100)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// assert_eq!(capture("order-A").await.unwrap(), 100);
/// assert_eq!(GATEWAY.state(), BreakerState::Closed);
/// # }
/// ```
///
/// A failure-rate breaker: open when half of the last 20 calls failed, once 10 calls were seen,
/// and let two probes through at a time:
///
/// ```
/// use jobguard::CircuitBreaker;
/// use std::time::Duration;
///
/// static SEARCH: CircuitBreaker = CircuitBreaker::failure_rate(0.5, 20, Duration::from_secs(10))
///     .min_calls(10)
///     .probes(2)
///     .named("search");
/// assert_eq!(SEARCH.name(), "search");
/// ```
#[derive(Debug)]
pub struct CircuitBreaker {
    name: &'static str,
    mode: Mode,
    cooldown: Duration,
    probes: u32,
    /// State, probes in flight and epoch: see [`STATE`].
    word: AtomicU64,
    /// Consecutive mode: transient failures in a row. Rate mode: the window, one bit per call
    /// (1 = failure), newest in bit 0, under a marker bit whose position is the number of calls.
    tally: AtomicU64,
    /// When an open breaker may turn half-open, in nanoseconds on [`clock`]. Only ever grows.
    reopen_at: AtomicU64,
    /// The fleet, once [`share`](Self::share)d (feature `redis`): see [`crate::fleet`].
    pub(crate) link: std::sync::OnceLock<std::sync::Arc<dyn Link>>,
}

impl CircuitBreaker {
    /// A breaker that opens after `failures` transient failures in a row (at least 1) and stays
    /// open for `cooldown`. A success resets the count. Usable in a `static`.
    ///
    /// ```
    /// use jobguard::CircuitBreaker;
    /// use std::time::Duration;
    ///
    /// static GATEWAY: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));
    /// assert_eq!(GATEWAY.state(), jobguard::BreakerState::Closed);
    /// ```
    pub const fn new(failures: u32, cooldown: Duration) -> Self {
        let threshold = if failures == 0 { 1 } else { failures };
        Self::with_mode(Mode::Consecutive { threshold }, cooldown)
    }

    /// A breaker that opens when the share of transient failures over the last `window` calls
    /// reaches `ratio`, and stays open for `cooldown`. Usable in a `static`.
    ///
    /// - `ratio` is clamped into `(0, 1]`: `0.5` opens when half the calls in the window failed,
    ///   `1.0` only when all did. NaN reads as `1.0`.
    /// - `window` is clamped into `1..=`[`MAX_WINDOW`] (63): the window is one atomic word.
    /// - It cannot open before the window holds [`min_calls`](Self::min_calls) calls, by default
    ///   the whole window, so a quiet period's first failure does not trip it.
    ///
    /// Successes and transient failures enter the window; permanent failures do not. The window
    /// empties when the breaker closes after a probe.
    ///
    /// ```
    /// use jobguard::CircuitBreaker;
    /// use std::time::Duration;
    ///
    /// // Half of the last 20 calls failed, with at least 10 calls seen.
    /// static SEARCH: CircuitBreaker =
    ///     CircuitBreaker::failure_rate(0.5, 20, Duration::from_secs(10)).min_calls(10);
    /// # let _ = &SEARCH;
    /// ```
    pub const fn failure_rate(ratio: f64, window: u32, cooldown: Duration) -> Self {
        let ppm = if ratio.is_nan() || ratio >= 1.0 {
            1_000_000
        } else if ratio * 1_000_000.0 < 1.0 {
            1
        } else {
            (ratio * 1_000_000.0) as u32
        };
        let window = clamp(window, 1, MAX_WINDOW);
        Self::with_mode(
            Mode::Rate {
                ppm,
                window,
                min_calls: window,
            },
            cooldown,
        )
    }

    const fn with_mode(mode: Mode, cooldown: Duration) -> Self {
        CircuitBreaker {
            name: "unnamed",
            mode,
            cooldown,
            probes: 1,
            word: AtomicU64::new(pack(0, 0, CLOSED)),
            tally: AtomicU64::new(match mode {
                Mode::Consecutive { .. } => 0,
                Mode::Rate { .. } => EMPTY_WINDOW,
            }),
            reopen_at: AtomicU64::new(0),
            link: std::sync::OnceLock::new(),
        }
    }

    /// The label this breaker's events and metrics carry (default `"unnamed"`).
    ///
    /// ```
    /// # use jobguard::CircuitBreaker;
    /// # use std::time::Duration;
    /// static GATEWAY: CircuitBreaker =
    ///     CircuitBreaker::new(5, Duration::from_secs(30)).named("gateway");
    /// assert_eq!(GATEWAY.name(), "gateway");
    /// ```
    pub const fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// How many probes a half-open breaker lets through at once (default 1; clamped into
    /// `1..=`[`MAX_PROBES`]). Calls beyond that fail fast until a probe settles.
    ///
    /// ```
    /// # use jobguard::CircuitBreaker;
    /// # use std::time::Duration;
    /// static GATEWAY: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30)).probes(3);
    /// # let _ = &GATEWAY;
    /// ```
    pub const fn probes(mut self, probes: u32) -> Self {
        self.probes = clamp(probes, 1, MAX_PROBES);
        self
    }

    /// The minimum number of calls the window of a [`failure_rate`](Self::failure_rate) breaker
    /// must hold before it can open (clamped into `1..=window`; default: the window). No effect on
    /// a breaker made with [`new`](Self::new).
    ///
    /// ```
    /// # use jobguard::CircuitBreaker;
    /// # use std::time::Duration;
    /// static SEARCH: CircuitBreaker =
    ///     CircuitBreaker::failure_rate(0.25, 40, Duration::from_secs(5)).min_calls(8);
    /// # let _ = &SEARCH;
    /// ```
    pub const fn min_calls(mut self, calls: u32) -> Self {
        if let Mode::Rate { ppm, window, .. } = self.mode {
            self.mode = Mode::Rate {
                ppm,
                window,
                min_calls: clamp(calls, 1, window),
            };
        }
        self
    }

    /// The label given with [`named`](Self::named).
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// How long the breaker stays open before it lets a probe through.
    pub const fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// The current state.
    ///
    /// An open breaker whose cooldown has ended turns half-open here (raising the event), so the
    /// state read and the events seen agree; a [shared](crate::fleet) one stays open until the
    /// fleet grants this process the probe.
    ///
    /// ```
    /// use jobguard::{BreakerState, CircuitBreaker};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = CircuitBreaker::new(3, Duration::from_secs(30));
    /// breaker.trip();
    /// assert_eq!(breaker.state(), BreakerState::Open);
    /// tokio::time::sleep(Duration::from_secs(30)).await;
    /// assert_eq!(breaker.state(), BreakerState::HalfOpen);
    /// # }
    /// ```
    pub fn state(&self) -> BreakerState {
        let word = self.word.load(Ordering::Acquire);
        if word & STATE == OPEN && self.remaining(clock::now()).is_zero() {
            if let Some(link) = self.shared() {
                link.probe_wanted();
                return BreakerState::Open;
            }
            let half = pack(epoch_of(word).wrapping_add(1), 0, HALF_OPEN);
            if self
                .word
                .compare_exchange(word, half, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.emit(BreakerState::Open, BreakerState::HalfOpen);
            }
            return state_of(self.word.load(Ordering::Acquire));
        }
        state_of(word)
    }

    /// The failures it counts now: transient failures in a row (a [`new`](Self::new) breaker),
    /// or failures in its window (a [`failure_rate`](Self::failure_rate) breaker). For an
    /// operator's view; [`reset`](Self::reset) empties it.
    ///
    /// ```
    /// use jobguard::CircuitBreaker;
    /// use std::time::Duration;
    ///
    /// let breaker = CircuitBreaker::new(5, Duration::from_secs(30));
    /// assert_eq!(breaker.failures(), 0);
    /// ```
    pub fn failures(&self) -> u32 {
        let tally = self.tally.load(Ordering::Acquire);
        match self.mode {
            Mode::Consecutive { .. } => u32::try_from(tally).unwrap_or(u32::MAX),
            Mode::Rate { .. } => tally.count_ones().saturating_sub(1),
        }
    }

    /// Time left until an open breaker lets a probe through; zero unless it is open.
    pub fn retry_in(&self) -> Duration {
        match self.word.load(Ordering::Acquire) & STATE {
            OPEN => self.remaining(clock::now()),
            _ => Duration::ZERO,
        }
    }

    /// Opens the breaker now, for a fresh cooldown, whatever its state. Calls fail fast until the
    /// cooldown ends (or [`reset`](Self::reset)); after it, probes decide as usual.
    ///
    /// ```
    /// use jobguard::{BreakerState, CircuitBreaker};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = CircuitBreaker::new(5, Duration::from_secs(30));
    /// breaker.trip(); // e.g. the dependency announced maintenance
    /// assert_eq!(breaker.state(), BreakerState::Open);
    /// assert_eq!(breaker.retry_in(), Duration::from_secs(30));
    /// breaker.reset();
    /// assert_eq!(breaker.state(), BreakerState::Closed);
    /// # }
    /// ```
    pub fn trip(&self) {
        self.arm_cooldown();
        // Already open: the cooldown was re-armed above.
        self.move_to(OPEN);
    }

    /// Closes the breaker now, whatever its state, with its failure count or window emptied.
    /// Outcomes of calls admitted before the reset are ignored.
    pub fn reset(&self) {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            self.clear_tally();
            let closed = pack(epoch_of(word).wrapping_add(1), 0, CLOSED);
            match self
                .word
                .compare_exchange_weak(word, closed, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if word & STATE != CLOSED {
                        self.emit(state_of(word), BreakerState::Closed);
                    }
                    return;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Asks to make one call. `Ok(permit)` when the breaker is closed, or half-open with a probe
    /// slot free; report the call's outcome through the [`Permit`]. `Err(Open)` when it is open
    /// ([`Open::retry_in`]: the time left in its cooldown), or half-open with every probe slot
    /// taken (`retry_in` is zero then: a slot frees as soon as a probe settles).
    ///
    /// This is what `#[retry(breaker = ...)]` calls before every attempt. On a closed breaker it
    /// is one atomic load, and the permit's [`success`](Permit::success) one more.
    ///
    /// ```
    /// use jobguard::CircuitBreaker;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = CircuitBreaker::new(1, Duration::from_secs(5));
    /// match breaker.acquire() {
    ///     Ok(permit) => permit.failure(), // the call failed transiently: the breaker opens
    ///     Err(_) => unreachable!("a new breaker is closed"),
    /// }
    /// let open = breaker.acquire().unwrap_err();
    /// assert_eq!(open.retry_in, Duration::from_secs(5));
    /// # }
    /// ```
    // `#[inline]` here, on `Permit::success` and on the permit's drop: a job's crate calls
    // them on every guarded call, and a function of this crate that is not generic is
    // otherwise a call across crates (`suite/benches/breaker.rs`: acquire + success 11.8 ns
    // without, 1.9 ns with).
    #[inline]
    pub fn acquire(&self) -> Result<Permit<'_>, Open> {
        let word = self.word.load(Ordering::Acquire);
        if word & STATE == CLOSED {
            return Ok(Permit {
                breaker: self,
                epoch: epoch_of(word),
                probe: false,
            });
        }
        self.acquire_slow(word)
    }

    fn acquire_slow(&self, mut word: u64) -> Result<Permit<'_>, Open> {
        loop {
            let next = match word & STATE {
                CLOSED => {
                    return Ok(Permit {
                        breaker: self,
                        epoch: epoch_of(word),
                        probe: false,
                    });
                }
                OPEN => {
                    let retry_in = self.remaining(clock::now());
                    if !retry_in.is_zero() {
                        return Err(Open { retry_in });
                    }
                    // Shared: the fleet picks the one probe; this process asks for it.
                    if let Some(link) = self.shared() {
                        link.probe_wanted();
                        return Err(Open {
                            retry_in: Duration::ZERO,
                        });
                    }
                    // The cooldown is over: turn half-open, taking the first probe slot.
                    pack(epoch_of(word).wrapping_add(1), 1, HALF_OPEN)
                }
                _ if probes_of(word) >= self.probes => {
                    return Err(Open {
                        retry_in: Duration::ZERO,
                    });
                }
                _ => word + PROBE,
            };
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if word & STATE == OPEN {
                        self.emit(BreakerState::Open, BreakerState::HalfOpen);
                    }
                    return Ok(Permit {
                        breaker: self,
                        epoch: epoch_of(next),
                        probe: true,
                    });
                }
                Err(now) => word = now,
            }
        }
    }

    fn remaining(&self, now: u64) -> Duration {
        Duration::from_nanos(self.reopen_at.load(Ordering::Acquire).saturating_sub(now))
    }

    /// Moves the end of the cooldown to `now + cooldown`. Called before the transition to open is
    /// published, so whoever sees the breaker open sees its deadline too. `fetch_max`, so a racing
    /// opener that read the clock earlier can never shorten it.
    fn arm_cooldown(&self) {
        let cooldown = self.cooldown.as_nanos().min(u64::MAX as u128) as u64;
        let until = clock::now().saturating_add(cooldown);
        self.reopen_at.fetch_max(until, Ordering::AcqRel);
    }

    fn clear_tally(&self) {
        let empty = match self.mode {
            Mode::Consecutive { .. } => 0,
            Mode::Rate { .. } => EMPTY_WINDOW,
        };
        self.tally.store(empty, Ordering::Release);
    }

    /// Leaves the half-open state of `epoch`, to closed or (with a fresh cooldown) open. Nothing
    /// happens when that state has already been left.
    fn settle_probe(&self, epoch: u32, to: u64) {
        if to == OPEN {
            self.arm_cooldown();
        } else {
            self.clear_tally();
        }
        let mut word = self.word.load(Ordering::Acquire);
        while word & STATE == HALF_OPEN && epoch_of(word) == epoch {
            let next = pack(epoch.wrapping_add(1), 0, to);
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return self.emit(BreakerState::HalfOpen, state_of(next)),
                Err(now) => word = now,
            }
        }
    }

    /// Gives back a probe slot of the half-open state of `epoch`, if that state still holds.
    fn release_probe(&self, epoch: u32) {
        let mut word = self.word.load(Ordering::Acquire);
        while word & STATE == HALF_OPEN && epoch_of(word) == epoch && probes_of(word) > 0 {
            match self.word.compare_exchange_weak(
                word,
                word - PROBE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// A probe of the half-open state of `epoch` succeeded: the breaker closes, and a shared
    /// one tells the fleet in the background.
    fn probe_succeeded(&self, epoch: u32) {
        self.settle_probe(epoch, CLOSED);
        if let Some(link) = self.shared() {
            spawn(link.clone().settled(true));
        }
    }

    fn closed_success(&self, epoch: u32) {
        match self.mode {
            Mode::Consecutive { .. } => {
                // Only write when there is a count to clear: a healthy breaker is read, not
                // written, so workers on many cores do not fight over its cache line. Shared,
                // the count is the fleet's, and clearing it is reported.
                if self.tally.load(Ordering::Relaxed) != 0 && self.admitted_in(epoch) {
                    self.tally.store(0, Ordering::Relaxed);
                    if let Some(link) = self.shared() {
                        link.succeeded();
                    }
                }
            }
            Mode::Rate { window, .. } => {
                // A full window of successes stays the same when one more success enters it.
                if self.tally.load(Ordering::Relaxed) != 1 << window && self.admitted_in(epoch) {
                    self.record(false, window);
                }
                // Shared, while the fleet counts failures, this window weighs against them.
                if let Some(link) = self.shared()
                    && link.dirty()
                {
                    link.succeeded();
                }
            }
        }
    }

    /// Notes a failure of a call admitted while closed in `epoch`: in a failure-rate breaker's
    /// window. `false` when the call was admitted before the breaker last changed state, and
    /// the failure counts for nothing.
    fn note_failure(&self, epoch: u32) -> bool {
        if !self.admitted_in(epoch) {
            return false;
        }
        if let Mode::Rate { window, .. } = self.mode {
            self.record(true, window);
        }
        true
    }

    /// Counts a failure already in the window (a failure-rate breaker's), or not yet counted (a
    /// breaker of failures in a row), and opens the breaker when its rule is met.
    fn count_failure(&self, epoch: u32) {
        let trips = match self.mode {
            Mode::Consecutive { threshold } => {
                self.tally.fetch_add(1, Ordering::AcqRel).saturating_add(1) >= threshold as u64
            }
            Mode::Rate { ppm, min_calls, .. } => {
                let (calls, failures) = self.window_counts();
                calls >= min_calls
                    && u64::from(failures) * 1_000_000 >= u64::from(ppm) * u64::from(calls)
            }
        };
        if trips {
            self.arm_cooldown();
            let closed = pack(epoch, 0, CLOSED);
            let open = pack(epoch.wrapping_add(1), 0, OPEN);
            if self
                .word
                .compare_exchange(closed, open, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.emit(BreakerState::Closed, BreakerState::Open);
            }
        }
    }

    /// A shared breaker's failure that the fleet could not hear of: counted by the local rule.
    #[cfg(feature = "redis")]
    pub(crate) fn unheard_failure(&self, epoch: u32) {
        if self.admitted_in(epoch) {
            self.count_failure(epoch);
        }
    }

    /// The calls and the failures in a failure-rate breaker's window; `(0, 0)` for a breaker
    /// of failures in a row.
    pub(crate) fn window_counts(&self) -> (u32, u32) {
        match self.mode {
            Mode::Consecutive { .. } => (0, 0),
            Mode::Rate { .. } => {
                let w = self.tally.load(Ordering::Acquire);
                (63 - w.leading_zeros(), w.count_ones() - 1)
            }
        }
    }

    /// The rule the fleet applies for this breaker.
    #[cfg(feature = "redis")]
    pub(crate) fn rule(&self) -> Rule {
        match self.mode {
            Mode::Consecutive { threshold } => Rule::Consecutive { threshold },
            Mode::Rate { ppm, min_calls, .. } => Rule::Rate { ppm, min_calls },
        }
    }

    /// The fleet decides, when the breaker is shared and Redis is in reach.
    fn shared(&self) -> Option<&std::sync::Arc<dyn Link>> {
        self.link.get().filter(|link| link.attached())
    }

    /// When a shared breaker's listener should ask the fleet for the probe: the cooldown left,
    /// while the breaker is open here; `None` otherwise.
    #[cfg(feature = "redis")]
    pub(crate) fn probe_in(&self) -> Option<Duration> {
        (self.word.load(Ordering::Acquire) & STATE == OPEN).then(|| self.remaining(clock::now()))
    }

    /// Applies the fleet's state here, raising the transition it makes.
    #[cfg(feature = "redis")]
    pub(crate) fn adopt(&self, fleet: Fleet) {
        match fleet {
            Fleet::Closed { failures } => {
                if self.word.load(Ordering::Acquire) & STATE != CLOSED {
                    self.clear_tally();
                    self.move_to(CLOSED);
                }
                if let Mode::Consecutive { .. } = self.mode {
                    self.tally.store(failures, Ordering::Relaxed);
                }
            }
            Fleet::Open { left } => {
                let left = left.as_nanos().min(u64::MAX as u128) as u64;
                self.reopen_at
                    .fetch_max(clock::now().saturating_add(left), Ordering::AcqRel);
                self.move_to(OPEN);
            }
            Fleet::Probing => self.move_to(HALF_OPEN),
        }
    }

    /// Moves to `to` (a new epoch, no probe in flight) unless the breaker is there already.
    fn move_to(&self, to: u64) {
        let mut word = self.word.load(Ordering::Acquire);
        while word & STATE != to {
            let next = pack(epoch_of(word).wrapping_add(1), 0, to);
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return self.emit(state_of(word), state_of(next)),
                Err(now) => word = now,
            }
        }
    }

    fn admitted_in(&self, epoch: u32) -> bool {
        self.word.load(Ordering::Acquire) == pack(epoch, 0, CLOSED)
    }

    /// Shifts one outcome into the window and returns the new window.
    fn record(&self, failed: bool, window: u32) -> u64 {
        let mut w = self.tally.load(Ordering::Relaxed);
        loop {
            let calls = 63 - w.leading_zeros();
            let outcomes = w & !(1u64 << calls);
            let calls = (calls + 1).min(window);
            let outcomes = ((outcomes << 1) | u64::from(failed)) & ((1u64 << calls) - 1);
            let next = outcomes | (1u64 << calls);
            match self
                .tally
                .compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(now) => w = now,
            }
        }
    }

    fn emit(&self, from: BreakerState, to: BreakerState) {
        crate::Runtime::current().emit(&Event::Breaker {
            breaker: self.name,
            from,
            to,
        });
    }
}

const fn clamp(n: u32, lo: u32, hi: u32) -> u32 {
    if n < lo {
        lo
    } else if n > hi {
        hi
    } else {
        n
    }
}

/// Permission to make one call through a [`CircuitBreaker`], from
/// [`acquire`](CircuitBreaker::acquire).
///
/// Report the call's outcome with [`success`](Self::success) or [`failure`](Self::failure) (a
/// transient failure). Dropped without either (a permanent failure, or a call whose future was
/// dropped), it changes nothing and gives a probe slot back, so a cancelled probe never leaves the
/// breaker stuck half-open. An outcome counts only toward the state the call was admitted in: a
/// slow call admitted before the breaker opened cannot count against it after it closed again.
#[must_use = "report the call's outcome with `success()` or `failure()`"]
#[derive(Debug)]
pub struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    epoch: u32,
    /// Whether this is a half-open probe whose slot is still taken: cleared once its outcome is
    /// reported, so that only a probe dropped unreported gives its slot back.
    probe: bool,
}

/// The breaker refused a call, from [`acquire`](CircuitBreaker::acquire): it is open, or
/// half-open with every probe slot taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Open {
    /// How long until the breaker lets a probe through: the rest of its cooldown, or zero when
    /// it is half-open and a slot frees as soon as a probe settles.
    pub retry_in: Duration,
}

impl std::fmt::Display for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "circuit open, retry in {:?}", self.retry_in)
    }
}

impl std::error::Error for Open {}

impl From<Open> for crate::Error {
    fn from(open: Open) -> Self {
        crate::Error::CircuitOpen {
            retry_in: open.retry_in,
        }
    }
}

impl Permit<'_> {
    /// Whether this call is a half-open probe: its outcome closes or re-opens the breaker.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The call succeeded. A probe closes the breaker; otherwise the failure count is reset (or a
    /// success enters the window).
    ///
    /// A [shared](crate::fleet) breaker reports a probe's success to the fleet, and a success
    /// while the fleet counts failures, in the background: never on the call's path.
    #[inline]
    pub fn success(mut self) {
        match std::mem::take(&mut self.probe) {
            true => self.breaker.probe_succeeded(self.epoch),
            false => self.breaker.closed_success(self.epoch),
        }
    }

    /// The call failed transiently. A probe re-opens the breaker for a fresh cooldown; otherwise
    /// the failure counts and may open it.
    ///
    /// A [shared](crate::fleet) breaker counts the failure in Redis, on a task of its own (the
    /// retry engine waits for that answer instead); without a tokio runtime in scope the fleet
    /// does not hear of it.
    pub fn failure(self) {
        if let Some(reporting) = self.fail() {
            spawn(reporting);
        }
    }

    /// [`failure`](Self::failure), as the retry engine reports it: `Some` when the fleet hears
    /// of it, and the call should wait for its answer (one round trip).
    pub(crate) fn fail(mut self) -> Option<Reporting> {
        let (breaker, epoch) = (self.breaker, self.epoch);
        let link = breaker.shared();
        if std::mem::take(&mut self.probe) {
            breaker.settle_probe(epoch, OPEN);
            return link.map(|link| link.clone().settled(false));
        }
        if !breaker.note_failure(epoch) {
            return None;
        }
        match link {
            Some(link) => Some(link.clone().failed(epoch)),
            None => {
                breaker.count_failure(epoch);
                None
            }
        }
    }
}

/// Dropped unreported (a permanent failure, or a call whose future was dropped): nothing is
/// counted, and a probe gives its slot back.
impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.probe {
            self.breaker.release_probe(self.epoch);
        }
    }
}

/// Monotonic nanoseconds from `tokio::time`, so a paused test clock drives the breaker.
pub(crate) mod clock {
    use std::sync::OnceLock;
    use std::time::Duration;
    use tokio::time::Instant;

    static EPOCH: OnceLock<Instant> = OnceLock::new();

    /// Nanoseconds since a fixed point an hour before the first reading, so that a clock that
    /// started a little earlier (another test's paused clock) never reads before it.
    pub(crate) fn now() -> u64 {
        let now = Instant::now();
        let epoch = *EPOCH.get_or_init(|| {
            [3600, 60, 1, 0]
                .into_iter()
                .find_map(|s| now.checked_sub(Duration::from_secs(s)))
                .unwrap_or(now)
        });
        now.saturating_duration_since(epoch)
            .as_nanos()
            .min(u64::MAX as u128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_shifts_and_counts() {
        let b = CircuitBreaker::failure_rate(0.5, 3, Duration::from_secs(1));
        let w = b.record(true, 3);
        assert_eq!((63 - w.leading_zeros(), w.count_ones() - 1), (1, 1));
        b.record(false, 3);
        b.record(false, 3);
        let w = b.record(false, 3); // the failure falls out of a window of 3
        assert_eq!((63 - w.leading_zeros(), w.count_ones() - 1), (3, 0));
        assert_eq!(w, 1 << 3);
    }

    #[test]
    fn the_largest_window_fits_one_word() {
        let b = CircuitBreaker::failure_rate(0.5, 1000, Duration::from_secs(1));
        let mut w = 0;
        for _ in 0..200 {
            w = b.record(true, MAX_WINDOW);
        }
        assert_eq!((63 - w.leading_zeros(), w.count_ones() - 1), (63, 63));
        assert_eq!(
            b.mode,
            Mode::Rate {
                ppm: 500_000,
                window: 63,
                min_calls: 63
            }
        );
    }

    #[test]
    fn settings_are_clamped() {
        let b = CircuitBreaker::new(0, Duration::ZERO).probes(0);
        assert_eq!((b.mode, b.probes), (Mode::Consecutive { threshold: 1 }, 1));
        let b = CircuitBreaker::failure_rate(f64::NAN, 0, Duration::ZERO)
            .min_calls(9)
            .probes(1 << 20);
        assert_eq!(
            b.mode,
            Mode::Rate {
                ppm: 1_000_000,
                window: 1,
                min_calls: 1
            }
        );
        assert_eq!(b.probes, MAX_PROBES);
        let b = CircuitBreaker::failure_rate(-3.0, 10, Duration::ZERO).min_calls(0);
        assert_eq!(
            b.mode,
            Mode::Rate {
                ppm: 1,
                window: 10,
                min_calls: 1
            }
        );
    }

    #[test]
    fn packing_round_trips() {
        let w = pack(u32::MAX, MAX_PROBES, HALF_OPEN);
        assert_eq!(
            (epoch_of(w), probes_of(w), state_of(w)),
            (u32::MAX, MAX_PROBES, BreakerState::HalfOpen)
        );
    }
}
