//! Spans and events through [`tracing`](https://docs.rs/tracing) (feature `tracing`).
//!
//! Every call of a retried job runs in one span, target `jobguard`, named [`SPAN`], with the
//! fields `job`, `key` (when the job has one) and `attempt`, which is recorded as each attempt
//! starts. The job's body runs inside it, so its own events nest under the call.
//!
//! Events, all with target `jobguard`:
//!
//! | event | level | message | fields |
//! |---|---|---|---|
//! | a failed attempt will be retried | `INFO` | `retrying` | `attempt`, `delay`, `verdict`, `error` |
//! | the job gave up | `WARN` | `gave up` | `job`, `key`, `reason`, `attempts`, `error` (a poison job's letter is raised outside the retry loop's span) |
//! | the sink refused the job's dead letter | `WARN` | `dead letter lost` | `job`, `key`, `reason`, `attempts`, `error` (the sink's) |
//! | the job succeeded | `DEBUG` | `succeeded` | `attempts` |
//! | a completed key was replayed | `INFO` | `replayed` | `scope`, `key` |
//! | a durable step was recorded | `DEBUG` | `step recorded` | `scope`, `key`, `step`, `occurrence` |
//! | a durable step was replayed | `INFO` | `step replayed` | `scope`, `key`, `step`, `occurrence` |
//! | the key is held by another worker | `INFO` | `in progress elsewhere` | `scope`, `key`, `retry_in` |
//! | the claim's lease was lost | `WARN` | `lease lost` | `scope`, `key` |
//! | the key could not be claimed (the job does not run) | `WARN` | `claim failed` | `scope`, `key`, `error` |
//! | the result could not be stored | `WARN` | `result not stored` | `scope`, `key` |
//! | a breaker changed state | `WARN` when it opens, else `INFO` | `breaker transition` | `breaker`, `from`, `to` |
//!
//! The give-up and retry events are inside the job's span, so `job` and `key` come from it. A
//! lost letter's event names them itself, since a poison job's letter is sent outside any span.
//! Dead letters written by the default [`LogDeadLetters`](crate::LogDeadLetters) sink, and the
//! runtime's own error reports (a dead letter that could not be sent, with the letter whole as
//! its record; a letter dropped at capacity), are `ERROR` events with target `jobguard`.
//!
//! Without a subscriber, or with one that filters `jobguard` out, none of this allocates. A
//! process that never set a subscriber still sees the error reports: they go to stderr.

use crate::observe::Event;
use crate::record::BreakerState;
use ::tracing::span::Entered;
use ::tracing::{Level, Span, debug, info, warn};

/// The name of the span of one job call.
pub const SPAN: &str = "job";

/// The name of the span a durable step's work runs in ([`step`](crate::step())), target
/// `jobguard`, level `INFO`, with the fields `job`, `key`, `step` and `occurrence`. A step
/// replayed from its record does not run, and has no span: its `step replayed` event says so.
pub const STEP_SPAN: &str = "step";

/// The span of one durable step's run.
pub(crate) fn step_span(job: &str, key: &str, step: &str, occurrence: u32) -> Span {
    ::tracing::span!(
        target: "jobguard",
        Level::INFO,
        STEP_SPAN,
        job,
        key,
        step,
        occurrence,
    )
}

/// The span of one job call, made the first time it is needed. When no subscriber wants it, that
/// is remembered, and the rest of the call neither enters nor records it.
#[derive(Default)]
pub(crate) struct JobSpan {
    span: Option<Span>,
}

impl JobSpan {
    pub(crate) const fn new() -> Self {
        JobSpan { span: None }
    }

    /// The span, made on first use with the job's name and key; `None` when it is disabled.
    #[inline]
    pub(crate) fn get(&mut self, job: &str, key: Option<&str>) -> Option<&Span> {
        let span = self.span.get_or_insert_with(|| {
            ::tracing::span!(
                target: "jobguard",
                Level::INFO,
                SPAN,
                job,
                key,
                attempt = ::tracing::field::Empty,
            )
        });
        (!span.is_disabled()).then_some(&*span)
    }

    /// Enters the span, unless no subscriber wants it.
    #[inline]
    pub(crate) fn enter(&mut self, job: &str, key: Option<&str>) -> Option<Entered<'_>> {
        self.get(job, key).map(Span::enter)
    }

    /// Records the attempt now starting on the span.
    #[inline]
    pub(crate) fn record_attempt(&mut self, job: &str, key: Option<&str>, attempt: u32) {
        if let Some(span) = self.get(job, key) {
            span.record("attempt", attempt);
        }
    }

    /// A handle on the span for a future to run in, unless no subscriber wants it.
    #[inline]
    pub(crate) fn handle(&mut self, job: &str, key: Option<&str>) -> Option<Span> {
        self.get(job, key).cloned()
    }
}

/// `true` when a subscriber is set for this thread or the process; without one, error reports
/// go to stderr instead of nowhere.
pub(crate) fn has_subscriber() -> bool {
    ::tracing::dispatcher::get_default(|d| !d.is::<::tracing::subscriber::NoSubscriber>())
}

/// The tracing view of one event, raised in the job's span when there is one.
#[inline]
pub(crate) fn record(event: &Event<'_>) {
    // No subscriber wants anything (or none is set): one load, and nothing else.
    if ::tracing::level_filters::LevelFilter::current()
        == ::tracing::level_filters::LevelFilter::OFF
    {
        return;
    }
    record_enabled(event);
}

fn record_enabled(event: &Event<'_>) {
    match *event {
        // Recorded on the job's span by the loop itself.
        Event::Attempt { .. } => {}
        Event::Retry {
            attempt,
            delay,
            verdict,
            error,
            ..
        } => info!(
            target: "jobguard",
            attempt,
            delay = ?delay,
            verdict = ?verdict,
            error = %error,
            "retrying",
        ),
        Event::Succeeded { attempts, .. } => debug!(target: "jobguard", attempts, "succeeded"),
        // The letter names its job and key itself: a poison job's is the idempotency guard's,
        // raised outside the retry loop's span.
        Event::DeadLetter(letter) => warn!(
            target: "jobguard",
            job = %letter.job,
            key = letter.key.as_deref(),
            reason = letter.reason.as_str(),
            attempts = letter.attempts,
            error = %letter.error,
            "gave up",
        ),
        Event::DeadLetterLost { letter, error } => warn!(
            target: "jobguard",
            job = %letter.job,
            key = letter.key.as_deref(),
            reason = letter.reason.as_str(),
            attempts = letter.attempts,
            error = %error,
            "dead letter lost",
        ),
        Event::HandedBack {
            attempts,
            delivery,
            reason,
            error,
            ..
        } => info!(
            target: "jobguard",
            attempts,
            delivery = delivery.number,
            reason = reason.as_str(),
            error = %error,
            "handed back to the runner",
        ),
        Event::Replayed { scope, key } => info!(target: "jobguard", scope, key, "replayed"),
        Event::StepRecorded {
            scope,
            key,
            step,
            occurrence,
        } => debug!(target: "jobguard", scope, key, step, occurrence, "step recorded"),
        Event::StepReplayed {
            scope,
            key,
            step,
            occurrence,
        } => info!(target: "jobguard", scope, key, step, occurrence, "step replayed"),
        Event::InProgress {
            scope,
            key,
            retry_in,
        } => info!(
            target: "jobguard",
            scope,
            key,
            retry_in = ?retry_in,
            "in progress elsewhere",
        ),
        Event::LeaseLost { scope, key } => warn!(target: "jobguard", scope, key, "lease lost"),
        Event::StoreFailed { scope, key } => {
            warn!(target: "jobguard", scope, key, "result not stored")
        }
        Event::ClaimFailed { scope, key, error } => {
            warn!(target: "jobguard", scope, key, error = %error, "claim failed")
        }
        Event::Breaker { breaker, from, to } => breaker_transition(breaker, from, to),
        Event::Shared {
            kind,
            name,
            shared: false,
            error,
        } => warn!(
            target: "jobguard",
            kind,
            name,
            error = error.map(tracing::field::display),
            "fleet out of reach: on local state",
        ),
        Event::Shared { kind, name, .. } => {
            info!(target: "jobguard", kind, name, "fleet back: shared again")
        }
        Event::ConsoleAction {
            action,
            targets,
            actor,
            outcome,
        } => info!(
            target: "jobguard",
            action,
            targets = ?targets,
            actor,
            outcome,
            "console action",
        ),
        _ => {}
    }
}

#[cold]
fn breaker_transition(breaker: &str, from: BreakerState, to: BreakerState) {
    let opened = to == BreakerState::Open;
    let (from, to) = (from.as_str(), to.as_str());
    if opened {
        warn!(target: "jobguard", breaker, from, to, "breaker transition");
    } else {
        info!(target: "jobguard", breaker, from, to, "breaker transition");
    }
}
