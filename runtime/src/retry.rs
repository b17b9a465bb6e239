//! The retry loop: one attempt at a time, classified, delayed, given up on.
//!
//! [`Retry`] is the state of one job call. `#[retry]` expands to a `loop` over
//! [`Retry::attempt`] (or [`Retry::attempt_guarded`] with a breaker, timeout or budget), each
//! call one attempt and what follows it; [`Policy::run`](crate::Policy::run) is the same loop for
//! closures. The success path allocates nothing and takes no lock.

use crate::breaker::{CircuitBreaker, Permit};
use crate::dead_letter::{DeadLetter, DeadLetterSink, GiveUp, Payload, Trail};
use crate::observe::{Event, Job};
use crate::runtime::Current;
use crate::{Error, Policy, Runtime, Verdict};
use core::ops::ControlFlow;
use rand::rngs::SmallRng;
use std::fmt::Display;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// The state of one call of a retried job.
pub struct Retry<'a> {
    job: &'a str,
    /// The job's static descriptor, when the name is known at compile time.
    known: Option<&'static Job>,
    key: Option<&'a str>,
    policy: &'a Policy,
    breaker: Option<&'a CircuitBreaker>,
    sink: Option<&'a dyn DeadLetterSink>,
    attempt: u32,
    /// The first attempt's start on tokio's clock, read only when a `timeout` or `budget` needs it.
    started: Option<Instant>,
    /// The wall-clock starts of the first and the latest attempt, for the dead letter.
    first_wall: Option<SystemTime>,
    last_wall: Option<SystemTime>,
    /// Whether the current attempt's wall-clock start has been taken.
    stamped: bool,
    payload: Option<&'a dyn Payload>,
    /// The runtime handle, the breaker permit and the failure state: what the call may own.
    held: Held<'a>,
    #[cfg(feature = "tracing")]
    span: crate::observe::tracing::JobSpan,
}

/// What a call may come to own, each part made only when it is needed, behind one flag: a call
/// that succeeds at once without a breaker or an observer owns none of them, and dropping its
/// state is one branch. Every part is set through a method here, so the flag cannot be missed.
struct Held<'a> {
    /// The runtime in scope, looked up the first time the call needs it: a call that succeeds
    /// in a process where no runtime has an observer never looks it up.
    runtime: ManuallyDrop<Option<Current>>,
    /// The installed runtime when the call started, if any (see [`Current::installed`]).
    installed: Option<&'static Runtime>,
    permit: ManuallyDrop<Option<Permit<'a>>>,
    /// What only a failure needs, allocated at the first one.
    failures: ManuallyDrop<Option<Box<Failures>>>,
    /// Whether any of the three may be `Some`.
    any: bool,
}

impl<'a> Held<'a> {
    #[inline]
    fn new() -> Self {
        Held {
            runtime: ManuallyDrop::new(None),
            installed: Current::installed(),
            permit: ManuallyDrop::new(None),
            failures: ManuallyDrop::new(None),
            any: false,
        }
    }

    /// The runtime in scope.
    fn runtime(&mut self) -> &Runtime {
        self.any = true;
        let installed = self.installed;
        self.runtime
            .get_or_insert_with(|| Current::with_installed(installed))
    }

    /// The failure state, made at the first failure; `base` seeds decorrelated jitter.
    fn failures(&mut self, base: Duration) -> &mut Failures {
        self.any = true;
        self.failures.get_or_insert_with(|| Failures::new(base))
    }

    /// Both at once, for the jitter's random stream.
    fn runtime_and_failures(&mut self, base: Duration) -> (&Runtime, &mut Failures) {
        self.any = true;
        let installed = self.installed;
        let runtime = self
            .runtime
            .get_or_insert_with(|| Current::with_installed(installed));
        let failures = self.failures.get_or_insert_with(|| Failures::new(base));
        (runtime, failures)
    }

    fn set_permit(&mut self, permit: Permit<'a>) {
        self.any = true;
        *self.permit = Some(permit);
    }

    #[inline]
    fn take_permit(&mut self) -> Option<Permit<'a>> {
        self.permit.take()
    }
}

impl Drop for Held<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.any {
            // SAFETY: each is dropped once, here, and never used after.
            unsafe {
                ManuallyDrop::drop(&mut self.permit);
                ManuallyDrop::drop(&mut self.failures);
                ManuallyDrop::drop(&mut self.runtime);
            }
        }
    }
}

/// The state only a failing call needs.
struct Failures {
    /// The last delay, for decorrelated jitter.
    previous_delay: Duration,
    rng: Option<SmallRng>,
    trail: Trail,
}

impl Failures {
    #[cold]
    fn new(base: Duration) -> Box<Self> {
        Box::new(Failures {
            previous_delay: base,
            rng: None,
            trail: Trail::new(),
        })
    }
}

/// Where a failed attempt's error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Body,
    Timeout,
    Budget,
    CircuitOpen,
}

/// The result of one guarded attempt, as `Retry::settle` takes it.
#[must_use]
struct Attempted<T, E> {
    result: Result<T, E>,
    origin: Origin,
}

impl<'a> Retry<'a> {
    /// The state for one call of the job named `job`, under `policy`, with the runtime in scope.
    pub fn new(job: &'a str, policy: &'a Policy) -> Self {
        Self::build(job, None, policy)
    }

    #[inline(always)]
    fn build(job: &'a str, known: Option<&'static Job>, policy: &'a Policy) -> Self {
        Retry {
            job,
            known,
            key: None,
            policy,
            breaker: None,
            sink: None,
            attempt: 0,
            started: None,
            first_wall: None,
            last_wall: None,
            stamped: false,
            payload: None,
            held: Held::new(),
            #[cfg(feature = "tracing")]
            span: crate::observe::tracing::JobSpan::new(),
        }
    }

    /// The state for one call of the job `job` declares, under `policy`: what `#[retry]` uses, with
    /// `job` in a `static`.
    #[inline]
    pub fn of(job: &'static Job, policy: &'a Policy) -> Self {
        Self::build(job.name(), Some(job), policy)
    }

    /// The idempotency key, carried into events and the dead letter.
    pub fn key(mut self, key: &'a str) -> Self {
        self.key = Some(key);
        self
    }

    /// A breaker checked before every attempt.
    pub fn breaker(mut self, breaker: &'a CircuitBreaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// The sink for this job's give-up, instead of the runtime's.
    pub fn dead_letter(mut self, sink: &'a dyn DeadLetterSink) -> Self {
        self.sink = Some(sink);
        self
    }

    /// The job's arguments, serialized into the dead letter's `payload` if the job gives up, and
    /// never otherwise: the success path neither serializes nor allocates.
    pub fn payload<P: crate::__private::Payload>(mut self, payload: &'a P) -> Self {
        self.payload = Some(payload);
        self
    }

    /// Whether anything could see an event: an observer somewhere in the process, or the
    /// `metrics` or `tracing` integration. Without any, the success path builds no event.
    #[inline(always)]
    fn observing() -> bool {
        cfg!(any(feature = "metrics", feature = "tracing")) || crate::observe::observed()
    }

    /// Raises `event` on the runtime, inside the call's span with the `tracing` feature.
    #[inline]
    fn emit(&mut self, event: &Event<'_>) {
        let runtime = match crate::observe::observed() {
            true => Some(self.held.runtime()),
            false => None,
        };
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter(self.job, self.key);
        match runtime {
            Some(runtime) => runtime.emit_job(event, self.known),
            None => crate::observe::record_job(event, self.known),
        }
    }

    /// The failure state, made at the first failure.
    #[cold]
    fn failures(&mut self) -> &mut Failures {
        self.held.failures(self.policy.base)
    }

    /// The number the next attempt will have, from 1.
    pub fn next_attempt(&self) -> u32 {
        self.attempt + 1
    }

    fn begin(&mut self) {
        self.attempt += 1;
        self.stamped = false;
        #[cfg(feature = "tracing")]
        self.span.record_attempt(self.job, self.key, self.attempt);
        if Self::observing() {
            self.emit(&Event::Attempt {
                job: self.job,
                key: self.key,
                attempt: self.attempt,
            });
        }
    }

    /// Takes the current attempt's wall-clock start, once.
    #[cold]
    fn stamp(&mut self) {
        if !self.stamped {
            self.stamped = true;
            let now = SystemTime::now();
            self.first_wall.get_or_insert(now);
            self.last_wall = Some(now);
        }
    }

    /// Awaits one attempt, taking its wall-clock start only when a dead letter could need it: when
    /// the attempt does not finish on its first poll, or finishes with an error. That is its
    /// start to within one poll, and an attempt that succeeds at once reads no clock at all.
    async fn watch<T, E, F>(&mut self, attempt: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        #[cfg(feature = "tracing")]
        let span = self.span.handle(self.job, self.key);
        let mut attempt = std::pin::pin!(attempt);
        let result = std::future::poll_fn(|cx| {
            #[cfg(feature = "tracing")]
            let _entered = span.as_ref().map(tracing::Span::enter);
            let polled = attempt.as_mut().poll(cx);
            if polled.is_pending() {
                self.stamp();
            }
            polled
        })
        .await;
        if result.is_err() {
            self.stamp();
        }
        result
    }

    /// Runs one attempt of a job with no breaker, timeout or budget (so the runtime cannot fail
    /// on its own and `E` needs nothing from jobguard), and decides what follows it: `Break` with
    /// the result to return (a success, or the last error once the give-up is dead-lettered), or
    /// `Continue` once the delay before the next attempt has passed. A success is settled inside
    /// the attempt's own poll; only a failure allocates, for the wait.
    pub fn attempt<T, E, F, C, V>(
        &mut self,
        attempt: F,
        classify: C,
    ) -> impl Future<Output = ControlFlow<Result<T, E>>>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> V,
        V: Into<Verdict>,
        E: Display,
    {
        self.begin();
        Step {
            #[cfg(feature = "tracing")]
            span: self.span.handle(self.job, self.key),
            fail: Retry::failed::<T, E>,
            retry: Some(self),
            classify: Some(classify),
            future: attempt,
            failing: None,
            _value: std::marker::PhantomData,
        }
    }

    /// Runs one attempt under the breaker, the per-attempt timeout and the budget. `attempt` is
    /// not polled when the breaker refuses it.
    #[allow(clippy::manual_async_fn)] // the bound is on the call, not on an `async fn`'s future
    pub fn attempt_guarded<T, E, F, V>(
        &mut self,
        attempt: F,
        classify: impl FnOnce(&E) -> V,
    ) -> impl Future<Output = ControlFlow<Result<T, E>>>
    where
        F: Future<Output = Result<T, E>>,
        E: crate::__private::FromJobguard + Display,
        V: Into<Verdict>,
    {
        // Not an `async fn`: a missing `From<jobguard::Error>` is then one error at the call, in
        // the words of `FromJobguard`, not a second one at the `.await`.
        async move {
            let attempted = self.guarded(attempt).await;
            self.settle(attempted, classify).await
        }
    }

    async fn guarded<T, E, F>(&mut self, attempt: F) -> Attempted<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: crate::__private::FromJobguard,
    {
        if let Some(breaker) = self.breaker {
            match breaker.acquire() {
                Ok(permit) => self.held.set_permit(permit),
                Err(retry_in) => {
                    // Refused: no attempt is made or counted.
                    return Attempted {
                        result: Err(E::from(Error::CircuitOpen { retry_in })),
                        origin: Origin::CircuitOpen,
                    };
                }
            }
        }
        self.begin();
        let (deadline, origin) = match (self.policy.timeout, self.policy.budget) {
            // A breaker alone needs no clock.
            (None, None) => (None, Origin::Body),
            (timeout, budget) => {
                let now = Instant::now();
                let start = *self.started.get_or_insert(now);
                // A limit too far out to represent is no limit.
                let budget_end = budget.and_then(|b| start.checked_add(b));
                let timeout_end = timeout.and_then(|t| now.checked_add(t));
                match (timeout_end, budget_end) {
                    (Some(t), Some(b)) if b < t => (Some(b), Origin::Budget),
                    (Some(t), _) => (Some(t), Origin::Timeout),
                    (None, Some(b)) => (Some(b), Origin::Budget),
                    (None, None) => (None, Origin::Body),
                }
            }
        };
        match deadline {
            None => Attempted {
                result: self.watch(attempt).await,
                origin: Origin::Body,
            },
            Some(at) => match tokio::time::timeout_at(at, self.watch(attempt)).await {
                Ok(result) => Attempted {
                    result,
                    origin: Origin::Body,
                },
                Err(_) => {
                    let error = if origin == Origin::Budget {
                        Error::Budget
                    } else {
                        Error::Timeout
                    };
                    Attempted {
                        result: Err(E::from(error)),
                        origin,
                    }
                }
            },
        }
    }

    /// Decides what follows a guarded attempt; see [`Retry::attempt`].
    async fn settle<T, E, V>(
        &mut self,
        attempted: Attempted<T, E>,
        classify: impl FnOnce(&E) -> V,
    ) -> ControlFlow<Result<T, E>>
    where
        E: Display,
        V: Into<Verdict>,
    {
        let Attempted { result, origin } = attempted;
        match result {
            Ok(value) => {
                self.succeeded();
                ControlFlow::Break(Ok(value))
            }
            Err(error) => {
                // The runtime's own failures are classified by the runtime, whatever `E` says.
                let verdict = match origin {
                    Origin::Body => classify(&error).into(),
                    Origin::Timeout => Verdict::Retry,
                    Origin::Budget | Origin::CircuitOpen => Verdict::Fail,
                };
                Box::pin(self.failed(error, origin, verdict)).await
            }
        }
    }

    /// Books a success: the breaker's permit, the event.
    #[inline]
    fn succeeded(&mut self) {
        if let Some(permit) = self.held.take_permit() {
            permit.success();
        }
        if Self::observing() {
            self.emit(&Event::Succeeded {
                job: self.job,
                key: self.key,
                attempts: self.attempt,
            });
        }
    }

    /// What follows a failed attempt: a give-up, or the wait before the next attempt.
    async fn failed<T, E: Display>(
        &mut self,
        error: E,
        origin: Origin,
        verdict: Verdict,
    ) -> ControlFlow<Result<T, E>> {
        self.failures().trail.failed(&error);
        // A transient failure (or a cut attempt) counts against the breaker. A permanent one says
        // nothing about the dependency's health: its permit is dropped here, neutral.
        if let Some(permit) = self.held.take_permit()
            && (verdict.is_retryable() || origin == Origin::Budget)
        {
            permit.failure();
        }
        let give_up = match origin {
            Origin::CircuitOpen => Some(GiveUp::CircuitOpen),
            Origin::Budget => Some(GiveUp::Budget),
            _ if verdict == Verdict::Fail => Some(GiveUp::Permanent),
            _ if self.attempt >= self.policy.attempts => Some(GiveUp::Exhausted),
            _ => None,
        };
        if let Some(reason) = give_up {
            self.give_up(reason, error.to_string()).await;
            return ControlFlow::Break(Err(error));
        }
        let delay = match verdict {
            Verdict::RetryAfter(exact) => exact,
            _ => self.jittered(self.attempt),
        };
        self.failures().previous_delay = delay;
        if let Some(budget) = self.policy.budget {
            let start = *self.started.get_or_insert_with(Instant::now);
            let beyond = match (Instant::now().checked_add(delay), start.checked_add(budget)) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(next), Some(end)) => next >= end,
            };
            if beyond {
                // The next attempt could not start inside the budget: give up now, not later.
                self.give_up(GiveUp::Budget, error.to_string()).await;
                return ControlFlow::Break(Err(error));
            }
        }
        self.emit(&Event::Retry {
            job: self.job,
            key: self.key,
            attempt: self.attempt,
            delay,
            verdict,
            error: &error,
        });
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        ControlFlow::Continue(())
    }

    fn jittered(&mut self, retry: u32) -> Duration {
        let p = self.policy;
        let curve = p.delay(retry);
        if !p.jitter.is_random() {
            return curve;
        }
        let (runtime, failures) = self.held.runtime_and_failures(p.base);
        let rng = failures.rng.get_or_insert_with(|| runtime.rng());
        p.jitter
            .apply(curve, failures.previous_delay, p.base, p.cap, rng)
    }

    /// Takes the last error's message, not the error: `&E` held across the send would make the
    /// call's future `Send` only for `E: Sync`.
    async fn give_up(&mut self, reason: GiveUp, error: String) {
        let now = SystemTime::now();
        let first = self.first_wall.unwrap_or(now);
        let letter = DeadLetter::new(
            self.job,
            self.key.map(str::to_owned),
            reason,
            self.attempt,
            error,
            first,
            self.last_wall.unwrap_or(first),
        );
        let payload = self.payload;
        let letter = self.failures().trail.seal(payload, letter);
        self.emit(&Event::DeadLetter(&letter));
        #[cfg(feature = "tracing")]
        let span = self.span.handle(self.job, self.key);
        let send = match self.sink {
            Some(sink) => sink.send(letter),
            None => self.held.runtime().inner.dead_letters.send(letter),
        };
        #[cfg(feature = "tracing")]
        let send = tracing::Instrument::instrument(send, span.unwrap_or_else(tracing::Span::none));
        let sent = send.await;
        if let Err(e) = sent {
            crate::observe::log_error(format_args!(
                "jobguard: job {} gave up ({reason}) but its dead letter was lost: {e}",
                self.job
            ));
        }
    }
}

/// One attempt in flight and what follows it, as [`Retry::attempt`] returns it: the job's body,
/// run inside the call's span, then the success booked in the same poll, or the failure's wait
/// (boxed, so that the success path's future stays small).
struct Step<'r, 'a, T, E, F, C, S> {
    /// The call's state; handed to the failure's wait when there is one.
    retry: Option<&'r mut Retry<'a>>,
    classify: Option<C>,
    fail: fn(&'r mut Retry<'a>, E, Origin, Verdict) -> S,
    failing: Option<Pin<Box<S>>>,
    #[cfg(feature = "tracing")]
    span: Option<tracing::Span>,
    /// The body; pinned with `Step`.
    future: F,
    _value: std::marker::PhantomData<fn() -> T>,
}

impl<T, E, F, C, V, S> Future for Step<'_, '_, T, E, F, C, S>
where
    F: Future<Output = Result<T, E>>,
    C: FnOnce(&E) -> V,
    V: Into<Verdict>,
    S: Future<Output = ControlFlow<Result<T, E>>>,
{
    type Output = ControlFlow<Result<T, E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: only `future` is pinned structurally: it is never moved out of `self`, `Step`
        // has no `Drop` that could move it, and `Step` is `Unpin` only when `F` is. Every other
        // field is moved freely, as nothing pins them.
        let this = unsafe { self.get_unchecked_mut() };
        if let Some(failing) = &mut this.failing {
            return failing.as_mut().poll(cx);
        }
        assert!(this.retry.is_some(), "`Step` polled after completion");
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        let polled = {
            #[cfg(feature = "tracing")]
            let _entered = this.span.as_ref().map(tracing::Span::enter);
            future.poll(cx)
        };
        let retry = this
            .retry
            .as_deref_mut()
            .expect("`Step` polled after completion");
        match polled {
            Poll::Pending => {
                retry.stamp();
                Poll::Pending
            }
            Poll::Ready(Ok(value)) => {
                retry.succeeded();
                this.retry = None;
                Poll::Ready(ControlFlow::Break(Ok(value)))
            }
            Poll::Ready(Err(error)) => {
                retry.stamp();
                let classify = this.classify.take().expect("classified once");
                let verdict = classify(&error).into();
                let retry = this.retry.take().expect("checked above");
                let failing =
                    this.failing
                        .insert(Box::pin((this.fail)(retry, error, Origin::Body, verdict)));
                failing.as_mut().poll(cx)
            }
        }
    }
}
