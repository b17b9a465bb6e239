//! The retry engine: one attempt at a time, classified, delayed, given up on.
//!
//! [`Spec`] is what every call of one job reads (its name, policy, key, sink and payload; a
//! `static` per `#[retry]` function when nothing in it is made per call). [`Retry`] is what one
//! call keeps from one attempt to the next (the attempt count, what a dead letter will need).
//! [`Round`] is one turn of the loop: a future that admits an attempt, runs it, and then sleeps
//! before the next one or gives up. What a round holds for the runtime's own checks is its
//! [`Guard`], a type: nothing ([`Unguarded`]), the breaker and its permit ([`Permitted`]), or
//! those and the attempt's time limit ([`Guarded`]), so that a round with none of them has no
//! code or state for them.
//! `#[retry]` expands to a `loop` over [`Retry::attempt`] (or its guarded forms) and
//! [`Policy::run`] is the same loop for closures; both drive [`Round`]. A `#[retry]` job with no
//! time limit, no `on_ok` classifier and no transaction (and a lean [`Policy::run`] call)
//! starts with [`Retry::first`]: its first attempt, in a
//! future ([`First`]) that holds the attempt and nothing else to drop, and that only accepts an
//! `Ok` (everything else goes to the rounds, with what the first attempt went through, [`Went`],
//! and the first round settles a failed attempt 1 as it would its own).
//!
//! The loop stays in the caller because the body of each attempt borrows the caller's
//! parameters (or the closure of [`Policy::run`]): a future that owned the loop would have to
//! own both the closure and the attempt borrowing it. (Tried for `#[retry]`: a runtime `async fn`
//! looping over the body's `async` closure made the job's future `Send` for one lifetime of the
//! closure's borrow only, which the server example's apalis worker rejected: "implementation of
//! `Send` is not general enough". `Policy::run` is such a function, over a closure its caller
//! owns.)
//!
//! What to do after an outcome is [`decide`], a plain function over plain data. The success path
//! allocates nothing, takes no lock, looks up no runtime and builds no event when nothing
//! observes. (A half-open breaker's probe is the exception: its permit, which must be given
//! back if the call is dropped, is kept in the call's failure state, allocated for it.)
//!
//! The success path is one `if` in the caller's own poll: when a call is *lean* (nobody watches,
//! or only `metrics` does, and the policy has no `timeout` or `budget`; decided once, when the
//! call starts), the first poll of a [`First`] (or of a [`Round`], for the jobs that start with
//! one) asks the breaker if there is one, polls the attempt with its number in scope and returns
//! an accepted `Ok` inline. Anything else (a
//! pending or failed attempt, a retried `Ok`, a refusal, a call that is not lean, every later
//! poll) goes on in the same state machine, out of line. What only a failed round needs (the
//! delay's timer, the dead letter on its way) is in the call's failure state, allocated at the
//! first failure.

use crate::attempt::{self, Delivery};
use crate::bounds::{Describe, FromJobguard};
use crate::breaker::{Admission, CircuitBreaker, Permit};
use crate::dead_letter::{DeadLetter, DeadLetterSink, GiveUp};
use crate::observe::{Event, Job, Watch};
use crate::runtime::Current;
use crate::{Error, Policy, Runtime, Verdict};
use core::ops::ControlFlow;
use rand::rngs::SmallRng;
use std::collections::VecDeque;
use std::fmt::{self, Display};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
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
    /// The breaker refused the attempt.
    CircuitOpen,
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
        Origin::CircuitOpen => Some(GiveUp::CircuitOpen),
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
/// and its policy is made of literals, so that a call stores one pointer for all of it (else the
/// expansion makes one per call, as [`Policy::run`] does). The breaker is the round's (see
/// [`Retry::attempt_permitted`]), so that the success path asks it at an address it knows.
#[doc(hidden)]
pub struct Spec<'a> {
    job: &'a str,
    /// The job's static descriptor, when the name is known at compile time.
    known: Option<&'static Job>,
    policy: &'a Policy,
    /// Whether the policy sets no time limit (no `timeout`, no `budget`): an attempt then needs
    /// no clock, so a call nobody watches can take the inline path.
    untimed: bool,
    key: Option<&'a str>,
    sink: Option<&'a dyn DeadLetterSink>,
    payload: Option<&'a dyn Payload>,
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
            untimed: policy.timeout.is_none() && policy.budget.is_none(),
            key: None,
            sink: None,
            payload: None,
        }
    }

    /// Counts attempt `number` of a call of this job into the `metrics` recorder in scope: the
    /// one event of a lean call that only `metrics` may watch, on its inline path.
    #[inline(never)]
    fn count_attempt(&self, number: u32) {
        crate::observe::record_metrics(
            &Event::Attempt {
                job: self.job,
                key: self.key,
                attempt: number,
            },
            self.known,
        );
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

/// The breaker a `#[retry(breaker = ...)]` call hands to each round, evaluated once per call.
/// A function, so that a `const` breaker (a new one each time it is named, which would never
/// trip across calls) is a temporary dropped while borrowed: a compile error, not a breaker
/// that silently never opens.
#[doc(hidden)]
#[inline(always)]
pub fn breaker(breaker: &CircuitBreaker) -> &CircuitBreaker {
    breaker
}

/// The dead-letter sink a `#[retry(dead_letter = ...)]` call evaluates once, for its own letters
/// and (with `#[idempotent]`) its crash letter. A function for the reason [`breaker`] is.
#[doc(hidden)]
#[inline(always)]
pub fn sink(sink: &dyn DeadLetterSink) -> &dyn DeadLetterSink {
    sink
}

/// What one call of a retried job keeps between attempts.
pub struct Retry<'a> {
    /// What the call reads of its job.
    spec: &'a Spec<'a>,
    /// Who sees this call's events and whether it is lean, decided when it starts, in one byte
    /// (one store when the call starts, one test at each round; see [`Mode`]).
    mode: Mode,
    /// The number of the attempt in the body (the attempts made so far), as
    /// [`attempt()`](crate::attempt()) reads it.
    number: u32,
    /// What only a call that did not succeed at once needs: made the first time the round goes
    /// out of line (an attempt admitted there, a call that is not lean, an attempt that did not
    /// finish or was not accepted in its first poll, a refusal, a probe). A call that succeeds
    /// at once writes and checks nothing else.
    slow: Option<Slow>,
    /// What only a failure (or a half-open probe) needs, allocated at the first one.
    failures: Option<Box<Failures<'a>>>,
    #[cfg(feature = "tracing")]
    span: crate::observe::tracing::JobSpan,
}

impl Drop for Retry<'_> {
    /// A call that never failed only finds its failure state absent; the state of one that did
    /// is dropped out of line.
    #[inline]
    fn drop(&mut self) {
        // Tested before it is taken, so that a call that never failed only reads the field.
        if self.failures.is_some()
            && let Some(failures) = self.failures.take()
        {
            drop_failures(failures);
        }
    }
}

#[cold]
#[inline(never)]
fn drop_failures(failures: Box<Failures<'_>>) {
    drop(failures);
}

/// Who watches a call and whether it is lean, in one byte: the [`Watch`] in the low two bits
/// (its values are 0 to 3) and [`Mode::TIMED`] when the policy sets a time limit. A call is
/// *lean* (its rounds admit and accept an attempt inline) when nobody but `metrics` watches
/// (`Nobody` or `Metrics`: bit 0 clear) and the policy is untimed.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Mode(u8);

impl Mode {
    /// The bit of a policy with a `timeout` or a `budget`.
    const TIMED: u8 = 4;

    #[inline(always)]
    fn new(watch: Watch, untimed: bool) -> Self {
        Mode(watch as u8 | if untimed { 0 } else { Self::TIMED })
    }

    /// Whether the call's rounds may take the inline path.
    #[inline(always)]
    fn lean(self) -> bool {
        self.0 & (Self::TIMED | Watch::Observers as u8) == 0
    }

    #[inline(always)]
    fn watch(self) -> Watch {
        match self.0 & 3 {
            0 => Watch::Nobody,
            1 => Watch::Observers,
            2 => Watch::Metrics,
            _ => Watch::Integrations,
        }
    }
}

/// What a call keeps once an attempt did not succeed at once (or from its start, when it is not
/// lean): the clocks a time limit, a budget and a dead letter read.
#[derive(Clone, Copy)]
struct Slow {
    /// The installed runtime when the call started (read when its first attempt is admitted, in
    /// the poll that made the call), if any (see [`Current::installed`]). A lean call reads it
    /// when it makes this part, as nothing before needs it: the same runtime, unless the body
    /// installs one.
    installed: Option<&'static Runtime>,
    /// The running attempt's start on tokio's clock, once known (see
    /// [`Attempt::started`](crate::Attempt::started)).
    attempt_started: Option<Instant>,
    /// The first attempt's start on tokio's clock, read only when a `timeout` or `budget` needs it.
    started: Option<Instant>,
    /// The wall-clock starts of the first and the latest attempt, for the dead letter.
    first_wall: Option<SystemTime>,
    last_wall: Option<SystemTime>,
    /// Whether the current attempt's wall-clock start has been taken.
    stamped: bool,
}

impl Slow {
    /// The slow part in `slow`, made the first time (reading the installed runtime then).
    #[inline]
    fn of(slow: &mut Option<Slow>) -> &mut Slow {
        slow.get_or_insert_with(|| Slow::new(Current::installed()))
    }

    fn new(installed: Option<&'static Runtime>) -> Self {
        Slow {
            installed,
            attempt_started: None,
            started: None,
            first_wall: None,
            last_wall: None,
            stamped: false,
        }
    }

    /// Takes `now` as the current attempt's wall-clock start (and the first attempt's, if none
    /// was taken before).
    fn stamp_wall(&mut self, now: SystemTime) {
        self.stamped = true;
        self.first_wall.get_or_insert(now);
        self.last_wall = Some(now);
    }
}

/// The state only a failing call needs (and a call whose attempt is a half-open probe).
struct Failures<'a> {
    /// The last delay, for decorrelated jitter.
    previous_delay: Duration,
    rng: Option<SmallRng>,
    trail: Trail,
    /// The runtime in scope, looked up the first time a failure needs it.
    runtime: Option<Current>,
    /// The timer of the delay before the next attempt, while a round sleeps.
    delay: Option<Pin<Box<Sleep>>>,
    /// The dead letter on its way to the sink, while a round gives up.
    sending: Option<Sending<'a>>,
    /// A half-open probe's permit while its attempt runs (a round keeps a closed breaker's
    /// permit as its epoch, with nothing to drop).
    probe: Option<Permit<'a>>,
}

impl<'a> Retry<'a> {
    /// The state for one call of the job `spec` describes, with the runtime in scope.
    #[inline(always)]
    pub fn new(spec: &'a Spec<'a>) -> Self {
        Self::watched(spec, crate::observe::watch())
    }

    /// The state for one call watched by `watch`, read when the call started.
    #[inline(always)]
    fn watched(spec: &'a Spec<'a>, watch: Watch) -> Self {
        Retry {
            spec,
            mode: Mode::new(watch, spec.untimed),
            number: 0,
            slow: None,
            failures: None,
            #[cfg(feature = "tracing")]
            span: crate::observe::tracing::JobSpan::new(),
        }
    }

    /// The number the next attempt will have, from 1.
    pub fn next_attempt(&self) -> u32 {
        self.number + 1
    }

    /// One turn of the loop for a job with no breaker, timeout or budget (so the runtime cannot
    /// fail on its own and `E` needs nothing from jobguard): runs `attempt`, classifies a
    /// failure with `on_err`, and resolves to `Break` with the result to return, or `Continue`
    /// once the delay before the next attempt has passed.
    #[inline]
    pub fn attempt<T, E, F, C, V>(
        &mut self,
        attempt: F,
        on_err: C,
    ) -> Round<'_, 'a, T, E, F, C, AcceptOk, Unguarded>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        E: Describe,
    {
        self.assert_untimed();
        Round::new(self, attempt, on_err, Unguarded)
    }

    /// [`Retry::attempt`] under `breaker` (and no timeout or budget), which fails with a
    /// [`jobguard::Error`](Error) converted into `E` when it is open. `attempt` is not polled
    /// when the breaker refuses it.
    #[inline]
    pub fn attempt_permitted<T, E, F, C, V>(
        &mut self,
        breaker: &'a CircuitBreaker,
        attempt: F,
        on_err: C,
    ) -> Round<'_, 'a, T, E, F, C, AcceptOk, Permitted<'a, E>>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        E: FromJobguard + Describe,
    {
        self.assert_untimed();
        Round::new(self, attempt, on_err, Permitted::new(Some(breaker)))
    }

    /// [`Retry::attempt`] under `breaker` if any, the per-attempt timeout and the budget, which
    /// fail with a [`jobguard::Error`](Error) converted into `E`. `attempt` is not polled when
    /// the breaker refuses it.
    #[inline]
    pub fn attempt_guarded<T, E, F, C, V>(
        &mut self,
        breaker: Option<&'a CircuitBreaker>,
        attempt: F,
        on_err: C,
    ) -> Round<'_, 'a, T, E, F, C, AcceptOk, Guarded<'a, E>>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        E: FromJobguard + Describe,
    {
        let guard = Guarded {
            permitted: Permitted::new(breaker),
            limit: None,
        };
        Round::new(self, attempt, on_err, guard)
    }

    /// Only a guarded round can cut its attempt: a policy with a `timeout` or `budget` takes
    /// [`Retry::attempt_guarded`] (debug builds check).
    #[inline(always)]
    fn assert_untimed(&self) {
        debug_assert!(
            self.spec.untimed,
            "a round without a time limit for a policy with one: use attempt_guarded"
        );
    }

    /// The runtime in scope, looked up once per failing call.
    fn runtime(&mut self) -> &Runtime {
        let installed = self.slow().installed;
        self.failures()
            .runtime
            .get_or_insert_with(|| Current::with_installed(installed))
    }

    /// The part of the call state a call that did not succeed at once needs, made the first time
    /// (for a lean call: reading the installed runtime now).
    #[inline]
    fn slow(&mut self) -> &mut Slow {
        Slow::of(&mut self.slow)
    }

    /// The failure state, made at the first failure.
    #[cold]
    fn failures(&mut self) -> &mut Failures<'a> {
        let base = self.spec.policy.base;
        self.failures.get_or_insert_with(|| {
            Box::new(Failures {
                previous_delay: base,
                rng: None,
                trail: Trail::new(),
                runtime: None,
                delay: None,
                sending: None,
                probe: None,
            })
        })
    }

    /// Sets the call's delay timer to fire `delay` from now: an earlier delay's timer is reset,
    /// not allocated again.
    fn sleep_for(&mut self, delay: Duration) {
        let failures = self.failures();
        match (failures.delay.as_mut(), Instant::now().checked_add(delay)) {
            (Some(timer), Some(deadline)) => timer.as_mut().reset(deadline),
            _ => failures.delay = Some(Box::pin(tokio::time::sleep(delay))),
        }
    }

    /// The timer of the delay before the next attempt, when a round set one.
    fn delay(&mut self) -> Option<Pin<&mut Sleep>> {
        Some(self.failures.as_mut()?.delay.as_mut()?.as_mut())
    }

    /// The dead letter on its way, while a round gives up.
    fn sending(&mut self) -> Option<Pin<&mut (dyn Future<Output = ()> + Send + 'a)>> {
        Some(self.failures.as_mut()?.sending.as_mut()?.as_mut())
    }

    /// Raises `event` for whoever watches, inside the call's span with the `tracing` feature.
    #[inline]
    fn emit(&mut self, event: &Event<'_>) {
        if self.mode.watch() == Watch::Nobody {
            return;
        }
        let (known, installed) = (self.spec.known, self.slow().installed);
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter(self.spec.job, self.spec.key);
        match (self.mode.watch(), self.failures.as_mut()) {
            // A failing call keeps the runtime beside its failure state; a call that has not
            // failed holds nothing to drop and looks the runtime up for the event.
            (Watch::Observers, Some(failures)) => failures
                .runtime
                .get_or_insert_with(|| Current::with_installed(installed))
                .emit_job(event, known),
            (Watch::Observers, None) => Current::with_installed(installed).emit_job(event, known),
            _ => crate::observe::record_job(event, known),
        }
    }

    /// Admits the next attempt: asks the breaker, counts the attempt, and sets the time limit
    /// it runs under.
    #[inline(always)]
    fn admit(
        &mut self,
        breaker: Option<&'a CircuitBreaker>,
        granted: Option<Permit<'a>>,
        timed: bool,
    ) -> Admitted<'a> {
        // A call that is not lean fixes the installed runtime at its first admission. A permit
        // the inline path was granted (a probe) is the attempt's.
        self.slow();
        let mut permit = granted;
        if permit.is_none()
            && let Some(breaker) = breaker
        {
            match breaker.acquire() {
                Ok(granted) => permit = Some(granted),
                Err(retry_in) => return Admitted::Refused(retry_in),
            }
        }
        self.number += 1;
        self.next_attempt_starts(None);
        #[cfg(feature = "tracing")]
        self.span
            .record_attempt(self.spec.job, self.spec.key, self.number);
        if self.mode.watch() != Watch::Nobody {
            self.emit(&Event::Attempt {
                job: self.spec.job,
                key: self.spec.key,
                attempt: self.number,
            });
        }
        let limit = match (self.spec.policy.timeout, self.spec.policy.budget) {
            // A breaker alone needs no clock, and only a round with a time limit can be cut.
            (None, None) => None,
            _ if !timed => None,
            (timeout, budget) => self.limit(timeout, budget),
        };
        Admitted::Run { permit, limit }
    }

    /// The attempt's time limit: the nearer of its timeout and the budget's end. A limit too far
    /// out to represent is no limit.
    #[cold]
    fn limit(
        &mut self,
        timeout: Option<Duration>,
        budget: Option<Duration>,
    ) -> Option<(Instant, Origin)> {
        let now = Instant::now();
        let start = *self.slow().started.get_or_insert(now);
        let budget_end = budget.and_then(|b| start.checked_add(b));
        let timeout_end = timeout.and_then(|t| now.checked_add(t));
        match (timeout_end, budget_end) {
            (Some(t), Some(b)) if b < t => Some((b, Origin::Budget)),
            (Some(t), _) => Some((t, Origin::Timeout)),
            (None, Some(b)) => Some((b, Origin::Budget)),
            (None, None) => None,
        }
    }

    /// Takes the current attempt's wall-clock start, once: when the attempt does not finish on
    /// its first poll, or finishes with a failure. That is its start to within one poll, and an
    /// attempt that succeeds at once reads no clock at all.
    #[cold]
    fn stamp(&mut self) {
        let slow = self.slow();
        if !slow.stamped {
            slow.stamp_wall(SystemTime::now());
            if slow.attempt_started.is_none() {
                slow.attempt_started = Some(Instant::now());
            }
        }
    }

    /// A new attempt is in the body: its start is `started` (what it learned during its first
    /// poll, if anything), and its wall-clock start is not taken yet.
    #[inline]
    fn next_attempt_starts(&mut self, started: Option<Instant>) {
        if let Some(slow) = self.slow.as_mut() {
            slow.attempt_started = started;
            slow.stamped = false;
        } else if started.is_some() {
            self.slow().attempt_started = started;
        }
    }

    /// Books an accepted outcome: the breaker's permit, the event.
    #[inline(always)]
    fn succeeded(&mut self, permit: Option<Permit<'a>>) {
        if let Some(permit) = permit {
            permit.success();
        }
        if self.mode.watch() != Watch::Nobody {
            self.emit(&Event::Succeeded {
                job: self.spec.job,
                key: self.spec.key,
                attempts: self.number,
            });
        }
    }

    /// What follows an outcome that was not accepted: the delay before the next attempt, or the
    /// give-up and its dead letter on their way to the sink. `breaker` is the round's: when it is
    /// open for longer than the delay would be, the call is refused now ([`Next::Refused`]).
    #[cold]
    fn failed(
        &mut self,
        failure: &dyn Display,
        origin: Origin,
        verdict: Verdict,
        permit: Option<Permit<'a>>,
        breaker: Option<&CircuitBreaker>,
    ) -> Next<'a> {
        self.stamp();
        self.failures().trail.failed(failure);
        // A transient failure (or a cut attempt) counts against the breaker. A permanent one says
        // nothing about the dependency's health: its permit is dropped here, neutral.
        if let Some(permit) = permit
            && (verdict.is_retryable() || origin == Origin::Budget)
        {
            permit.failure();
        }
        let policy = self.spec.policy;
        let elapsed = policy.budget.and_then(|budget| {
            let start = *self.slow().started.get_or_insert_with(Instant::now);
            start.checked_add(budget).map(|_| start.elapsed())
        });
        let attempt = self.number;
        let open_for = match origin {
            Origin::Body | Origin::Timeout if verdict.is_retryable() => {
                breaker.map_or(Duration::ZERO, CircuitBreaker::retry_in)
            }
            _ => Duration::ZERO,
        };
        let decision = decide(policy, attempt, origin, verdict, elapsed, open_for, || {
            self.jittered(attempt)
        });
        match decision {
            // The next attempt's refusal, made now: booked and given up as `refuse` does.
            Decision::GiveUp(GiveUp::CircuitOpen) if origin != Origin::CircuitOpen => {
                let refused = Error::CircuitOpen { retry_in: open_for };
                self.failures().trail.failed(&refused);
                let sending = self.give_up(GiveUp::CircuitOpen, refused.to_string());
                Next::Refused(open_for, sending)
            }
            Decision::RetryAfter(delay) => {
                self.failures().previous_delay = delay;
                self.emit(&Event::Retry {
                    job: self.spec.job,
                    key: self.spec.key,
                    attempt,
                    delay,
                    verdict,
                    error: failure,
                });
                Next::RetryAfter(delay)
            }
            Decision::GiveUp(reason) => Next::GiveUp(self.give_up(reason, failure.to_string())),
        }
    }

    fn jittered(&mut self, retry: u32) -> Duration {
        let p = self.spec.policy;
        let curve = p.delay(retry);
        if !p.jitter.is_random() {
            return curve;
        }
        let mut rng = match self.failures().rng.take() {
            Some(rng) => rng,
            None => self.runtime().rng(),
        };
        let failures = self.failures();
        let delay = p
            .jitter
            .apply(curve, failures.previous_delay, p.base, p.cap, &mut rng);
        failures.rng = Some(rng);
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
    fn give_up(&mut self, reason: GiveUp, error: String) -> Sending<'a> {
        let delivery = Delivery::current();
        let this_delivery = self.number;
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
        let attempts = delivery.map_or(this_delivery, |d| {
            (d.number.saturating_sub(1))
                .saturating_mul(self.spec.policy.attempts)
                .saturating_add(this_delivery)
        });
        let now = SystemTime::now();
        let Slow {
            first_wall,
            last_wall,
            ..
        } = *self.slow();
        let first = first_wall.unwrap_or(now);
        let letter = DeadLetter::new(
            self.spec.job,
            self.spec.key.map(str::to_owned),
            reason,
            attempts,
            error,
            first,
            last_wall.unwrap_or(first),
        );
        let payload = self.spec.payload;
        let letter = self.failures().trail.seal(payload, letter);
        self.emit(&Event::DeadLetter(&letter));
        // A letter the sink refuses is raised to whoever watches this call, as `emit` would:
        // decided when the call started, and the runtime it uses when observers exist.
        let watch = self.mode.watch();
        let known = self.spec.known;
        let observers = (watch == Watch::Observers).then(|| self.runtime().clone());
        let lost = move |event: &Event<'_>| match (watch, observers) {
            (Watch::Nobody, _) => {}
            (_, Some(runtime)) => runtime.emit_job(event, known),
            (_, None) => crate::observe::record_job(event, known),
        };
        let delivered: Pin<Box<dyn Future<Output = bool> + Send + 'a>> = match self.spec.sink {
            Some(sink) => Box::pin(crate::dead_letter::deliver_observed(sink, letter, lost)),
            None => {
                let sink = self.runtime().inner.dead_letters.clone();
                Box::pin(
                    async move { crate::dead_letter::deliver_observed(&*sink, letter, lost).await },
                )
            }
        };
        // Settled only once the sink took the letter: a job whose letter was lost is not
        // settled, so a runner may deliver it again rather than drop it with no record.
        let sending = async move {
            if delivered.await {
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
/// attempts or the budget ran out, or the breaker was open. A permanent failure is not.
const fn redeliverable(reason: GiveUp) -> bool {
    matches!(
        reason,
        GiveUp::Exhausted | GiveUp::Budget | GiveUp::CircuitOpen
    )
}

/// What a round asks of an `Ok` value: a closure `FnOnce(&T) -> Verdict` (from
/// [`Round::on_ok`]), or [`AcceptOk`], which accepts every `Ok` without being asked.
pub trait OkVerdict<T> {
    /// Whether every `Ok` is accepted, so that the round need not ask: known at compile time.
    const ACCEPTS_ALL: bool = false;

    /// The verdict on `value`: [`Verdict::Fail`] accepts it, a retryable verdict retries it.
    fn verdict(self, value: &T) -> Verdict;
}

impl<T, K: FnOnce(&T) -> Verdict> OkVerdict<T> for K {
    #[inline]
    fn verdict(self, value: &T) -> Verdict {
        self(value)
    }
}

/// The verdict on an `Ok` value: [`Verdict::Fail`] (accepted) without asking when every `Ok`
/// is, else what `on_ok` says, asked once.
#[inline(always)]
fn ok_verdict<T, K: OkVerdict<T>>(on_ok: &mut Option<K>, value: &T) -> Verdict {
    if K::ACCEPTS_ALL {
        return Verdict::Fail;
    }
    match on_ok.take() {
        Some(on_ok) => on_ok.verdict(value),
        None => Verdict::Fail,
    }
}

/// The `on_ok` of a round without one: every `Ok` is accepted, without a call or a check.
#[derive(Debug, Clone, Copy)]
pub struct AcceptOk;

impl<T> OkVerdict<T> for AcceptOk {
    const ACCEPTS_ALL: bool = true;

    #[inline]
    fn verdict(self, _: &T) -> Verdict {
        Verdict::Fail
    }
}

/// The dead letter on its way to the sink.
type Sending<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// What the admission of an attempt says.
enum Admitted<'a> {
    /// Run it, with the breaker's permit when there is a breaker, and until the time limit when
    /// there is one (then cut it for the reason given).
    Run {
        permit: Option<Permit<'a>>,
        limit: Option<(Instant, Origin)>,
    },
    /// The breaker refused it, open for this much longer; it counts as no attempt.
    Refused(Duration),
}

/// What follows a failed outcome, as [`Retry::failed`] decides it.
enum Next<'a> {
    RetryAfter(Duration),
    GiveUp(Sending<'a>),
    /// The breaker is open for this much longer than the delay would have been: the call gives
    /// up now with [`Error::CircuitOpen`], as the next attempt's refusal would have.
    Refused(Duration, Sending<'a>),
}

/// The failure an `on_ok` retry books: the value itself need not be `Display`.
struct OkRetried;

impl Display for OkRetried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the `on_ok` classifier asked to retry the job's `Ok` value")
    }
}

/// What a round of one kind holds for the runtime's own checks while its attempt runs.
///
/// [`Unguarded`] holds nothing: its rounds ask no breaker and set no time limit, so nothing of
/// jobguard's can fail them and their error type needs nothing from jobguard. [`Permitted`]
/// holds the breaker's permit; [`Guarded`] the permit and the time limit. Both turn the
/// runtime's own failures into the job's error. What any failed round needs (the delay's timer,
/// the dead letter on its way) is in the call's failure state instead, so a round accepted at
/// once drops no more than its guard.
pub trait Guard<'a, E> {
    /// The runtime's own failure (a cut attempt, an open breaker) as the job's error; `None` for
    /// a round that has none.
    #[inline(always)]
    fn lift(_error: Error) -> Option<E> {
        None
    }

    /// The breaker the attempt asks first, if any.
    #[inline(always)]
    fn breaker(&self) -> Option<&'a CircuitBreaker> {
        None
    }

    /// Where the epoch of the attempt's permit is kept while it runs, for a round that asks the
    /// breaker, when the permit is the closed state's (it has nothing to release if dropped, so
    /// the round's guard has no drop glue). A probe's permit is kept in the call's failure
    /// state instead.
    #[inline(always)]
    fn closed(self: Pin<&mut Self>) -> Option<&mut Option<u32>> {
        None
    }

    /// The attempt's time limit, for a round that can be cut.
    #[inline(always)]
    fn limit(self: Pin<&mut Self>) -> Option<Pin<&mut Option<Sleep>>> {
        None
    }
}

/// The [`Guard`] of a round with no breaker, timeout or budget: nothing.
#[derive(Debug, Clone, Copy)]
pub struct Unguarded;

impl<E> Guard<'_, E> for Unguarded {}

/// The [`Guard`] of a round under a breaker, with no timeout or budget: the breaker, and its
/// permit for the attempt while it runs.
pub struct Permitted<'a, E> {
    breaker: Option<&'a CircuitBreaker>,
    closed: Option<u32>,
    lift: PhantomData<fn(Error) -> E>,
}

impl<'a, E> Permitted<'a, E> {
    #[inline]
    fn new(breaker: Option<&'a CircuitBreaker>) -> Self {
        Permitted {
            breaker,
            closed: None,
            lift: PhantomData,
        }
    }
}

impl<'a, E: FromJobguard> Guard<'a, E> for Permitted<'a, E> {
    #[inline]
    fn lift(error: Error) -> Option<E> {
        Some(E::from(error))
    }

    #[inline(always)]
    fn breaker(&self) -> Option<&'a CircuitBreaker> {
        self.breaker
    }

    #[inline]
    fn closed(self: Pin<&mut Self>) -> Option<&mut Option<u32>> {
        Some(&mut self.get_mut().closed)
    }
}

pin_project_lite::pin_project! {
    /// The [`Guard`] of a round under the per-attempt timeout or the budget (and the breaker,
    /// when there is one): what [`Permitted`] holds, and the attempt's time limit, while it
    /// runs.
    pub struct Guarded<'a, E> {
        permitted: Permitted<'a, E>,
        #[pin]
        limit: Option<Sleep>,
    }
}

/// Everything but the time limit is the [`Permitted`] part's.
impl<'a, E: FromJobguard> Guard<'a, E> for Guarded<'a, E> {
    #[inline]
    fn lift(error: Error) -> Option<E> {
        <Permitted<'a, E> as Guard<'a, E>>::lift(error)
    }

    #[inline(always)]
    fn breaker(&self) -> Option<&'a CircuitBreaker> {
        self.permitted.breaker()
    }

    #[inline]
    fn closed(self: Pin<&mut Self>) -> Option<&mut Option<u32>> {
        Pin::new(self.project().permitted).closed()
    }

    #[inline]
    fn limit(self: Pin<&mut Self>) -> Option<Pin<&mut Option<Sleep>>> {
        Some(self.project().limit)
    }
}

pin_project_lite::pin_project! {
    /// One turn of the retry loop, from [`Retry::attempt`]: admit the attempt, run it, then
    /// accept its outcome, sleep before the next attempt, or give up. Resolves to `Break` with
    /// the call's result, or `Continue` when the loop makes the next attempt.
    ///
    /// The attempt is pinned beside the [`State`] and the round's [`Guard`]; the delay's timer
    /// and the dead letter on its way are the call's (in its failure state), and the result a
    /// give-up returns is kept in the state until the letter is on its way.
    #[must_use = "a round does nothing unless awaited"]
    pub struct Round<'r, 'a, T, E, F, C, K, G> {
        retry: &'r mut Retry<'a>,
        on_err: Option<C>,
        on_ok: Option<K>,
        state: State<T, E>,
        #[pin]
        attempt: F,
        #[pin]
        guard: G,
    }
}

/// A round as its slow path works on it.
struct Parts<'p, 'r, 'a, T, E, C, K, G> {
    retry: &'p mut &'r mut Retry<'a>,
    on_err: &'p mut Option<C>,
    on_ok: &'p mut Option<K>,
    state: &'p mut State<T, E>,
    guard: Pin<&'p mut G>,
}

/// Where a [`Round`] is.
enum State<T, E> {
    /// Not polled yet: the breaker is asked and the attempt counted at the first poll.
    Admit,
    /// The attempt runs; the time limit, when set, cuts it for the reason `cut` gives (its
    /// timeout or the budget's end).
    Run { cut: Origin },
    /// The attempt failed; the next one starts when the call's delay timer fires (`timed`), or
    /// at once (a zero delay needs no timer).
    Sleep { timed: bool },
    /// The call gave up: the dead letter is being sent, and this result is returned after it.
    GiveUp(Result<T, E>),
    /// The call's first attempt finished on its inline path ([`First`]) without being accepted:
    /// its outcome is settled at the round's first poll, under the closed breaker's epoch it
    /// ran in, if any. The round's own attempt is not run.
    Finished(Result<T, E>, Option<u32>),
    /// The round resolved.
    Done,
}

impl<'r, 'a, T, E, F, C, K, G> Round<'r, 'a, T, E, F, C, K, G> {
    #[inline]
    fn new(retry: &'r mut Retry<'a>, attempt: F, on_err: C, guard: G) -> Self {
        Round {
            retry,
            on_err: Some(on_err),
            on_ok: None,
            state: State::Admit,
            attempt,
            guard,
        }
    }

    /// Classifies the `Ok` value too: `on_ok` returning [`Verdict::Retry`] or
    /// [`Verdict::RetryAfter`] retries it like a transient failure (expansions pass an
    /// [`OkClassifier`](crate::bounds::OkClassifier) through `__private::classify_ok`). When the attempts
    /// run out on a retried value, that last value is returned and the job is dead-lettered as
    /// [`GiveUp::Exhausted`].
    #[inline]
    pub fn on_ok<K2>(self, on_ok: K2) -> Round<'r, 'a, T, E, F, C, K2, G>
    where
        K2: FnOnce(&T) -> Verdict,
    {
        Round {
            retry: self.retry,
            on_err: self.on_err,
            on_ok: Some(on_ok),
            state: self.state,
            attempt: self.attempt,
            guard: self.guard,
        }
    }

    /// The round's parts for its slow path, and the attempt.
    #[inline]
    fn parts(self: Pin<&mut Self>) -> (Parts<'_, 'r, 'a, T, E, C, K, G>, Pin<&mut F>) {
        let this = self.project();
        let parts = Parts {
            retry: this.retry,
            on_err: this.on_err,
            on_ok: this.on_ok,
            state: this.state,
            guard: this.guard,
        };
        (parts, this.attempt)
    }
}

impl<'a, T, E, F, C, V, K, G> Future for Round<'_, 'a, T, E, F, C, K, G>
where
    F: Future<Output = Result<T, E>>,
    C: FnOnce(&E) -> V,
    V: Into<Verdict>,
    K: OkVerdict<T>,
    E: Describe,
    G: Guard<'a, E>,
{
    type Output = ControlFlow<Result<T, E>>;

    /// The success path, inlined into the caller's own poll: when nothing needs more than the
    /// attempt itself (nobody watches but `metrics`, whose attempt counter it records; no
    /// timeout or budget; a breaker is asked inline), the
    /// first poll admits the attempt, polls it and accepts its `Ok` here. Everything else (an
    /// attempt that is pending or failed, a retried `Ok`, a refusal, every later poll) goes on
    /// in `Round::drive`, out of line.
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.as_mut().project();
        if !matches!(this.state, State::Admit) || !this.retry.mode.lean() {
            return self.drive(cx);
        }
        // A closed breaker's permit is its epoch, kept in a register until the outcome is known.
        // Any other permit (a probe, or a closed one won after a race) goes out of line, where
        // the round admits its attempt with it.
        let mut closed = None;
        if let Some(breaker) = this.guard.breaker() {
            match breaker.admit() {
                Admission::Closed(epoch) => closed = Some(epoch),
                other => return self.admitted(cx, other),
            }
        }
        let number = this.retry.number + 1;
        if cfg!(feature = "metrics") && this.retry.mode.watch() == Watch::Metrics {
            this.retry.spec.count_attempt(number);
        }
        let attempt = this.attempt;
        let (polled, learned) = attempt::poll_first(number, || attempt.poll(cx));
        // An `on_ok` classifier is the caller's code, which may read `attempt()` and so the start
        // cell: what the attempt learned is read before it runs.
        let learned = if K::ACCEPTS_ALL {
            learned
        } else {
            attempt::Learned::Start(learned.started())
        };
        let classified = match &polled {
            Poll::Ready(Ok(value)) => Some(ok_verdict(this.on_ok, value)),
            _ => None,
        };
        match (polled, classified) {
            (Poll::Ready(Ok(value)), Some(Verdict::Fail)) => {
                if let (Some(epoch), Some(breaker)) = (closed, this.guard.breaker()) {
                    breaker.closed_succeeded(epoch);
                }
                // The state was `Admit` (checked on the way in, and nothing else can change it),
                // which holds nothing to drop: it is overwritten without a check, so that a round
                // polled again after it resolved panics rather than admit another attempt. The
                // call's count of attempts stays as it was: the loop breaks with this value.
                core::mem::forget(core::mem::replace(this.state, State::Done));
                Poll::Ready(ControlFlow::Break(Ok(value)))
            }
            // What the attempt learned of its start is read before anything else polls.
            (polled, classified) => {
                self.went_on(cx, number, polled, classified, closed, learned.started())
            }
        }
    }
}

impl<'a, T, E, F, C, V, K, G> Round<'_, 'a, T, E, F, C, K, G>
where
    F: Future<Output = Result<T, E>>,
    C: FnOnce(&E) -> V,
    V: Into<Verdict>,
    K: OkVerdict<T>,
    E: Describe,
    G: Guard<'a, E>,
{
    /// The inline path's admission when it is not simply a closed breaker's (a refusal, a
    /// probe, a closed permit won after a race): the round goes on from it out of line.
    #[cold]
    #[inline(never)]
    fn admitted(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        admission: Admission<'a>,
    ) -> Poll<ControlFlow<Result<T, E>>> {
        let (mut this, _) = self.as_mut().parts();
        match admission {
            Admission::Refused(retry_in) => Self::refuse(&mut this, retry_in),
            Admission::Permit(permit) => Self::keep_permit(&mut this, Some(permit)),
            Admission::Closed(epoch) => {
                if let Some(slot) = this.guard.as_mut().closed() {
                    *slot = Some(epoch);
                }
            }
        }
        self.drive(cx)
    }

    /// The inline path's outcome when it is not an accepted `Ok` (`classified`: what `on_ok`
    /// said of an `Ok`), or its attempt pending: the round goes on from it, attempt `number`
    /// now counted, with the permit of the closed breaker's epoch `closed` and the `started` it
    /// learned.
    #[cold]
    #[inline(never)]
    fn went_on(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        number: u32,
        polled: Poll<Result<T, E>>,
        classified: Option<Verdict>,
        closed: Option<u32>,
        started: Option<Instant>,
    ) -> Poll<ControlFlow<Result<T, E>>> {
        let (mut this, _) = self.as_mut().parts();
        this.retry.number = number;
        this.retry.next_attempt_starts(started);
        *this.state = State::Run { cut: Origin::Body };
        if let Some(slot) = this.guard.as_mut().closed() {
            *slot = closed;
        }
        match polled {
            // No timer was set (a lean call has no time limit): a pending attempt only waits.
            Poll::Pending => {
                this.retry.stamp();
                Poll::Pending
            }
            Poll::Ready(result) => {
                if let ControlFlow::Break(done) =
                    Self::settle(&mut this, result, Origin::Body, classified)
                {
                    return Poll::Ready(ControlFlow::Break(done));
                }
                self.drive(cx)
            }
        }
    }

    /// Everything but the success path of [`Round::poll`]: the loop over the round's states.
    #[inline(never)]
    fn drive(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ControlFlow<Result<T, E>>> {
        let (mut this, mut attempt) = self.parts();
        loop {
            // Every state but a running attempt is handled here; admitting an attempt goes
            // straight on to its first poll below, without another turn of the loop.
            let cut = match this.state {
                State::Run { cut } => *cut,
                State::Admit => match Self::admit(&mut this) {
                    Admitted::Run { permit, limit } => {
                        let cut = limit.map_or(Origin::Body, |(_, cut)| cut);
                        Self::keep_permit(&mut this, permit);
                        if let Some(mut timer) = this.guard.as_mut().limit() {
                            timer.set(limit.map(|(at, _)| tokio::time::sleep_until(at)));
                        }
                        *this.state = State::Run { cut };
                        cut
                    }
                    Admitted::Refused(retry_in) => {
                        Self::refuse(&mut this, retry_in);
                        continue;
                    }
                },
                State::Sleep { timed } => {
                    if *timed && let Some(delay) = this.retry.delay() {
                        ready!(delay.poll(cx));
                    }
                    *this.state = State::Done;
                    return Poll::Ready(ControlFlow::Continue(()));
                }
                State::GiveUp(_) => {
                    if let Some(sending) = this.retry.sending() {
                        ready!(sending.poll(cx));
                    }
                    match core::mem::replace(this.state, State::Done) {
                        State::GiveUp(result) => return Poll::Ready(ControlFlow::Break(result)),
                        _ => unreachable!("a give-up holds its result"),
                    }
                }
                State::Finished(..) => {
                    let State::Finished(result, closed) =
                        core::mem::replace(this.state, State::Run { cut: Origin::Body })
                    else {
                        unreachable!("checked above")
                    };
                    if let Some(slot) = this.guard.as_mut().closed() {
                        *slot = closed;
                    }
                    if let ControlFlow::Break(done) =
                        Self::settle(&mut this, result, Origin::Body, None)
                    {
                        return Poll::Ready(ControlFlow::Break(done));
                    }
                    continue;
                }
                State::Done => panic!("a retry round polled after it resolved"),
            };
            // The attempt runs.
            let polled = {
                #[cfg(feature = "tracing")]
                let _entered = this
                    .retry
                    .span
                    .enter(this.retry.spec.job, this.retry.spec.key);
                let attempt = attempt.as_mut();
                let number = this.retry.number;
                let started = &mut Slow::of(&mut this.retry.slow).attempt_started;
                attempt::poll_in(number, started, || attempt.poll(cx))
            };
            let (result, origin) = match polled {
                Poll::Ready(result) => (result, Origin::Body),
                Poll::Pending => {
                    let cut_now = match this.guard.as_mut().limit() {
                        Some(timer) => match timer.as_pin_mut() {
                            Some(limit) => limit.poll(cx).is_ready(),
                            None => false,
                        },
                        None => false,
                    };
                    let error = match cut {
                        Origin::Budget => Error::Budget,
                        _ => Error::Timeout,
                    };
                    match G::lift(error) {
                        Some(error) if cut_now => (Err(error), cut),
                        _ => {
                            this.retry.stamp();
                            return Poll::Pending;
                        }
                    }
                }
            };
            if let ControlFlow::Break(done) = Self::settle(&mut this, result, origin, None) {
                return Poll::Ready(ControlFlow::Break(done));
            }
        }
    }

    /// The breaker refused the attempt: no attempt is made or counted, and the round gives up
    /// ([`decide`] gives up on every refusal).
    #[inline(always)]
    fn refuse(this: &mut Parts<'_, '_, 'a, T, E, C, K, G>, retry_in: Duration) {
        let refused = Error::CircuitOpen { retry_in };
        let next = this
            .retry
            .failed(&refused, Origin::CircuitOpen, Verdict::Fail, None, None);
        match G::lift(refused) {
            Some(error) => Self::after(this, next, Err(error)),
            // Only a guarded round has a breaker to refuse it.
            None => unreachable!("a breaker on an unguarded round"),
        }
    }

    /// Classifies an attempt's outcome: `Break` with the result to return when it is accepted,
    /// else the round goes on asleep before the next attempt or giving up (`Continue`).
    #[inline(always)]
    fn settle(
        this: &mut Parts<'_, '_, 'a, T, E, C, K, G>,
        result: Result<T, E>,
        origin: Origin,
        classified: Option<Verdict>,
    ) -> ControlFlow<Result<T, E>> {
        let verdict = match (&result, origin, classified) {
            // `on_ok` was asked already, on the inline path.
            (_, _, Some(verdict)) => verdict,
            (Ok(value), _, None) => ok_verdict(this.on_ok, value),
            (Err(error), Origin::Body, None) => match this.on_err.take() {
                Some(on_err) => on_err(error).into(),
                None => Verdict::Fail,
            },
            // The runtime's own failures are classified by the runtime.
            (Err(_), Origin::Timeout, None) => Verdict::Retry,
            (Err(_), _, None) => Verdict::Fail,
        };
        let permit = Self::take_permit(this);
        let breaker = this.guard.breaker();
        let next = match &result {
            Ok(_) if verdict == Verdict::Fail => {
                this.retry.succeeded(permit);
                *this.state = State::Done;
                return ControlFlow::Break(result);
            }
            Ok(_) => this
                .retry
                .failed(&OkRetried, origin, verdict, permit, breaker),
            Err(error) => this.retry.failed(error, origin, verdict, permit, breaker),
        };
        let (next, result) = match next {
            // Only a guarded round has a breaker; were there none, the failure is returned.
            Next::Refused(retry_in, sending) => match G::lift(Error::CircuitOpen { retry_in }) {
                Some(refused) => (Next::GiveUp(sending), Err(refused)),
                None => (Next::GiveUp(sending), result),
            },
            next => (next, result),
        };
        Self::after(this, next, result);
        ControlFlow::Continue(())
    }
}

impl<'a, T, E, F, C, K, G: Guard<'a, E>> Round<'_, 'a, T, E, F, C, K, G> {
    /// Keeps the running attempt's permit: a closed breaker's as its epoch in the guard, a
    /// probe's in the call's failure state.
    fn keep_permit(this: &mut Parts<'_, '_, 'a, T, E, C, K, G>, permit: Option<Permit<'a>>) {
        match permit.map(Permit::into_closed) {
            None => {}
            Some(Ok(epoch)) => {
                if let Some(slot) = this.guard.as_mut().closed() {
                    *slot = Some(epoch);
                }
            }
            Some(Err(probe)) => this.retry.failures().probe = Some(probe),
        }
    }

    /// Admits the round's attempt (see [`Retry::admit`]) under its guard's breaker and time
    /// limit, with the permit the inline path was granted, if any.
    fn admit(this: &mut Parts<'_, '_, 'a, T, E, C, K, G>) -> Admitted<'a> {
        let granted = Self::take_permit(this);
        let timed = this.guard.as_mut().limit().is_some();
        this.retry.admit(this.guard.breaker(), granted, timed)
    }

    /// Takes back the running attempt's permit, kept by [`Round::keep_permit`].
    fn take_permit(this: &mut Parts<'_, '_, 'a, T, E, C, K, G>) -> Option<Permit<'a>> {
        let breaker = this.guard.breaker()?;
        match this.guard.as_mut().closed().and_then(Option::take) {
            Some(epoch) => Some(breaker.closed_permit(epoch)),
            None => this.retry.failures.as_mut()?.probe.take(),
        }
    }

    /// The state after a failed outcome: asleep before the next attempt, or giving up. The
    /// attempt's time limit is dropped either way. The failed attempt's result is dropped when
    /// the loop goes on, and kept to be returned when it gives up.
    #[cold]
    fn after(this: &mut Parts<'_, '_, 'a, T, E, C, K, G>, next: Next<'a>, result: Result<T, E>) {
        if let Some(mut limit) = this.guard.as_mut().limit() {
            limit.set(None);
        }
        *this.state = match next {
            Next::RetryAfter(delay) => {
                let timed = !delay.is_zero();
                if timed {
                    this.retry.sleep_for(delay);
                }
                State::Sleep { timed }
            }
            Next::GiveUp(sending) | Next::Refused(_, sending) => {
                this.retry.failures().sending = Some(sending);
                State::GiveUp(result)
            }
        };
    }
}

impl<'a> Retry<'a> {
    /// A call's first attempt, `attempt`, for the job `spec` describes, with no breaker: see
    /// [`First`]. When the attempt does not settle the call, it resolves to what it [`Went`]
    /// through, and the call's loop goes on from [`Went::resume`].
    #[inline(always)]
    pub fn first<T, E, F>(spec: &'a Spec<'a>, attempt: F) -> First<'a, T, E, F, Unguarded>
    where
        F: Future<Output = Result<T, E>>,
    {
        First::new(spec, AtFirstPoll, Unguarded, attempt)
    }

    /// [`Retry::first`] under `breaker`, which the attempt asks first. An attempt is polled here
    /// only while the breaker is closed; the loop's first round admits it otherwise.
    #[inline(always)]
    pub fn first_permitted<T, E, F>(
        spec: &'a Spec<'a>,
        breaker: &'a CircuitBreaker,
        attempt: F,
    ) -> First<'a, T, E, F, Permitted<'a, E>>
    where
        F: Future<Output = Result<T, E>>,
        E: FromJobguard,
    {
        First::new(spec, AtFirstPoll, Permitted::new(Some(breaker)), attempt)
    }
}

pin_project_lite::pin_project! {
    /// A call's first attempt, from [`Retry::first`]: the success path of `#[retry]`. It holds
    /// the attempt and what it needs to hand the call over to the engine, and nothing to drop
    /// but the attempt: the call's state ([`Retry`]) is made only when the attempt does not
    /// settle the call.
    ///
    /// At its first poll, when the call is lean (nobody watches but `metrics`, no `timeout` or
    /// `budget`; decided now, once for the call) and its breaker, if any, is closed, it polls
    /// the attempt as attempt 1, and an `Ok` resolves it to `Break` at once. It resolves to
    /// `Continue` with what it [`Went`] through otherwise, and the loop's rounds go on from
    /// there ([`Went::resume`]): before the attempt is polled, when the call is not lean or the
    /// breaker is not closed (the loop's first round then makes attempt 1); or once the attempt
    /// failed, with its outcome (the first round settles it as a round settles its own
    /// attempt's: classified, then a retry or a give-up). An attempt pending after its first
    /// poll is polled here until it finishes.
    ///
    /// It decides nothing a round would not: it only accepts an `Ok`, and it is not used for a
    /// job with an `on_ok` classifier. Everything else is [`decide`]'s, in the rounds.
    #[must_use = "a first attempt does nothing unless awaited"]
    pub struct First<'a, T, E, F, G, W = AtFirstPoll> {
        spec: Counted<'a>,
        guard: G,
        // Who watches the call: read at the first poll, or decided by the caller.
        watch: W,
        // What the attempt needs once it went on past its first poll.
        pending: Option<Pended>,
        #[pin]
        attempt: F,
        output: PhantomData<fn() -> Result<T, E>>,
    }
}

/// Who watches a call, as a [`First`] learns it at its first poll.
pub(crate) trait WatchOf {
    /// The call's [`Watch`].
    fn watch(&self) -> Watch;
}

/// Read when the first attempt is first polled: `#[retry]`'s calls.
#[derive(Clone, Copy)]
pub struct AtFirstPoll;

impl WatchOf for AtFirstPoll {
    #[inline(always)]
    fn watch(&self) -> Watch {
        crate::observe::watch()
    }
}

/// Decided by the caller before it made the attempt: [`Policy::run`]'s calls.
impl WatchOf for Watch {
    #[inline(always)]
    fn watch(&self) -> Watch {
        *self
    }
}

/// The job a first attempt counts its attempt and success for, into the `metrics` recorder: a
/// call holds it only with that feature, the only one that watches a lean call.
#[derive(Clone, Copy)]
struct Counted<'a> {
    #[cfg(feature = "metrics")]
    spec: &'a Spec<'a>,
    spec_type: PhantomData<&'a Spec<'a>>,
}

impl<'a> Counted<'a> {
    #[inline(always)]
    fn new(spec: &'a Spec<'a>) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = spec;
        Counted {
            #[cfg(feature = "metrics")]
            spec,
            spec_type: PhantomData,
        }
    }

    /// Counts attempt 1 (with `metrics`).
    #[inline(always)]
    fn attempt(self) {
        #[cfg(feature = "metrics")]
        self.spec.count_attempt(1);
    }

    /// Counts the success of a call that succeeded on its first attempt after a pending poll,
    /// as a round's accepted outcome does (with `metrics`).
    fn succeeded(self) {
        #[cfg(feature = "metrics")]
        crate::observe::record_job(
            &Event::Succeeded {
                job: self.spec.job,
                key: self.spec.key,
                attempts: 1,
            },
            self.spec.known,
        );
    }
}

/// A first attempt pending after its first poll: who watches the call, the epoch of the closed
/// breaker the attempt runs in, the attempt's start (for [`attempt()`](crate::attempt())) and
/// its wall-clock start (for the dead letter), both to within its first poll. Plain data, so that [`First`] has nothing to
/// drop.
#[derive(Clone, Copy)]
struct Pended {
    watch: Watch,
    closed: Option<u32>,
    started: Option<Instant>,
    wall: SystemTime,
    /// The installed runtime when the attempt was first polled: the call's, as a round's
    /// (see [`Slow::installed`]).
    installed: Option<&'static Runtime>,
}

impl<'a, T, E, F, G, W> First<'a, T, E, F, G, W> {
    /// A first attempt for a call that `watch` watches: [`AtFirstPoll`] reads it then; a
    /// [`Watch`] is the caller's, who decided the call is lean before it made the attempt.
    #[inline(always)]
    fn new(spec: &'a Spec<'a>, watch: W, guard: G, attempt: F) -> Self {
        // Only an untimed policy's call starts here (`#[retry]` knows at compile time).
        debug_assert!(
            spec.untimed,
            "a first attempt for a policy with a time limit"
        );
        First {
            spec: Counted::new(spec),
            guard,
            watch,
            pending: None,
            attempt,
            output: PhantomData,
        }
    }
}

impl<'a, T, E, F, G, W> Future for First<'a, T, E, F, G, W>
where
    F: Future<Output = Result<T, E>>,
    G: Guard<'a, E>,
    W: WatchOf,
{
    type Output = ControlFlow<Result<T, E>, Went<T, E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let counted = *this.spec;
        if let Some(pended) = this.pending {
            return pending(counted, pended, this.guard.breaker(), this.attempt, cx);
        }
        let watch = this.watch.watch();
        if !Mode::new(watch, true).lean() {
            std::hint::cold_path();
            return Poll::Ready(ControlFlow::Continue(Went::unpolled(watch)));
        }
        let breaker = this.guard.breaker();
        let mut closed = None;
        if let Some(breaker) = breaker {
            match breaker.closed_epoch() {
                Some(epoch) => closed = Some(epoch),
                None => {
                    std::hint::cold_path();
                    return Poll::Ready(ControlFlow::Continue(Went::unpolled(watch)));
                }
            }
        }
        if cfg!(feature = "metrics") && watch == Watch::Metrics {
            counted.attempt();
        }
        let attempt = this.attempt;
        let (polled, learned) = attempt::poll_first(1, || attempt.poll(cx));
        match polled {
            Poll::Ready(Ok(value)) => {
                if let (Some(epoch), Some(breaker)) = (closed, breaker) {
                    breaker.closed_succeeded(epoch);
                }
                Poll::Ready(ControlFlow::Break(Ok(value)))
            }
            Poll::Ready(Err(error)) => {
                std::hint::cold_path();
                Poll::Ready(ControlFlow::Continue(Went {
                    watch,
                    closed,
                    finished: Some(Err(error)),
                    pended: None,
                }))
            }
            // What the attempt learned of its start is read before anything else polls.
            Poll::Pending => {
                *this.pending = Some(went_pending(watch, closed, learned.started()));
                Poll::Pending
            }
        }
    }
}

/// The first attempt is pending after its first poll: what its later polls need, and its
/// start, read now if the attempt did not ask for it during the poll (to within that poll, as a
/// round's attempt's), and its wall-clock start (a lean call has no time limit, so no timer is
/// set: it only waits).
#[cold]
#[inline(never)]
fn went_pending(watch: Watch, closed: Option<u32>, started: Option<Instant>) -> Pended {
    Pended {
        watch,
        closed,
        started: started.or_else(|| Some(Instant::now())),
        wall: SystemTime::now(),
        installed: Current::installed(),
    }
}

/// A later poll of a first attempt that was pending: polled as a round polls its attempt; an
/// `Ok` is accepted as a round accepts it, and a failure handed to the loop.
#[inline(never)]
fn pending<T, E, F: Future<Output = Result<T, E>>>(
    counted: Counted<'_>,
    pended: &mut Pended,
    breaker: Option<&CircuitBreaker>,
    attempt: Pin<&mut F>,
    cx: &mut Context<'_>,
) -> Poll<ControlFlow<Result<T, E>, Went<T, E>>> {
    let result = ready!(attempt::poll_in(1, &mut pended.started, || attempt.poll(cx)));
    let Pended {
        watch,
        closed,
        wall,
        installed,
        ..
    } = *pended;
    match result {
        Ok(value) => {
            if let (Some(epoch), Some(breaker)) = (closed, breaker) {
                breaker.closed_succeeded(epoch);
            }
            // As a round's accepted outcome: the one event of a lean call's success.
            if watch != Watch::Nobody {
                counted.succeeded();
            }
            Poll::Ready(ControlFlow::Break(Ok(value)))
        }
        Err(error) => Poll::Ready(ControlFlow::Continue(Went {
            watch,
            closed,
            finished: Some(Err(error)),
            pended: Some((wall, installed)),
        })),
    }
}

/// What a call's first attempt ([`First`]) went through when it did not settle the call: who
/// watches the call, and the attempt's failure if it finished (with the epoch of the closed
/// breaker it ran in, and its wall-clock start if it was pending first). The call's state is
/// made from it when the loop goes on ([`Went::resume`]).
pub struct Went<T, E> {
    watch: Watch,
    closed: Option<u32>,
    finished: Option<Result<T, E>>,
    /// The pending attempt's wall-clock start and the runtime installed at its first poll.
    pended: Option<(SystemTime, Option<&'static Runtime>)>,
}

impl<T, E> Went<T, E> {
    /// The first attempt was not polled: the loop's first round makes attempt 1.
    #[inline(always)]
    fn unpolled(watch: Watch) -> Self {
        Went {
            watch,
            closed: None,
            finished: None,
            pended: None,
        }
    }

    /// The call's state for the job `spec` describes (the first attempt's), from which the
    /// expansion's loop goes on: its first round settles the first attempt's outcome, if any.
    #[inline(never)]
    pub fn resume<'a>(self, spec: &'a Spec<'a>) -> Resume<'a, T, E> {
        let mut retry = Retry::watched(spec, self.watch);
        if self.finished.is_some() {
            retry.number = 1;
        }
        if let Some((wall, installed)) = self.pended {
            retry.slow.insert(Slow::new(installed)).stamp_wall(wall);
        }
        Resume {
            retry,
            finished: self.finished.map(|result| (result, self.closed)),
        }
    }
}

/// The round that settles a first attempt's failure: it has no attempt of its own.
pub type Settling<'r, 'a, T, E, C> =
    Round<'r, 'a, T, E, std::future::Pending<Result<T, E>>, C, AcceptOk, Unguarded>;

/// A call that its first attempt ([`First`]) did not settle: the call's state, and the first
/// attempt's outcome if it finished, which the loop's first round settles instead of running
/// its own attempt. Its rounds are [`Retry`]'s.
pub struct Resume<'a, T, E> {
    retry: Retry<'a>,
    finished: Option<(Result<T, E>, Option<u32>)>,
}

impl<'a, T, E> Resume<'a, T, E> {
    /// The number the next attempt will have, from 1 ([`Retry::next_attempt`]): 1 again when the
    /// first attempt was not polled, 2 after it failed.
    pub fn next_attempt(&self) -> u32 {
        self.retry.next_attempt()
    }

    /// The round that settles the first attempt's failure, with no attempt of its own: `None`
    /// when the first attempt did not finish (the next round then makes attempt 1).
    pub fn settle_first<C, V>(&mut self, on_err: C) -> Option<Settling<'_, 'a, T, E, C>>
    where
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        E: Describe,
    {
        let finished = self.finished.take()?;
        Some(
            self.retry
                .attempt(std::future::pending(), on_err)
                .finishing(Some(finished)),
        )
    }

    /// [`Retry::attempt`], after the first attempt.
    #[inline]
    pub fn attempt<F, C, V>(
        &mut self,
        attempt: F,
        on_err: C,
    ) -> Round<'_, 'a, T, E, F, C, AcceptOk, Unguarded>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        E: Describe,
    {
        let finished = self.finished.take();
        self.retry.attempt(attempt, on_err).finishing(finished)
    }

    /// [`Retry::attempt_permitted`], after the first attempt.
    #[inline]
    pub fn attempt_permitted<F, C, V>(
        &mut self,
        breaker: &'a CircuitBreaker,
        attempt: F,
        on_err: C,
    ) -> Round<'_, 'a, T, E, F, C, AcceptOk, Permitted<'a, E>>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        E: FromJobguard + Describe,
    {
        let finished = self.finished.take();
        self.retry
            .attempt_permitted(breaker, attempt, on_err)
            .finishing(finished)
    }
}

impl<'r, 'a, T, E, F, C, K, G> Round<'r, 'a, T, E, F, C, K, G> {
    /// The round settles `finished`, the outcome of the call's first attempt and the epoch of
    /// the closed breaker it ran in, instead of running its own attempt.
    #[inline]
    fn finishing(mut self, finished: Option<(Result<T, E>, Option<u32>)>) -> Self {
        if let Some((result, closed)) = finished {
            self.state = State::Finished(result, closed);
        }
        self
    }
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

    /// Completes `letter` with the history and the serialized payload. A payload that cannot be
    /// serialized is reported and left out: the letter itself is never lost for it.
    fn seal(&mut self, payload: Option<&dyn Payload>, letter: DeadLetter) -> DeadLetter {
        let history = Vec::from(std::mem::take(&mut self.history));
        with_payload(letter.with_history(history), payload)
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
    /// `f` is called with the attempt number (from 1). Failures are classified by
    /// [`Transient`](crate::Transient); the give-up goes to the runtime's dead-letter sink, and
    /// the last error is returned.
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
    pub async fn run<T, E, F>(&self, job: &str, mut f: F) -> Result<T, E>
    where
        F: AsyncFnMut(u32) -> Result<T, E>,
        E: crate::Transient + From<Error> + Describe,
    {
        let spec = Spec::named(job, self);
        // As `#[retry]` starts, when the call is lean (decided here, once): the first attempt
        // alone, the call's state made only if it goes on. `f` is called once per attempt, so
        // that a closure with work before its `async` part does it once: the call is known to
        // be lean before `f(1)`, and attempt 1's failure is settled by a round of its own.
        let watch = crate::observe::watch();
        if !spec.untimed || !Mode::new(watch, true).lean() {
            return self.run_if_ok(job, f, |_: &T| Verdict::Fail).await;
        }
        let mut retry = match First::new(&spec, watch, Unguarded, f(1)).await {
            ControlFlow::Break(done) => return done,
            ControlFlow::Continue(went) => went.resume(&spec),
        };
        if let Some(settle) = retry.settle_first(crate::Transient::verdict)
            && let ControlFlow::Break(done) = settle.await
        {
            return done;
        }
        loop {
            let attempt = retry.next_attempt();
            let round = retry.attempt(f(attempt), crate::Transient::verdict);
            if let ControlFlow::Break(done) = round.await {
                return done;
            }
        }
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
        let mut retry = Retry::new(&spec);
        // One loop per kind of round: a policy without a time limit has nothing of jobguard's
        // that can fail an attempt, so its rounds hold nothing for it.
        macro_rules! rounds {
            ($attempt:ident $(, $breaker:expr)?) => {
                loop {
                    let attempt = retry.next_attempt();
                    let round = retry
                        .$attempt($($breaker,)? f(attempt), crate::Transient::verdict)
                        .on_ok(|value: &T| on_ok(value).into());
                    if let ControlFlow::Break(done) = round.await {
                        return done;
                    }
                }
            };
        }
        if spec.untimed {
            rounds!(attempt)
        } else {
            rounds!(attempt_guarded, None)
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
    fn the_runtime_s_own_refusals_give_up_with_their_reason() {
        assert_eq!(
            decide(
                &POLICY,
                1,
                Origin::CircuitOpen,
                Verdict::Retry,
                None,
                CLOSED,
                never
            ),
            Decision::GiveUp(GiveUp::CircuitOpen)
        );
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
        retry: &mut Retry<'a>,
        breaker: Option<&'a CircuitBreaker>,
        mut attempt: impl FnMut(u32) -> Fut,
    ) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        loop {
            let n = retry.next_attempt();
            let round = retry.attempt_guarded(breaker, attempt(n), |_: &Error| Verdict::Retry);
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
        let mut retry = Retry::new(&spec);
        let mut round = std::pin::pin!(retry.attempt_permitted(
            &breaker,
            async { Ok::<u32, Error>(7) },
            |_: &Error| Verdict::Retry
        ));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(matches!(
            round.as_mut().poll(&mut cx),
            Poll::Ready(ControlFlow::Break(Ok(7)))
        ));
        // Whichever path took it (inline when nobody watches), a resolved round is done: polled
        // again, it panics rather than ask the breaker again (open now: that would be a refusal,
        // a give-up and a dead letter for a call that succeeded).
        breaker.trip();
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = round.as_mut().poll(&mut cx);
        }));
        assert!(again.is_err());
    }

    #[test]
    fn a_call_with_a_time_limit_is_not_lean() {
        let limited = ZERO.timeout(Duration::from_secs(1));
        assert!(!Retry::new(&Spec::named("job", &limited)).mode.lean());
        let budgeted = ZERO.budget(Duration::from_secs(1));
        assert!(!Retry::new(&Spec::named("job", &budgeted)).mode.lean());
        let spec = Spec::named("job", &ZERO);
        let plain = Retry::new(&spec);
        assert_eq!(
            plain.mode.lean(),
            matches!(plain.mode.watch(), Watch::Nobody | Watch::Metrics)
        );
        // Every watch, timed or not, reads back as itself; only an untimed one nobody but
        // `metrics` watches is lean.
        for watch in [
            Watch::Nobody,
            Watch::Observers,
            Watch::Metrics,
            Watch::Integrations,
        ] {
            for untimed in [true, false] {
                let mode = Mode::new(watch, untimed);
                assert!(mode.watch() == watch);
                assert_eq!(
                    mode.lean(),
                    untimed && matches!(watch, Watch::Nobody | Watch::Metrics)
                );
            }
        }
    }

    // The tests below hold on either path of `Round::poll`: the inline one (a call nobody watches,
    // as in a build without `metrics` and `tracing`, `cargo test -p jobguard`) and `Round::drive`.

    #[tokio::test(start_paused = true)]
    async fn an_attempt_pending_at_its_first_poll_keeps_its_number() {
        let spec = Spec::named("job", &ZERO);
        let mut retry = Retry::new(&spec);
        let got = call(&mut retry, None, |n| async move {
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
        let mut retry = Retry::new(&spec);
        let mut seen = Vec::new();
        let got = call(&mut retry, None, |n| {
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
        let mut retry = Retry::new(&spec);
        let mut made = 0;
        let got: Result<(), Error> = call(&mut retry, Some(&breaker), |_| {
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
        // The futures were made (the loop makes one per round) but never polled.
        assert_eq!(made, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_hears_of_a_success_and_of_a_failure() {
        let breaker = CircuitBreaker::new(1, Duration::from_secs(30));
        let once = ZERO.attempts(1);
        let sink = crate::MemoryDeadLetters::new();
        let spec = Spec::named("job", &once);
        let mut retry = Retry::new(&spec);
        let ok = call(&mut retry, Some(&breaker), |_| async { Ok(7) }).await;
        assert_eq!(ok.unwrap(), 7);
        assert_eq!(breaker.state(), crate::BreakerState::Closed);
        let spec = Spec::named("job", &once).dead_letter(&sink);
        let mut retry = Retry::new(&spec);
        let failed: Result<(), Error> = call(&mut retry, Some(&breaker), |_| async {
            Err(Error::Timeout)
        })
        .await;
        assert!(matches!(failed, Err(Error::Timeout)));
        assert_eq!(breaker.state(), crate::BreakerState::Open);
        assert_eq!(sink.letters()[0].reason, GiveUp::Exhausted);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ok_that_on_ok_retries_goes_round_again() {
        let spec = Spec::named("job", &ZERO);
        let mut retry = Retry::new(&spec);
        let got: Result<u32, Error> = loop {
            let n = retry.next_attempt();
            let round = retry
                .attempt_guarded(None, async move { Ok(n) }, |_: &Error| Verdict::Retry)
                .on_ok(|n: &u32| {
                    if *n < 2 {
                        Verdict::Retry
                    } else {
                        Verdict::Fail
                    }
                });
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
        let letter = trail.seal(
            None,
            DeadLetter::new(
                "job",
                None,
                GiveUp::Exhausted,
                7,
                "6",
                SystemTime::UNIX_EPOCH,
                SystemTime::UNIX_EPOCH,
            ),
        );
        assert_eq!(letter.history, ["2", "3", "4", "5", "6"]);
    }
}
