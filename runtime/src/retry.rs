//! The retry engine: one attempt at a time, classified, delayed, given up on.
//!
//! Three pieces, read in this order:
//!
//! - [`decide`]: the policy as a plain function. After a failed attempt, retry after how long,
//!   or give up why. No clock, no runtime, no I/O; unit-tested below.
//! - [`Retry`]: what one call keeps from one attempt to the next (the attempt count, whether
//!   anyone watches, and once an attempt waits or fails, the runtime in scope and what its
//!   dead letter will need). Made when the call starts.
//! - [`Round`]: one turn of the loop, a future. It admits an attempt, runs it, and then accepts
//!   its outcome, sleeps before the next attempt, or gives up. It resolves to
//!   `ControlFlow::Break(result)` when the call is over and `ControlFlow::Continue(())` when the
//!   caller should make the next attempt and await the next round.
//!
//! `#[retry]` expands to one plain loop over rounds, and [`Policy::run`] is the same loop over a
//! closure:
//!
//! ```text
//! let mut retry = Retry::new(&SPEC, Guard::none());
//! loop {
//!     if let ControlFlow::Break(done) = retry.round(async { body }, on_err, on_ok).await {
//!         break done;
//!     }
//! }
//! ```
//!
//! The loop stays in the caller because each attempt borrows the caller's parameters (or the
//! closure of [`Policy::run`]): a future that owned the loop would have to own both the closure
//! and the attempt borrowing it. (Tried for `#[retry]`: a runtime `async fn` looping over the
//! body's `async` closure made the job's future `Send` for one lifetime of the closure's borrow
//! only, which the server example's apalis worker rejected: "implementation of `Send` is not
//! general enough".)
//!
//! # A round's states
//!
//! | state    | on a poll                                                   | next                 |
//! |----------|-------------------------------------------------------------|----------------------|
//! | `Admit`  | ask the breaker; count the attempt; set its time limit      | `Run`, or `Wait` (for the letter) when the breaker refuses |
//! | `Run`    | poll the attempt (and its time limit)                       | resolve `Break(Ok)` when the outcome is accepted; `Wait` when a shared breaker must hear of the failure; else [`decide`]: `Sleep`, or `Wait` (for a shared budget, or the letter) |
//! | `Wait`   | wait for a shared breaker's answer to the failure, or a shared retry budget's to the retry (one round trip to Redis each), for the dead letter to be on its way, or for the next attempt to be counted in the job's claim | after the breaker: [`decide`]; after the budget: `Sleep`, or `Wait` for the letter; after the letter: resolve `Break(result)`; after the count: resolve `Continue` |
//! | `Sleep`  | wait out the delay (a zero delay sets no timer)             | resolve `Continue`; inside a job's claim (`#[idempotent]` around `#[retry]`), `Wait` for the next attempt's count in the key's record first |
//! | `Done`   | a resolved round polled again: panic                        |                      |
//!
//! A round that is dropped mid-way drops its attempt, its timer and its breaker permit (a
//! half-open probe's slot is given back).
//!
//! A retry the policy decides on is asked of the call's [`RetryBudget`], if it has one, after
//! [`decide`]: a process's own budget answers at once (no `Wait`), and an empty one ends the
//! call as [`GiveUp::RetryBudget`]. Each call deposits in the budget when it
//! starts ([`Retry::new`]).
//!
//! # What a call costs
//!
//! A call decides when it starts whether anyone watches (the observer of the runtime in scope,
//! a `tracing` subscriber, the `metrics` feature): a call nobody watches builds no event. An
//! attempt that succeeds on its first poll allocates nothing and takes no lock, and reads the
//! clock only for a time limit (`timeout`, `budget`) or a retry budget's deposit. An attempt
//! that waits or fails reads the clock for its start and, the first time in a call, allocates
//! the call's failure state (the runtime is looked up then). A failure is recorded in the
//! call's trail (one `String` per error, the last [`DeadLetter::HISTORY`]); a shared breaker's
//! report and a shared budget's ask each allocate the future of their round trip, and so does
//! a retry's count in the key's record inside a job's claim; only a give-up allocates the dead
//! letter and the future that sends it.

use crate::attempt::{self, Delivery, InBody};
use crate::bounds::{Describe, FromJobguard};
use crate::breaker::{CircuitBreaker, Open, Permit, Reporting};
use crate::budget::{Asking, RetryBudget, Withdrawal};
use crate::dead_letter::{DeadLetter, DeadLetterSink, GiveUp};
use crate::observe::{Event, Job};
use crate::runtime::Current;
use crate::step::Journal;
use crate::{Error, Policy, Verdict};
use core::ops::ControlFlow;
use rand::rngs::SmallRng;
use std::collections::VecDeque;
use std::fmt::{self, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};
use tokio::time::{Instant, Sleep};

/// What follows an outcome that was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Wait this long, then make the next attempt.
    RetryAfter(Duration),
    /// Stop, and dead-letter the job for this reason.
    GiveUp(GiveUp),
}

/// Where a failed outcome came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The job's body (an error, or an `Ok` value that `on_ok` asked to retry).
    Body,
    /// The per-attempt timeout cut the attempt.
    Timeout,
    /// The budget ran out while the attempt ran.
    Budget,
}

/// The policy in one function: after attempt `attempt` failed from `origin` with `verdict`,
/// retry after how long, or give up why. `elapsed` is the time since the first attempt started,
/// given when the policy has a budget (and the budget's end can be represented); `open_for` is
/// how much longer the call's breaker stays open (zero when it is closed, or there is none);
/// `delay` draws the jittered curve's delay for this retry and is called only when the curve is
/// needed.
pub(crate) fn decide(
    policy: &Policy,
    attempt: u32,
    origin: Origin,
    verdict: Verdict,
    elapsed: Option<Duration>,
    open_for: Duration,
    delay: impl FnOnce() -> Duration,
) -> Decision {
    let reason = match origin {
        Origin::Budget => Some(GiveUp::Budget),
        Origin::Body | Origin::Timeout if verdict == Verdict::Fail => Some(GiveUp::Permanent),
        Origin::Body | Origin::Timeout if attempt >= policy.attempts => Some(GiveUp::Exhausted),
        Origin::Body | Origin::Timeout => None,
    };
    if let Some(reason) = reason {
        return Decision::GiveUp(reason);
    }
    let delay = match verdict {
        Verdict::RetryAfter(exact) => exact,
        Verdict::Retry | Verdict::Fail => delay(),
    };
    if let (Some(budget), Some(elapsed)) = (policy.budget, elapsed) {
        // The next attempt could not start inside the budget: give up now, not later.
        if elapsed.checked_add(delay).is_none_or(|next| next >= budget) {
            return Decision::GiveUp(GiveUp::Budget);
        }
    }
    // The breaker (opened by this failure, or by others) would refuse the next attempt: give up
    // now, as that refusal would, rather than announce a retry and sleep only to be refused.
    if open_for > delay {
        return Decision::GiveUp(GiveUp::CircuitOpen);
    }
    Decision::RetryAfter(delay)
}

/// What every call of one job reads and none changes: its name, its policy and its optional
/// parts. `#[retry]` keeps one in a `static` per function when it has no key, sink or payload
/// and its policy is made of literals (else the expansion makes one per call, as
/// [`Policy::run`] does).
#[doc(hidden)]
pub struct Spec<'a> {
    job: &'a str,
    /// The job's static descriptor, when the name is known at compile time.
    known: Option<&'static Job>,
    policy: &'a Policy,
    key: Option<&'a str>,
    sink: Option<&'a dyn DeadLetterSink>,
    payload: Option<&'a dyn Payload>,
    /// Whether the policy sets a time limit on an attempt (a `timeout` or a `budget`).
    timed: bool,
}

impl<'a> Spec<'a> {
    /// The calls of the job `job` declares, under `policy`: what `#[retry]` uses, with `job` in
    /// a `static`.
    pub const fn of(job: &'static Job, policy: &'a Policy) -> Self {
        let mut spec = Self::named(job.name(), policy);
        spec.known = Some(job);
        spec
    }

    /// The calls of the job named `job`, under `policy`.
    pub const fn named(job: &'a str, policy: &'a Policy) -> Self {
        Spec {
            job,
            known: None,
            policy,
            key: None,
            sink: None,
            payload: None,
            timed: policy.timeout.is_some() || policy.budget.is_some(),
        }
    }

    /// The idempotency key, carried into events and the dead letter.
    pub const fn key(mut self, key: &'a str) -> Self {
        self.key = Some(key);
        self
    }

    /// The sink for this job's give-up, instead of the runtime's.
    pub const fn dead_letter(mut self, sink: &'a dyn DeadLetterSink) -> Self {
        self.sink = Some(sink);
        self
    }

    /// The job's arguments, serialized into the dead letter's `payload` if the job gives up, and
    /// never otherwise: the success path neither serializes nor allocates.
    pub fn payload(mut self, payload: &'a dyn Payload) -> Self {
        self.payload = Some(payload);
        self
    }
}

/// The breaker a `#[retry(breaker = ...)]` call hands to its [`Guard`], evaluated once per call.
/// A function, so that a `const` breaker (a new one each time it is named, which would never
/// trip across calls) is a temporary dropped while borrowed: a compile error, not a breaker
/// that silently never opens.
#[doc(hidden)]
pub fn breaker(breaker: &CircuitBreaker) -> &CircuitBreaker {
    breaker
}

/// The dead-letter sink a `#[retry(dead_letter = ...)]` call evaluates once, for its own letters
/// and (with `#[idempotent]`) its crash letter. A function for the reason [`breaker`] is.
#[doc(hidden)]
pub fn sink(sink: &dyn DeadLetterSink) -> &dyn DeadLetterSink {
    sink
}

/// What of jobguard's own can fail a call's attempts, and how such a failure becomes the job's
/// error: the breaker (an open one refuses the attempt) and the policy's time limit (a `timeout`
/// or a `budget` cuts it), as [`Error`]s converted into `E`; and the retry budget, which can
/// refuse a retry (the call then ends with its attempt's own error).
///
/// A call with no breaker and no time limit takes [`Guard::none`], and its error type needs
/// nothing from jobguard.
#[doc(hidden)]
pub struct Guard<'a, E> {
    breaker: Option<&'a CircuitBreaker>,
    retry_budget: Option<&'a RetryBudget>,
    lift: Option<fn(Error) -> E>,
}

impl<'a, E> Guard<'a, E> {
    /// No breaker, and a policy with no time limit: nothing of jobguard's can fail an attempt.
    pub const fn none() -> Self {
        Guard {
            breaker: None,
            retry_budget: None,
            lift: None,
        }
    }

    /// The same guard, with every retry asked of `budget` first.
    pub const fn retry_budget(self, budget: &'a RetryBudget) -> Self {
        Guard {
            retry_budget: Some(budget),
            ..self
        }
    }
}

impl<'a, E: FromJobguard> Guard<'a, E> {
    /// Under `breaker`, if any, and the policy's time limit, failing with a
    /// [`jobguard::Error`](Error) converted into `E`.
    pub const fn of(breaker: Option<&'a CircuitBreaker>) -> Self {
        Guard {
            breaker,
            retry_budget: None,
            lift: Some(<E as From<Error>>::from),
        }
    }
}

/// The retry budget a `#[retry(retry_budget = ...)]` call hands to its [`Guard`], evaluated
/// once per call. A function for the reason [`breaker`] is, and generic so that anything but a
/// [`RetryBudget`] is an error in words.
#[doc(hidden)]
pub fn retry_budget<B: IsRetryBudget + ?Sized>(budget: &B) -> &RetryBudget {
    budget.as_retry_budget()
}

/// What `retry_budget = ...` accepts: a [`RetryBudget`].
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`retry_budget = ...` takes a `jobguard::RetryBudget`, not `{Self}`",
    label = "not a `jobguard::RetryBudget`",
    note = "declare one as a `static` shared by every job that calls the dependency: \
            `static BUDGET: jobguard::RetryBudget = jobguard::RetryBudget::new(0.1, 1, Duration::from_secs(10));`"
)]
pub trait IsRetryBudget {
    /// The budget itself.
    fn as_retry_budget(&self) -> &RetryBudget;
}

impl IsRetryBudget for RetryBudget {
    fn as_retry_budget(&self) -> &RetryBudget {
        self
    }
}

/// What one call of a retried job keeps from one attempt to the next.
#[doc(hidden)]
pub struct Retry<'a, E> {
    spec: &'a Spec<'a>,
    guard: Guard<'a, E>,
    /// Whether anyone sees this call's events (see [`Retry::new`]).
    watched: bool,
    /// The attempt in the body, as [`attempt()`](crate::attempt()) reads it: its number (the
    /// attempts made so far), and what it learned (its start on tokio's clock, asked for by the
    /// body or taken when the attempt first waits or fails; a durable step's run).
    body: InBody,
    /// The first attempt's start on tokio's clock, read only when the policy has a budget.
    started: Option<Instant>,
    /// What only a call whose attempt waited or failed needs: made then, and boxed, so that a
    /// call that succeeds at once carries and drops one pointer of it.
    failed: Option<Box<Failed>>,
    #[cfg(feature = "tracing")]
    span: crate::observe::tracing::JobSpan,
}

/// What a call keeps once an attempt waited or failed: the runtime it reports to, the
/// wall-clock starts its dead letter reports, the jitter's state and the last errors.
struct Failed {
    /// The runtime in scope: its sink and jitter seed serve the rest of the call.
    runtime: Current,
    /// The wall-clock starts of the first attempt that waited or failed, and of the latest.
    first_wall: SystemTime,
    last_wall: SystemTime,
    /// Whether the running attempt's wall-clock start is `last_wall`.
    stamped: bool,
    /// The last delay, for decorrelated jitter.
    previous_delay: Duration,
    /// The jitter's random stream, drawn from the runtime at the first jittered delay.
    rng: Option<SmallRng>,
    /// The last errors, for the dead letter.
    trail: Trail,
    /// The claim this call's job holds on its key, if it runs inside one (`#[idempotent]`
    /// around `#[retry]`): each retry is counted in the key's record before it starts, and the
    /// dead letter reports that count.
    claim: Option<Arc<Journal>>,
}

impl<'a, E> Retry<'a, E> {
    /// The state of one call of the job `spec` describes, under `guard`, with the runtime in
    /// scope now.
    ///
    /// Whether anyone watches is decided here, once, from that runtime: its observer, a
    /// `tracing` subscriber that enables anything, or the `metrics` feature (a recorder may be
    /// set at any time, and its calls cannot be told from a no-op's). The runtime itself is
    /// looked up again when an attempt first waits or fails (the call runs inside one scope, so
    /// it is the same one), and kept for the rest of the call.
    pub fn new(spec: &'a Spec<'a>, guard: Guard<'a, E>) -> Self {
        debug_assert!(
            guard.lift.is_some() || !spec.timed,
            "a policy with a time limit needs a guard that can fail the attempt: Guard::of"
        );
        let watched =
            cfg!(feature = "metrics") || crate::observe::tracing_listens() || Current::observed();
        if let Some(budget) = guard.retry_budget {
            budget.deposit();
        }
        Retry {
            spec,
            guard,
            watched,
            body: InBody::NONE,
            started: None,
            failed: None,
            #[cfg(feature = "tracing")]
            span: crate::observe::tracing::JobSpan::new(),
        }
    }

    /// The number the next attempt will have, from 1.
    pub fn next_attempt(&self) -> u32 {
        self.body.number + 1
    }

    /// One turn of the loop: runs `attempt` as the next attempt, classifies an error with
    /// `on_err` and an `Ok` value with `on_ok` ([`Verdict::Fail`] accepts it, a retryable
    /// verdict retries it like a transient failure; when the attempts run out on a retried
    /// value, that last value is returned and the job is dead-lettered as
    /// [`GiveUp::Exhausted`]). `attempt` is not polled when the breaker refuses it.
    pub fn round<T, F, C, K, V>(
        &mut self,
        attempt: F,
        on_err: C,
        on_ok: K,
    ) -> Round<'_, 'a, T, E, F, C, K>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        K: FnOnce(&T) -> Verdict,
        E: Describe,
    {
        Round {
            retry: self,
            on_err: Some(on_err),
            on_ok: Some(on_ok),
            state: State::Admit,
            permit: None,
            waiting: None,
            attempt,
            timer: None,
        }
    }

    /// Raises `event` for whoever watches, inside the call's span with the `tracing` feature.
    /// Callers on the success path test [`Retry::watched`] first, so that a call nobody
    /// watches builds no event.
    fn emit(&mut self, event: &Event<'_>) {
        if !self.watched {
            return;
        }
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter(self.spec.job, self.spec.key);
        match &self.failed {
            Some(failed) => failed.runtime.emit_job(event, self.spec.known),
            None => Current::get().emit_job(event, self.spec.known),
        }
    }

    /// Admits the next attempt: asks the breaker (its permit goes in `permit`), counts the
    /// attempt, and sets the time limit it runs under on `timer`. `Ok` with what cuts the
    /// attempt at its limit; `Err` with the breaker's refusal.
    ///
    /// Inlined into the round's `poll`, which LLVM does not choose for it: the success path's
    /// floor (2× tokio-retry) is not held without (`suite/benches/retry_calls.rs`: 233
    /// instructions a `#[retry]` call as a call of its own, 203 inlined).
    #[inline(always)]
    fn admit(
        &mut self,
        permit: &mut Option<Permit<'a>>,
        timer: Pin<&mut Option<Sleep>>,
    ) -> Result<Origin, Open> {
        if let Some(breaker) = self.guard.breaker {
            *permit = Some(breaker.acquire()?);
        }
        self.body = InBody::numbered(self.body.number + 1);
        if let Some(failed) = &mut self.failed {
            failed.stamped = false;
        }
        if self.watched {
            self.announce_attempt();
        }
        match self.spec.timed {
            true => Ok(self.arm(timer)),
            false => Ok(Origin::Body),
        }
    }

    /// Tells whoever watches that the attempt admitted now starts.
    fn announce_attempt(&mut self) {
        #[cfg(feature = "tracing")]
        self.span
            .record_attempt(self.spec.job, self.spec.key, self.body.number);
        self.emit(&Event::Attempt {
            job: self.spec.job,
            key: self.spec.key,
            attempt: self.body.number,
        });
    }

    /// Sets the attempt's time limit on `timer`, and says what cuts the attempt there.
    fn arm(&mut self, mut timer: Pin<&mut Option<Sleep>>) -> Origin {
        match self.limit() {
            Some((at, reason)) => {
                timer.set(Some(tokio::time::sleep_until(at)));
                reason
            }
            None => Origin::Body,
        }
    }

    /// The attempt's time limit, and what cuts it there: the nearer of its timeout and the
    /// budget's end. A limit too far out to represent is no limit.
    fn limit(&mut self) -> Option<(Instant, Origin)> {
        let (timeout, budget) = (self.spec.policy.timeout, self.spec.policy.budget);
        let now = Instant::now();
        let start = *self.started.get_or_insert(now);
        let budget_end = budget.and_then(|b| start.checked_add(b));
        let timeout_end = timeout.and_then(|t| now.checked_add(t));
        match (timeout_end, budget_end) {
            (Some(t), Some(b)) if b < t => Some((b, Origin::Budget)),
            (Some(t), _) => Some((t, Origin::Timeout)),
            (None, Some(b)) => Some((b, Origin::Budget)),
            (None, None) => None,
        }
    }

    /// Polls the attempt with its number in scope for [`attempt()`](crate::attempt()), inside
    /// the call's span.
    fn poll_attempt<R>(&mut self, poll: impl FnOnce() -> R) -> R {
        #[cfg(feature = "tracing")]
        let _entered = match self.watched {
            true => self.span.enter(self.spec.job, self.spec.key),
            false => None,
        };
        attempt::poll_in(&mut self.body, poll)
    }

    /// Takes the running attempt's wall-clock start, once: when it first waits or fails. That
    /// is its start to within one poll. Returns the call's failure state.
    fn stamp(&mut self) -> &mut Failed {
        if self.body.started().is_none() {
            let learned = self.body.learned.get_or_insert_default();
            learned.started = Some(Instant::now());
        }
        let base = self.spec.policy.base;
        let failed = self.failed.get_or_insert_with(|| {
            let now = SystemTime::now();
            Box::new(Failed {
                runtime: Current::get(),
                first_wall: now,
                last_wall: now,
                stamped: true,
                previous_delay: base,
                rng: None,
                trail: Trail::new(),
                claim: (self.spec.key).and_then(|key| crate::step::of_job(self.spec.job, key)),
            })
        });
        if !failed.stamped {
            failed.last_wall = SystemTime::now();
            failed.stamped = true;
        }
        failed
    }

    /// Books an accepted outcome: the breaker's permit, the event.
    fn succeeded(&mut self, permit: Option<Permit<'a>>) {
        if let Some(permit) = permit {
            permit.success();
        }
        if self.watched {
            self.emit(&Event::Succeeded {
                job: self.spec.job,
                key: self.spec.key,
                attempts: self.body.number,
            });
        }
    }

    /// Books an outcome that was not accepted (an error, a cut attempt, or an `Ok` that
    /// `on_ok` retried): notes it for the dead letter and tells the breaker. A transient failure
    /// (or a cut attempt) counts against the breaker; a permanent one says nothing about the
    /// dependency's health, and its permit is dropped here, neutral. `Some` when a shared
    /// breaker hears of the failure through Redis: the round waits for its answer before
    /// deciding, so that an opening this failure caused stops the call now.
    fn book<T>(
        &mut self,
        result: &Result<T, E>,
        origin: Origin,
        verdict: Verdict,
        permit: Option<Permit<'a>>,
    ) -> Option<Reporting>
    where
        E: Describe,
    {
        self.stamp().trail.failed(describe(result));
        match permit {
            Some(permit) if verdict.is_retryable() || origin == Origin::Budget => permit.fail(),
            _ => None,
        }
    }

    /// Decides what follows a booked outcome: the delay before the next attempt (once the
    /// retry budget, if any, grants it), or the give-up, with the result to return once its
    /// letter is on its way.
    fn failed<T>(
        &mut self,
        result: Result<T, E>,
        origin: Origin,
        verdict: Verdict,
    ) -> Next<'a, T, E>
    where
        E: Describe,
    {
        let elapsed = self.spec.policy.budget.and_then(|budget| {
            let start = *self.started.get_or_insert_with(Instant::now);
            start.checked_add(budget).map(|_| start.elapsed())
        });
        let open_for = match (self.guard.breaker, verdict.is_retryable()) {
            (Some(breaker), true) => breaker.retry_in(),
            _ => Duration::ZERO,
        };
        let attempt = self.body.number;
        let decision = decide(
            self.spec.policy,
            attempt,
            origin,
            verdict,
            elapsed,
            open_for,
            || self.jittered(attempt),
        );
        match decision {
            Decision::RetryAfter(delay) => match self.guard.retry_budget.map(RetryBudget::withdraw)
            {
                None | Some(Withdrawal::Granted) => self.granted(true, delay, verdict, result),
                Some(Withdrawal::Refused) => self.granted(false, delay, verdict, result),
                Some(Withdrawal::Asking(asking)) => Next::Ask {
                    result,
                    delay,
                    verdict,
                    asking,
                },
            },
            // The breaker will still be open when the next attempt would start: the call is
            // refused now, as that attempt would be, with the refusal as its error.
            Decision::GiveUp(GiveUp::CircuitOpen) => {
                let refused = Error::CircuitOpen { retry_in: open_for };
                self.stamp().trail.failed(&refused);
                let sending = self.give_up(GiveUp::CircuitOpen, refused.to_string());
                let result = match self.guard.lift {
                    Some(lift) => Err(lift(refused)),
                    None => result,
                };
                Next::GiveUp(result, sending)
            }
            Decision::GiveUp(reason) => {
                let sending = self.give_up(reason, describe(&result).to_string());
                Next::GiveUp(result, sending)
            }
        }
    }

    /// The retry budget's answer to the retry after `delay` (granted when the call has none).
    /// Granted, the delay is kept for decorrelated jitter and the retry announced; refused, the
    /// call ends with the attempt's result, and the job gives up as [`GiveUp::RetryBudget`].
    fn granted<T>(
        &mut self,
        granted: bool,
        delay: Duration,
        verdict: Verdict,
        result: Result<T, E>,
    ) -> Next<'a, T, E>
    where
        E: Describe,
    {
        if !granted {
            let sending = self.give_up(GiveUp::RetryBudget, describe(&result).to_string());
            return Next::GiveUp(result, sending);
        }
        self.stamp().previous_delay = delay;
        self.emit(&Event::Retry {
            job: self.spec.job,
            key: self.spec.key,
            attempt: self.body.number,
            delay,
            verdict,
            error: describe(&result),
        });
        Next::RetryAfter(delay)
    }

    /// The breaker refused the next attempt: no attempt is made or counted, and the call gives
    /// up (a retry would only be refused again: [`decide`] gives up when the breaker is open
    /// past the next delay, and here it is open now).
    fn refused<T>(&mut self, open: Open) -> (Result<T, E>, Errand<'a>) {
        let refused = Error::CircuitOpen {
            retry_in: open.retry_in,
        };
        self.stamp().trail.failed(&refused);
        let sending = self.give_up(GiveUp::CircuitOpen, refused.to_string());
        let lift = self
            .guard
            .lift
            .expect("only a guard made with `Guard::of` has a breaker");
        (Err(lift(refused)), sending)
    }

    /// The count of the next attempt in the job's claim, when the call runs inside one.
    fn count_next(&self) -> Option<Errand<'a>> {
        let claim = self.failed.as_ref()?.claim.clone()?;
        Some(Box::pin(async move { claim.attempted().await }))
    }

    fn jittered(&mut self, retry: u32) -> Duration {
        let p = self.spec.policy;
        let curve = p.delay(retry);
        if !p.jitter.is_random() {
            return curve;
        }
        let mut rng = match self.stamp().rng.take() {
            Some(rng) => rng,
            None => self.stamp().runtime.rng(),
        };
        let failed = self.stamp();
        let delay = p
            .jitter
            .apply(curve, failed.previous_delay, p.base, p.cap, &mut rng);
        failed.rng = Some(rng);
        delay
    }

    /// The dead letter, raised as an event and sent to the sink by the returned future, which
    /// reports a sink's failure and never fails itself.
    ///
    /// One job, one dead letter: on a runner's delivery that is not the last, a give-up that
    /// another delivery could get past (not a permanent failure) writes no letter; the error is
    /// handed back to the runner, which delivers the job again. The letter of the last delivery
    /// counts the attempts of every delivery, taking each earlier one to have made all of the
    /// policy's attempts (see `jobguard::apalis` for when that is exact).
    fn give_up(&mut self, reason: GiveUp, error: String) -> Errand<'a> {
        let delivery = Delivery::current();
        let this_delivery = self.body.number;
        if let Some(delivery) = delivery
            && !delivery.last
            && redeliverable(reason)
        {
            self.emit(&Event::HandedBack {
                job: self.spec.job,
                key: self.spec.key,
                attempts: this_delivery,
                delivery,
                reason,
                error: &error,
            });
            return Box::pin(std::future::ready(()));
        }
        // A redriven job that gives up again leaves the redriven letter as its one letter:
        // nothing is raised or sent.
        if crate::dead_letter::redriven(self.spec.job, self.spec.key) {
            return Box::pin(std::future::ready(()));
        }
        let claim = self.failed.as_ref().and_then(|f| f.claim.as_deref());
        // The job's claim was taken over while this call ran (a worker paused past its lease):
        // the job is the other worker's, which settles it; this one writes no letter.
        if claim.is_some_and(Journal::lost) {
            return Box::pin(std::future::ready(()));
        }
        // The count in the key's record when the job holds a claim (every attempt of every
        // delivery, crashed ones too); else inferred from the delivery's number.
        let counted = claim.and_then(Journal::attempts);
        let attempts = counted.unwrap_or_else(|| {
            delivery.map_or(this_delivery, |d| {
                (d.number.saturating_sub(1))
                    .saturating_mul(self.spec.policy.attempts)
                    .saturating_add(this_delivery)
            })
        });
        let failed = self.stamp();
        let (first, last) = (failed.first_wall, failed.last_wall);
        let history = failed.trail.take();
        let letter = DeadLetter::new(
            self.spec.job,
            self.spec.key.map(str::to_owned),
            reason,
            attempts,
            error,
            first,
            last,
        );
        let letter = with_payload(letter.with_history(history), self.spec.payload);
        self.emit(&Event::DeadLetter(&letter));
        // A letter the sink refuses is raised to whoever watches this call, as `emit` would.
        let watchers = self
            .watched
            .then(|| (self.stamp().runtime.to_owned(), self.spec.known));
        let lost = move |event: &Event<'_>| {
            if let Some((runtime, known)) = &watchers {
                runtime.emit_job(event, *known);
            }
        };
        let sink = self.spec.sink;
        let runtime_sink = self.stamp().runtime.dead_letters().clone();
        let sending = async move {
            let sink = sink.unwrap_or(&*runtime_sink);
            // Settled only once the sink took the letter: a job whose letter was lost is not
            // settled, so a runner may deliver it again rather than drop it with no record.
            if crate::dead_letter::deliver_observed(sink, letter, lost).await {
                Delivery::settle();
            }
        };
        #[cfg(feature = "tracing")]
        let sending = tracing::Instrument::instrument(
            sending,
            self.span
                .handle(self.spec.job, self.spec.key)
                .unwrap_or_else(tracing::Span::none),
        );
        Box::pin(sending)
    }
}

/// Whether a give-up for `reason` is one that a later delivery of the job could get past: the
/// attempts, the time budget or the retry budget ran out, or the breaker was open. A permanent
/// failure is not.
const fn redeliverable(reason: GiveUp) -> bool {
    matches!(
        reason,
        GiveUp::Exhausted | GiveUp::Budget | GiveUp::CircuitOpen | GiveUp::RetryBudget
    )
}

/// A round trip the round awaits for its effect, not an answer: the dead letter on its way to
/// the sink, or the next attempt's count in the key's record.
type Errand<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// What follows a failed outcome, as [`Retry::failed`] decides it.
enum Next<'a, T, E> {
    RetryAfter(Duration),
    /// Give up, returning this result once the letter is on its way.
    GiveUp(Result<T, E>, Errand<'a>),
    /// Retry after `delay` if the shared retry budget grants it, else give up with `result`.
    Ask {
        result: Result<T, E>,
        delay: Duration,
        verdict: Verdict,
        asking: Asking,
    },
}

/// The failure an `on_ok` retry books: the value itself need not be `Display`.
struct OkRetried;

impl Display for OkRetried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the `on_ok` classifier asked to retry the job's `Ok` value")
    }
}

/// A failed outcome as its dead letter and events write it.
fn describe<T, E: Describe>(result: &Result<T, E>) -> &dyn Display {
    match result {
        Ok(_) => &OkRetried,
        Err(error) => error,
    }
}

pin_project_lite::pin_project! {
    /// One turn of the retry loop, from [`Retry::round`]: see the module's table of states.
    /// Resolves to `Break` with the call's result, or `Continue` when the loop makes the next
    /// attempt.
    #[must_use = "a round does nothing unless awaited"]
    pub struct Round<'r, 'a, T, E, F, C, K> {
        retry: &'r mut Retry<'a, E>,
        on_err: Option<C>,
        on_ok: Option<K>,
        state: State,
        // The breaker's permit while the attempt runs.
        permit: Option<Permit<'a>>,
        // What the round waits on in the `Wait` state, with the failed attempt's result.
        waiting: Option<Waiting<'a, T, E>>,
        #[pin]
        attempt: F,
        // The attempt's time limit while it runs; the delay before the next attempt while the
        // round sleeps. `None` when there is neither.
        #[pin]
        timer: Option<Sleep>,
    }
}

/// Where a [`Round`] is (what it holds for each state is in its other fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not polled yet.
    Admit,
    /// The attempt runs; the timer, when set, cuts it for the reason `cut` gives (its timeout
    /// or the budget's end).
    Run { cut: Origin },
    /// The round waits on what `waiting` says: the fleet's answer, the dead letter on its way,
    /// or the next attempt's count.
    Wait,
    /// The attempt failed; the next one starts when the timer fires (at once without one).
    Sleep,
    /// The round resolved.
    Done,
}

/// What a round in the `Wait` state waits on, each with the failed attempt's result.
enum Waiting<'a, T, E> {
    /// A shared breaker hears of the failure (one round trip); the failure is decided on once
    /// the fleet's answer is in.
    Report {
        result: Result<T, E>,
        origin: Origin,
        verdict: Verdict,
        reporting: Reporting,
    },
    /// The policy would retry after `delay`, and a shared retry budget is asked for the retry
    /// (one round trip).
    Ask {
        result: Result<T, E>,
        delay: Duration,
        verdict: Verdict,
        asking: Asking,
    },
    /// The call gave up: the dead letter is on its way, and the result is returned after it.
    Letter {
        result: Result<T, E>,
        sending: Errand<'a>,
    },
    /// The delay is over, and the next attempt is counted in the job's claim (one round trip)
    /// before it starts.
    Count { counting: Errand<'a> },
}

/// Enters the state that `next` says follows a failed outcome.
fn enter<'a, T, E>(
    next: Next<'a, T, E>,
    state: &mut State,
    mut timer: Pin<&mut Option<Sleep>>,
    waiting: &mut Option<Waiting<'a, T, E>>,
) {
    *state = match next {
        Next::RetryAfter(delay) => {
            if !delay.is_zero() {
                timer.set(Some(tokio::time::sleep(delay)));
            }
            State::Sleep
        }
        Next::GiveUp(result, sending) => {
            *waiting = Some(Waiting::Letter { result, sending });
            State::Wait
        }
        Next::Ask {
            result,
            delay,
            verdict,
            asking,
        } => {
            *waiting = Some(Waiting::Ask {
                result,
                delay,
                verdict,
                asking,
            });
            State::Wait
        }
    };
}

impl<'a, T, E, F, C, V, K> Future for Round<'_, 'a, T, E, F, C, K>
where
    F: Future<Output = Result<T, E>>,
    C: FnOnce(&E) -> V,
    V: Into<Verdict>,
    K: FnOnce(&T) -> Verdict,
    E: Describe,
{
    type Output = ControlFlow<Result<T, E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if *this.state == State::Admit {
            match this.retry.admit(this.permit, this.timer.as_mut()) {
                Ok(cut) => *this.state = State::Run { cut },
                Err(open) => {
                    let (result, sending) = this.retry.refused(open);
                    *this.waiting = Some(Waiting::Letter { result, sending });
                    *this.state = State::Wait;
                }
            }
        }
        if let State::Run { cut } = *this.state {
            let attempt = this.attempt.as_mut();
            let polled = this.retry.poll_attempt(|| attempt.poll(cx));
            let (result, origin) = match polled {
                Poll::Ready(result) => (result, Origin::Body),
                Poll::Pending => {
                    let limit = this.timer.as_mut().as_pin_mut();
                    if !limit.is_some_and(|limit| limit.poll(cx).is_ready()) {
                        this.retry.stamp();
                        return Poll::Pending;
                    }
                    // Only a guard made with `Guard::of` sets a time limit.
                    let lift = this.retry.guard.lift.expect("a limit needs Guard::of");
                    let error = match cut {
                        Origin::Budget => Error::Budget,
                        _ => Error::Timeout,
                    };
                    (Err(lift(error)), cut)
                }
            };
            let verdict = match (&result, origin) {
                (Ok(value), _) => this.on_ok.take().map_or(Verdict::Fail, |k| k(value)),
                (Err(error), Origin::Body) => this
                    .on_err
                    .take()
                    .map_or(Verdict::Fail, |c| c(error).into()),
                // The runtime's own failures are classified by the runtime.
                (Err(_), Origin::Timeout) => Verdict::Retry,
                (Err(_), _) => Verdict::Fail,
            };
            let permit = this.permit.take();
            if result.is_ok() && verdict == Verdict::Fail {
                this.retry.succeeded(permit);
                *this.state = State::Done;
                return Poll::Ready(ControlFlow::Break(result));
            }
            this.timer.set(None);
            match this.retry.book(&result, origin, verdict, permit) {
                Some(reporting) => {
                    *this.waiting = Some(Waiting::Report {
                        result,
                        origin,
                        verdict,
                        reporting,
                    });
                    *this.state = State::Wait;
                }
                None => {
                    let next = this.retry.failed(result, origin, verdict);
                    enter(next, this.state, this.timer.as_mut(), this.waiting);
                }
            }
        }
        // The attempt failed: what follows it.
        loop {
            match *this.state {
                State::Admit | State::Run { .. } => unreachable!("a round admits and runs once"),
                State::Wait => {
                    let waited = match this.waiting.as_mut().expect("a waiting round") {
                        Waiting::Report { reporting, .. } => {
                            reporting.as_mut().poll(cx).map(|()| true)
                        }
                        Waiting::Ask { asking, .. } => asking.as_mut().poll(cx),
                        Waiting::Letter { sending, .. } | Waiting::Count { counting: sending } => {
                            sending.as_mut().poll(cx).map(|()| true)
                        }
                    };
                    let granted = ready!(waited);
                    let next = match this.waiting.take().expect("a waiting round") {
                        Waiting::Report {
                            result,
                            origin,
                            verdict,
                            ..
                        } => this.retry.failed(result, origin, verdict),
                        Waiting::Ask {
                            result,
                            delay,
                            verdict,
                            ..
                        } => this.retry.granted(granted, delay, verdict, result),
                        Waiting::Letter { result, .. } => {
                            *this.state = State::Done;
                            return Poll::Ready(ControlFlow::Break(result));
                        }
                        Waiting::Count { .. } => {
                            *this.state = State::Done;
                            return Poll::Ready(ControlFlow::Continue(()));
                        }
                    };
                    enter(next, this.state, this.timer.as_mut(), this.waiting);
                }
                State::Sleep => {
                    if let Some(delay) = this.timer.as_mut().as_pin_mut() {
                        ready!(delay.poll(cx));
                    }
                    if let Some(counting) = this.retry.count_next() {
                        *this.waiting = Some(Waiting::Count { counting });
                        *this.state = State::Wait;
                        continue;
                    }
                    *this.state = State::Done;
                    return Poll::Ready(ControlFlow::Continue(()));
                }
                State::Done => panic!("a retry round polled after it resolved"),
            }
        }
    }
}

/// The `on_ok` of a call without one: every `Ok` value is accepted.
#[doc(hidden)]
pub fn accept<T>(_: &T) -> Verdict {
    Verdict::Fail
}

/// Arguments a dead letter carries for a redrive: serialized when, and only when, a letter is
/// written.
#[diagnostic::on_unimplemented(
    message = "`#[retry(payload = ...)]` cannot carry `{Self}` in a dead letter",
    label = "the payload is serialized with serde into the letter, so it needs `serde::Serialize + Sync`",
    note = "derive `serde::Serialize` for the arguments' types, or leave out the ones that cannot be serialized"
)]
pub trait Payload: Sync {
    /// The arguments as JSON.
    fn to_json(&self) -> Result<serde_json::Value, serde_json::Error>;
}

#[diagnostic::do_not_recommend]
impl<P: serde::Serialize + Sync + ?Sized> Payload for P {
    fn to_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self)
    }
}

/// What a call gathers for its dead letter on the failure path: the last errors. Empty until
/// the first failure; nothing here allocates or serializes while attempts succeed.
struct Trail {
    history: VecDeque<String>,
}

impl Trail {
    const fn new() -> Self {
        Trail {
            history: VecDeque::new(),
        }
    }

    /// Notes one failure (an attempt's error, a retried value, or a refusal by the breaker).
    fn failed(&mut self, error: &dyn Display) {
        if self.history.len() == DeadLetter::HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(error.to_string());
    }

    /// The errors noted, oldest first, for the dead letter's history.
    fn take(&mut self) -> Vec<String> {
        Vec::from(std::mem::take(&mut self.history))
    }
}

/// `letter` with `payload` serialized into it. A payload that cannot be serialized is reported
/// and left out: the letter itself is never lost for it. The retry engine's letters and the
/// idempotency guard's crash letter are sealed alike.
pub(crate) fn with_payload(letter: DeadLetter, payload: Option<&dyn Payload>) -> DeadLetter {
    let payload = payload.and_then(|p| match p.to_json() {
        Ok(value) => Some(value),
        Err(e) => {
            crate::observe::log_error(format_args!(
                "jobguard: job {} gave up and its payload could not be serialized: {e}",
                letter.job
            ));
            None
        }
    });
    letter.with_payload(payload)
}

impl Policy {
    /// Runs `f` under this policy without any macro: the loop behind `#[retry]`.
    ///
    /// `f` is called with the attempt number (from 1), once per attempt. Failures are
    /// classified by [`Transient`](crate::Transient); the give-up goes to the runtime's
    /// dead-letter sink, and the last error is returned.
    ///
    /// ```
    /// use jobguard::{Jitter, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let policy = Policy::new().attempts(3).jitter(Jitter::None);
    /// let got = policy
    ///     .run("fetch", async |attempt| {
    ///         if attempt < 3 {
    ///             Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    ///         } else {
    ///             Ok(attempt)
    ///         }
    ///     })
    ///     .await;
    /// assert_eq!(got.unwrap(), 3);
    /// # }
    /// ```
    pub async fn run<T, E, F>(&self, job: &str, f: F) -> Result<T, E>
    where
        F: AsyncFnMut(u32) -> Result<T, E>,
        E: crate::Transient + From<Error> + Describe,
    {
        self.run_if_ok(job, f, accept).await
    }

    /// [`Policy::run`], retrying `Ok` values too: `on_ok` returning [`Verdict::Retry`],
    /// [`Verdict::RetryAfter`] or `true` retries the value like a transient failure. When the
    /// attempts run out on a retried value, that last value is returned and the job is
    /// dead-lettered as [`GiveUp::Exhausted`].
    ///
    /// ```
    /// use jobguard::{Jitter, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let policy = Policy::new().attempts(3).jitter(Jitter::None);
    /// let status = policy
    ///     .run_if_ok(
    ///         "poll",
    ///         async |attempt| Ok::<u16, std::io::Error>(if attempt < 2 { 503 } else { 200 }),
    ///         |status: &u16| *status == 503,
    ///     )
    ///     .await;
    /// assert_eq!(status.unwrap(), 200);
    /// # }
    /// ```
    pub async fn run_if_ok<T, E, F, K, V>(&self, job: &str, mut f: F, on_ok: K) -> Result<T, E>
    where
        F: AsyncFnMut(u32) -> Result<T, E>,
        E: crate::Transient + From<Error> + Describe,
        K: Fn(&T) -> V,
        V: Into<Verdict>,
    {
        let spec = Spec::named(job, self);
        let mut retry = Retry::new(&spec, Guard::of(None));
        loop {
            let attempt = retry.next_attempt();
            let round = retry.round(f(attempt), crate::Transient::verdict, |value: &T| {
                on_ok(value).into()
            });
            if let ControlFlow::Break(done) = round.await {
                return done;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Jitter;

    const POLICY: Policy = Policy::new()
        .attempts(3)
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(1))
        .jitter(Jitter::None);

    fn curve(retry: u32) -> impl FnOnce() -> Duration {
        move || POLICY.delay(retry)
    }

    /// No breaker, or a closed one.
    const CLOSED: Duration = Duration::ZERO;

    fn never() -> Duration {
        panic!("the curve is not needed here")
    }

    #[test]
    fn a_transient_failure_waits_on_the_curve() {
        for (attempt, ms) in [(1, 100), (2, 200)] {
            assert_eq!(
                decide(
                    &POLICY,
                    attempt,
                    Origin::Body,
                    Verdict::Retry,
                    None,
                    CLOSED,
                    curve(attempt)
                ),
                Decision::RetryAfter(Duration::from_millis(ms))
            );
        }
    }

    #[test]
    fn retry_after_waits_exactly_and_skips_the_curve() {
        let exact = Verdict::RetryAfter(Duration::from_secs(7));
        assert_eq!(
            decide(&POLICY, 1, Origin::Body, exact, None, CLOSED, never),
            Decision::RetryAfter(Duration::from_secs(7))
        );
    }

    #[test]
    fn the_last_attempt_gives_up_exhausted() {
        assert_eq!(
            decide(
                &POLICY,
                3,
                Origin::Body,
                Verdict::Retry,
                None,
                CLOSED,
                never
            ),
            Decision::GiveUp(GiveUp::Exhausted)
        );
        let once = Policy::new().attempts(1);
        assert_eq!(
            decide(
                &once,
                1,
                Origin::Timeout,
                Verdict::Retry,
                None,
                CLOSED,
                never
            ),
            Decision::GiveUp(GiveUp::Exhausted)
        );
    }

    #[test]
    fn a_permanent_failure_gives_up_at_once() {
        assert_eq!(
            decide(&POLICY, 1, Origin::Body, Verdict::Fail, None, CLOSED, never),
            Decision::GiveUp(GiveUp::Permanent)
        );
    }

    #[test]
    fn a_spent_budget_gives_up_with_its_reason() {
        assert_eq!(
            decide(
                &POLICY,
                1,
                Origin::Budget,
                Verdict::Retry,
                None,
                CLOSED,
                never
            ),
            Decision::GiveUp(GiveUp::Budget)
        );
    }

    #[test]
    fn no_attempt_starts_that_the_budget_could_not_hold() {
        let budget = POLICY.budget(Duration::from_millis(250));
        let elapsed = |ms| Some(Duration::from_millis(ms));
        assert_eq!(
            decide(
                &budget,
                1,
                Origin::Body,
                Verdict::Retry,
                elapsed(100),
                CLOSED,
                curve(1)
            ),
            Decision::RetryAfter(Duration::from_millis(100))
        );
        assert_eq!(
            decide(
                &budget,
                1,
                Origin::Body,
                Verdict::Retry,
                elapsed(150),
                CLOSED,
                curve(1)
            ),
            Decision::GiveUp(GiveUp::Budget)
        );
        let forever = Verdict::RetryAfter(Duration::MAX);
        assert_eq!(
            decide(&budget, 1, Origin::Body, forever, elapsed(1), CLOSED, never),
            Decision::GiveUp(GiveUp::Budget)
        );
        // An unrepresentable budget's end is no limit: the engine passes no elapsed time.
        assert_eq!(
            decide(&budget, 1, Origin::Body, forever, None, CLOSED, never),
            Decision::RetryAfter(Duration::MAX)
        );
    }

    #[test]
    fn a_breaker_open_past_the_delay_gives_up_now_and_one_that_reopens_first_waits() {
        let open = |ms| Duration::from_millis(ms);
        assert_eq!(
            decide(
                &POLICY,
                1,
                Origin::Body,
                Verdict::Retry,
                None,
                open(30_000),
                curve(1)
            ),
            Decision::GiveUp(GiveUp::CircuitOpen)
        );
        assert_eq!(
            decide(
                &POLICY,
                1,
                Origin::Body,
                Verdict::Retry,
                None,
                open(100),
                curve(1)
            ),
            Decision::RetryAfter(Duration::from_millis(100)),
            "half-open when the wait ends: the next attempt probes"
        );
        let exact = Verdict::RetryAfter(Duration::from_secs(60));
        assert_eq!(
            decide(&POLICY, 1, Origin::Body, exact, None, open(30_000), never),
            Decision::RetryAfter(Duration::from_secs(60))
        );
        // The failure's own reason comes first.
        assert_eq!(
            decide(
                &POLICY,
                3,
                Origin::Body,
                Verdict::Retry,
                None,
                open(30_000),
                never
            ),
            Decision::GiveUp(GiveUp::Exhausted)
        );
    }

    /// One call driven the way `#[retry]` expands it, `attempt(n)` making attempt `n`; every
    /// error is retried.
    async fn call<'a, T, Fut>(
        spec: &'a Spec<'a>,
        breaker: Option<&'a CircuitBreaker>,
        mut attempt: impl FnMut(u32) -> Fut,
    ) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut retry = Retry::new(spec, Guard::of(breaker));
        loop {
            let n = retry.next_attempt();
            let round = retry.round(attempt(n), |_: &Error| Verdict::Retry, accept);
            if let ControlFlow::Break(done) = round.await {
                return done;
            }
        }
    }

    const ZERO: Policy = Policy::new()
        .attempts(3)
        .base(Duration::ZERO)
        .cap(Duration::ZERO)
        .jitter(Jitter::None);

    #[test]
    fn a_round_polled_again_after_it_resolved_panics_and_admits_nothing() {
        let spec = Spec::named("job", &ZERO);
        let breaker = CircuitBreaker::new(5, Duration::from_secs(30));
        let mut retry = Retry::new(&spec, Guard::of(Some(&breaker)));
        let mut round = std::pin::pin!(retry.round(
            async { Ok::<u32, Error>(7) },
            |_: &Error| Verdict::Retry,
            accept
        ));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(matches!(
            round.as_mut().poll(&mut cx),
            Poll::Ready(ControlFlow::Break(Ok(7)))
        ));
        // A resolved round is done: polled again, it panics rather than ask the breaker again
        // (open now: that would be a refusal, a give-up and a dead letter for a call that
        // succeeded).
        breaker.trip();
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = round.as_mut().poll(&mut cx);
        }));
        assert!(again.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_pending_at_its_first_poll_keeps_its_number() {
        let spec = Spec::named("job", &ZERO);
        let got = call(&spec, None, |n| async move {
            let before = crate::attempt().map(|a| a.number);
            tokio::task::yield_now().await;
            let after = crate::attempt().map(|a| a.number);
            Ok((n, before, after))
        })
        .await;
        assert_eq!(got.unwrap(), (1, Some(1), Some(1)));
        assert!(crate::attempt().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_first_attempt_goes_on_to_the_next() {
        let spec = Spec::named("job", &ZERO);
        let mut seen = Vec::new();
        let got = call(&spec, None, |n| {
            seen.push(crate::attempt().map(|a| a.number));
            async move {
                match crate::attempt().map(|a| a.number) {
                    Some(1) => Err(Error::Timeout),
                    other => Ok((n, other)),
                }
            }
        })
        .await;
        assert_eq!(got.unwrap(), (2, Some(2)));
        // The attempt is in scope while it is polled, not while it is made.
        assert_eq!(seen, [None, None]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_breaker_open_at_the_first_attempt_refuses_it() {
        let breaker = CircuitBreaker::new(1, Duration::from_secs(30));
        breaker.acquire().unwrap().failure();
        let sink = crate::MemoryDeadLetters::new();
        let spec = Spec::named("job", &ZERO).dead_letter(&sink);
        let mut made = 0;
        let got: Result<(), Error> = call(&spec, Some(&breaker), |_| {
            made += 1;
            async { Ok(()) }
        })
        .await;
        assert!(matches!(got, Err(Error::CircuitOpen { .. })), "{got:?}");
        let letters = sink.letters();
        assert_eq!(letters.len(), 1);
        assert_eq!(
            (letters[0].reason, letters[0].attempts),
            (GiveUp::CircuitOpen, 0)
        );
        // The future was made (the loop makes one per round) but never polled.
        assert_eq!(made, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_hears_of_a_success_and_of_a_failure() {
        let breaker = CircuitBreaker::new(1, Duration::from_secs(30));
        let once = ZERO.attempts(1);
        let sink = crate::MemoryDeadLetters::new();
        let spec = Spec::named("job", &once);
        let ok = call(&spec, Some(&breaker), |_| async { Ok(7) }).await;
        assert_eq!(ok.unwrap(), 7);
        assert_eq!(breaker.state(), crate::BreakerState::Closed);
        let spec = Spec::named("job", &once).dead_letter(&sink);
        let failed: Result<(), Error> =
            call(&spec, Some(&breaker), |_| async { Err(Error::Timeout) }).await;
        assert!(matches!(failed, Err(Error::Timeout)));
        assert_eq!(breaker.state(), crate::BreakerState::Open);
        assert_eq!(sink.letters()[0].reason, GiveUp::Exhausted);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_gives_its_slot_back() {
        let breaker = CircuitBreaker::new(1, Duration::ZERO);
        breaker.trip();
        let spec = Spec::named("job", &ZERO);
        let mut retry = Retry::new(&spec, Guard::of(Some(&breaker)));
        {
            let round = retry.round(
                std::future::pending::<Result<(), Error>>(),
                |_: &Error| Verdict::Retry,
                accept,
            );
            let mut round = std::pin::pin!(round);
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(round.as_mut().poll(&mut cx).is_pending());
            assert!(breaker.acquire().is_err(), "the one probe slot is taken");
        }
        assert!(breaker.acquire().expect("the slot is back").is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_delay_sets_no_timer_and_a_delay_sleeps_on_tokio_s_clock() {
        let spec = Spec::named("job", &ZERO);
        let start = tokio::time::Instant::now();
        let got = call(&spec, None, |n| async move {
            if n < 3 { Err(Error::Timeout) } else { Ok(n) }
        })
        .await;
        assert_eq!(got.unwrap(), 3);
        assert_eq!(start.elapsed(), Duration::ZERO);
        let slow = ZERO
            .base(Duration::from_millis(100))
            .cap(Duration::from_secs(1));
        let spec = Spec::named("job", &slow);
        let got = call(&spec, None, |n| async move {
            if n < 3 { Err(Error::Timeout) } else { Ok(n) }
        })
        .await;
        assert_eq!(got.unwrap(), 3);
        assert_eq!(start.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ok_that_on_ok_retries_goes_round_again() {
        let spec = Spec::named("job", &ZERO);
        let mut retry = Retry::new(&spec, Guard::of(None));
        let got: Result<u32, Error> = loop {
            let n = retry.next_attempt();
            let round = retry.round(
                async move { Ok(n) },
                |_: &Error| Verdict::Retry,
                |n: &u32| {
                    if *n < 2 {
                        Verdict::Retry
                    } else {
                        Verdict::Fail
                    }
                },
            );
            if let ControlFlow::Break(done) = round.await {
                break done;
            }
        };
        assert_eq!(got.unwrap(), 2);
    }

    #[test]
    fn the_trail_keeps_the_last_errors() {
        let mut trail = Trail::new();
        for n in 0..7 {
            trail.failed(&n);
        }
        assert_eq!(trail.take(), ["2", "3", "4", "5", "6"]);
    }
}
