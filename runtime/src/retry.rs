//! The retry loop: one attempt at a time, classified, delayed, given up on.
//!
//! [`Retry`] is the state of one job call. `#[retry]` expands to a `loop` over
//! [`Retry::attempt`] and [`Retry::settle`]; [`Policy::run`](crate::Policy::run) is the same loop
//! for closures. The success path allocates nothing and takes no lock.

use crate::breaker::{CircuitBreaker, Permit};
use crate::dead_letter::{DeadLetter, DeadLetterSink, GiveUp, Payload, Trail};
use crate::observe::{Event, Job};
use crate::runtime::Current;
use crate::{Error, Policy, Runtime, Verdict};
use core::ops::ControlFlow;
use rand::rngs::SmallRng;
use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;
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
    /// The runtime in scope, looked up the first time the call needs it: a call that succeeds
    /// in a process where no runtime has an observer never looks it up.
    runtime: Option<Current>,
    attempt: u32,
    /// The first attempt's start on tokio's clock, read only when a `timeout` or `budget` needs it.
    started: Option<Instant>,
    /// The wall-clock starts of the first and the latest attempt, for the dead letter.
    first_wall: Option<SystemTime>,
    last_wall: Option<SystemTime>,
    /// Whether the current attempt's wall-clock start has been taken.
    stamped: bool,
    permit: Option<Permit<'a>>,
    payload: Option<&'a dyn Payload>,
    /// What only a failure needs, allocated at the first one.
    failures: Option<Box<Failures>>,
    #[cfg(feature = "tracing")]
    span: crate::observe::tracing::JobSpan,
}

/// The state only a failing call needs.
struct Failures {
    /// The last delay, for decorrelated jitter.
    previous_delay: Duration,
    rng: Option<SmallRng>,
    trail: Trail,
}

/// Where a failed attempt's error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Body,
    Timeout,
    Budget,
    CircuitOpen,
}

/// The result of one attempt, as [`Retry::settle`] takes it.
#[must_use]
pub struct Attempted<T, E> {
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
            runtime: None,
            attempt: 0,
            started: None,
            first_wall: None,
            last_wall: None,
            stamped: false,
            permit: None,
            payload: None,
            failures: None,
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
    pub fn payload<P: serde::Serialize + Sync>(mut self, payload: &'a P) -> Self {
        self.payload = Some(payload);
        self
    }

    /// Raises `event` on the runtime, inside the call's span with the `tracing` feature.
    #[inline]
    fn emit(&mut self, event: &Event<'_>) {
        let runtime = match crate::observe::observed() {
            true => Some(&**self.runtime.get_or_insert_with(Current::get)),
            false => None,
        };
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter(self.job, self.key);
        match runtime {
            Some(runtime) => runtime.emit_job(event, self.known),
            None => crate::observe::record_job(event, self.known),
        }
    }

    /// The runtime in scope.
    fn runtime(&mut self) -> &Runtime {
        self.runtime.get_or_insert_with(Current::get)
    }

    /// The failure state, made at the first failure.
    #[cold]
    fn failures(&mut self) -> &mut Failures {
        let base = self.policy.base;
        self.failures.get_or_insert_with(|| {
            Box::new(Failures {
                previous_delay: base,
                rng: None,
                trail: Trail::new(),
            })
        })
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
        self.emit(&Event::Attempt {
            job: self.job,
            key: self.key,
            attempt: self.attempt,
        });
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

    /// Runs one attempt of a job with no breaker, timeout or budget, so the runtime cannot fail
    /// on its own and `E` needs nothing from jobguard.
    pub fn attempt<T, E, F>(&mut self, attempt: F) -> AttemptFuture<'_, 'a, F>
    where
        F: Future<Output = Result<T, E>>,
    {
        self.begin();
        AttemptFuture {
            #[cfg(feature = "tracing")]
            span: self.span.handle(self.job, self.key),
            retry: self,
            future: attempt,
        }
    }

    /// Runs one attempt under the breaker, the per-attempt timeout and the budget. `attempt` is
    /// not polled when the breaker refuses it.
    pub async fn attempt_guarded<T, E, F>(&mut self, attempt: F) -> Attempted<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: crate::__private::FromJobguard,
    {
        if let Some(breaker) = self.breaker {
            match breaker.acquire() {
                Ok(permit) => self.permit = Some(permit),
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

    /// Decides what follows an attempt: `Break` with the result to return (success, or the last
    /// error after a give-up has been dead-lettered), or `Continue` after waiting out the delay.
    /// A success is decided here and now; only a failure has anything to await.
    pub fn settle<T, E, V>(
        &mut self,
        attempted: Attempted<T, E>,
        classify: impl FnOnce(&E) -> V,
    ) -> Settle<T, E, impl Future<Output = ControlFlow<Result<T, E>>>>
    where
        E: Display,
        V: Into<Verdict>,
    {
        let Attempted { result, origin } = attempted;
        match result {
            Ok(value) => {
                if let Some(permit) = self.permit.take() {
                    permit.success();
                }
                self.emit(&Event::Succeeded {
                    job: self.job,
                    key: self.key,
                    attempts: self.attempt,
                });
                Settle(Settled::Done(Some(value)), PhantomData)
            }
            Err(error) => {
                // The runtime's own failures are classified by the runtime, whatever `E` says.
                let verdict = match origin {
                    Origin::Body => classify(&error).into(),
                    Origin::Timeout => Verdict::Retry,
                    Origin::Budget | Origin::CircuitOpen => Verdict::Fail,
                };
                Settle(
                    Settled::Failed(Box::pin(self.failed(error, origin, verdict))),
                    PhantomData,
                )
            }
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
        if let Some(permit) = self.permit.take()
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
            self.give_up(reason, &error).await;
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
                self.give_up(GiveUp::Budget, &error).await;
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
        let runtime = self.runtime.get_or_insert_with(Current::get);
        let base = p.base;
        let failures = self.failures.get_or_insert_with(|| {
            Box::new(Failures {
                previous_delay: base,
                rng: None,
                trail: Trail::new(),
            })
        });
        let rng = failures.rng.get_or_insert_with(|| runtime.rng());
        p.jitter
            .apply(curve, failures.previous_delay, p.base, p.cap, rng)
    }

    async fn give_up<E: Display>(&mut self, reason: GiveUp, error: &E) {
        let now = SystemTime::now();
        let first = self.first_wall.unwrap_or(now);
        let letter = DeadLetter::new(
            self.job,
            self.key.map(str::to_owned),
            reason,
            self.attempt,
            error.to_string(),
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
            None => self.runtime().inner.dead_letters.send(letter),
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

/// One attempt in flight, as [`Retry::attempt`] returns it: the job's body, run inside the call's
/// span, with its wall-clock start taken only if a dead letter could need it (see
/// [`Retry::watch`]).
#[must_use = "futures do nothing unless polled"]
pub struct AttemptFuture<'r, 'a, F> {
    retry: &'r mut Retry<'a>,
    #[cfg(feature = "tracing")]
    span: Option<tracing::Span>,
    future: F,
}

impl<T, E, F: Future<Output = Result<T, E>>> Future for AttemptFuture<'_, '_, F> {
    type Output = Attempted<T, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `future` is pinned structurally: it is never moved out of `self`, `self` has
        // no `Drop` that could move it, and `AttemptFuture` is `Unpin` only when `F` is.
        let this = unsafe { self.get_unchecked_mut() };
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        #[cfg(feature = "tracing")]
        let _entered = this.span.as_ref().map(tracing::Span::enter);
        match future.poll(cx) {
            Poll::Pending => {
                this.retry.stamp();
                Poll::Pending
            }
            Poll::Ready(result) => {
                if result.is_err() {
                    this.retry.stamp();
                }
                Poll::Ready(Attempted {
                    result,
                    origin: Origin::Body,
                })
            }
        }
    }
}

/// What follows one attempt, as [`Retry::settle`] returns it: ready at once after a success,
/// a boxed wait (allocated on the failure path only) after a failure.
#[must_use = "futures do nothing unless polled"]
pub struct Settle<T, E, S>(Settled<T, S>, PhantomData<fn() -> E>);

enum Settled<T, S> {
    Done(Option<T>),
    Failed(Pin<Box<S>>),
}

// Nothing inside is pinned: the value is moved out by `take`, the wait is boxed.
impl<T, E, S> Unpin for Settle<T, E, S> {}

impl<T, E, S: Future<Output = ControlFlow<Result<T, E>>>> Future for Settle<T, E, S> {
    type Output = ControlFlow<Result<T, E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Settled::Done(value) => Poll::Ready(ControlFlow::Break(Ok(value
                .take()
                .expect("`Settle` polled after completion")))),
            Settled::Failed(wait) => wait.as_mut().poll(cx),
        }
    }
}
