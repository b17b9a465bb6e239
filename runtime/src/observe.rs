//! Observer hooks: every attempt, retry delay, give-up, replay and breaker transition.

use crate::attempt::Delivery;
use crate::classify::Verdict;
use crate::record::{BreakerState, DeadLetter, GiveUp};
use std::fmt;
use std::time::Duration;

/// Whether some `tracing` subscriber, global or scoped to any thread, enables some level:
/// `LevelFilter::current()` is the most verbose level any live subscriber enables, and `OFF`
/// when there is none. `false` without the feature.
pub(crate) fn tracing_listens() -> bool {
    #[cfg(feature = "tracing")]
    {
        ::tracing::level_filters::LevelFilter::current()
            != ::tracing::level_filters::LevelFilter::OFF
    }
    #[cfg(not(feature = "tracing"))]
    {
        false
    }
}

/// How an event raised below the runtime (a store giving records up) reaches the observer of
/// the runtime in scope: `runtime` hands this module the way when it notes an observer, so that
/// `observe` and the stores need not import `runtime`.
static TO_RUNTIME: std::sync::OnceLock<fn(&Event<'_>)> = std::sync::OnceLock::new();

/// Notes that a runtime with an observer exists, and how to reach the runtime in scope with an
/// event. Called before that runtime can run a job.
pub(crate) fn note_observer(to_runtime: fn(&Event<'_>)) {
    let _ = TO_RUNTIME.set(to_runtime);
}

/// Raises an event that no job call owns (a store's evictions): through the runtime in scope
/// when a runtime with an observer exists, else to the `metrics` and `tracing` views alone.
pub(crate) fn emit_unowned(event: &Event<'_>) {
    match TO_RUNTIME.get() {
        Some(to_runtime) => to_runtime(event),
        None => record_job(event, None),
    }
}

/// A job's name, with what observing it needs made once. `#[retry]` keeps one in a `static`
/// per function, so that recording its events looks nothing up by name.
#[doc(hidden)]
pub struct Job {
    name: &'static str,
    #[cfg(feature = "metrics")]
    metrics: self::metrics::JobKeys,
}

impl Job {
    /// The job named `name`.
    pub const fn new(name: &'static str) -> Self {
        Job {
            name,
            #[cfg(feature = "metrics")]
            metrics: self::metrics::JobKeys::new(name),
        }
    }

    /// The job's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

/// Something that happened to a job. Borrowed, so observing costs no allocation.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum Event<'a> {
    /// An attempt is starting.
    Attempt {
        /// The job's name.
        job: &'a str,
        /// The idempotency key, when there is one.
        key: Option<&'a str>,
        /// The attempt number, from 1.
        attempt: u32,
    },
    /// An attempt failed and the loop will wait `delay` before the next one.
    Retry {
        /// The job's name.
        job: &'a str,
        /// The idempotency key, when there is one.
        key: Option<&'a str>,
        /// The attempt that failed.
        attempt: u32,
        /// The wait before the next attempt, jitter applied.
        delay: Duration,
        /// What the failure said.
        verdict: Verdict,
        /// The failure.
        error: &'a dyn fmt::Display,
    },
    /// The job succeeded after `attempts` attempts.
    Succeeded {
        /// The job's name.
        job: &'a str,
        /// The idempotency key, when there is one.
        key: Option<&'a str>,
        /// Attempts made.
        attempts: u32,
    },
    /// The job gave up; this letter goes to the sink. Not raised when the job gives up again
    /// while its own letter is redriven (the redriven letter stays as its one letter).
    DeadLetter(&'a DeadLetter),
    /// The sink refused the job's dead letter (its `send` failed: Redis down, a closure's
    /// error), raised once per letter, after its [`Event::DeadLetter`] (or for a poison job's
    /// letter, after the guard's). The letter is not kept by the sink: it is in the log whole,
    /// as its record, at error level (see [Lost letters](crate::dead_letter#lost-letters)). Not
    /// raised for a letter a bounded sink drops at capacity (that is counted by the sink).
    DeadLetterLost {
        /// The letter the sink did not take.
        letter: &'a DeadLetter,
        /// The sink's error.
        error: &'a dyn fmt::Display,
    },
    /// The retry loop gave up on a delivery that is not the runner's last: no dead letter is
    /// written, and the error goes back to the runner, which delivers the job again
    /// ([`Delivery`]). The last delivery writes the job's one letter.
    HandedBack {
        /// The job's name.
        job: &'a str,
        /// The idempotency key, when there is one.
        key: Option<&'a str>,
        /// Attempts made in this delivery.
        attempts: u32,
        /// The runner's delivery that ends here.
        delivery: Delivery,
        /// Why the loop stopped: [`GiveUp::Exhausted`], [`GiveUp::Budget`] or
        /// [`GiveUp::CircuitOpen`].
        reason: GiveUp,
        /// The last failure.
        error: &'a dyn fmt::Display,
    },
    /// This call claimed its idempotency key and will run the job.
    Claimed {
        /// The key's namespace.
        scope: &'a str,
        /// The idempotency key.
        key: &'a str,
    },
    /// The key was completed before: the stored result is returned and the job does not run.
    Replayed {
        /// The key's namespace.
        scope: &'a str,
        /// The idempotency key.
        key: &'a str,
    },
    /// A durable step ran and its `Ok` value was recorded under the job's key
    /// ([`step`](crate::step())): later runs of the job replay it.
    StepRecorded {
        /// The job's name.
        scope: &'a str,
        /// The job's idempotency key.
        key: &'a str,
        /// The step's name.
        step: &'a str,
        /// Which call of that name within the run, from 1.
        occurrence: u32,
    },
    /// A durable step was recorded by an earlier run of the job: its value is returned and the
    /// step does not run.
    StepReplayed {
        /// The job's name.
        scope: &'a str,
        /// The job's idempotency key.
        key: &'a str,
        /// The step's name.
        step: &'a str,
        /// Which call of that name within the run, from 1.
        occurrence: u32,
    },
    /// Another worker holds a live claim on the key. Raised once a call: a call that waits
    /// (`in_progress = wait(..)`) raises it when it first finds the key held, not at each look.
    InProgress {
        /// The key's namespace.
        scope: &'a str,
        /// The idempotency key.
        key: &'a str,
        /// Time left on the other worker's lease.
        retry_in: Duration,
    },
    /// The job failed (or was cancelled): its claim was released so a redelivery can run it. In
    /// the HTTP layer: the handler panicked, or answered what is not stored (`5xx`, `408`, `429`,
    /// a response over the storage limit); a client hanging up releases nothing, since the
    /// handler runs on and its response is stored.
    Released {
        /// The key's namespace.
        scope: &'a str,
        /// The idempotency key.
        key: &'a str,
    },
    /// The claim's lease lapsed while this worker held it: another worker may run the job too.
    LeaseLost {
        /// The key's namespace.
        scope: &'a str,
        /// The idempotency key.
        key: &'a str,
    },
    /// The key could not be claimed: the store could not be reached or answered with an error,
    /// or its answer could not be read. The job does not run (the call fails closed with
    /// `error`, [`Error::Store`](crate::Error::Store) or [`Error::Corrupt`](crate::Error::Corrupt));
    /// a redelivery tries again. Raised once a call, by the guard's [`Store`](crate::Store) form
    /// and by the HTTP layer; not by `PgStore`'s transactional forms, whose caller holds the
    /// error, nor for a completed record whose result does not read back (that replay fails
    /// with `Error::Corrupt` or `Error::Unreplayable`).
    ClaimFailed {
        /// The key's namespace.
        scope: &'a str,
        /// The idempotency key.
        key: &'a str,
        /// What the store said.
        error: &'a crate::Error,
    },
    /// The job succeeded but its result was not stored to replay: the write failed, the result
    /// cannot be kept to replay (the key is recorded as [`Error::Unreplayable`](crate::Error::Unreplayable)),
    /// or, in the HTTP layer, the response was larger than it stores.
    StoreFailed {
        /// The key's namespace.
        scope: &'a str,
        /// The idempotency key.
        key: &'a str,
    },
    /// A bounded store gave up completed records before their TTL to make room (the oldest
    /// first): a redelivery of those jobs would run them again. Raised on the task whose store
    /// operation made the room.
    Evicted {
        /// The store: `"memory"` for [`MemoryStore`](crate::MemoryStore).
        store: &'a str,
        /// Records given up by this operation.
        records: u64,
        /// How long ago the youngest of them completed.
        youngest: Duration,
        /// How long ago the oldest of them completed.
        oldest: Duration,
    },
    /// A circuit breaker changed state, raised on the task whose call caused it.
    Breaker {
        /// The breaker's [`name`](crate::CircuitBreaker::name).
        breaker: &'a str,
        /// The state it left.
        from: BreakerState,
        /// The state it entered.
        to: BreakerState,
    },
    /// A breaker or a retry budget [shared](crate::fleet) through Redis lost the fleet or found
    /// it again. `shared: false`: Redis could not be reached (`error` says why), and the process
    /// goes on with its own state (the breaker's count and transitions, the budget's deposits)
    /// until Redis answers again; `shared: true`: it rejoined the fleet (raised after a loss,
    /// not when sharing starts). Raised once per change, on the task that saw it.
    Shared {
        /// `breaker` or `retry_budget`.
        kind: &'a str,
        /// The name it is shared under.
        name: &'a str,
        /// Whether it is shared again (`true`) or on its own state (`false`).
        shared: bool,
        /// Why it lost the fleet, when it did.
        error: Option<&'a dyn fmt::Display>,
    },
    /// An operator acted through the console (`jobguard::console`, feature `console`): the
    /// audit trail of who did what. Raised once per action, after it was carried out (a bulk
    /// action over many letters once per batch of them, with the batch's ids).
    ConsoleAction {
        /// What was done: `redrive`, `delete`, `forgive`, `forget` or `reset`.
        action: &'a str,
        /// What it was done to: dead letters' ids, a key as `scope/key`, or a breaker's name.
        targets: &'a [String],
        /// Who did it: the request's `x-jobguard-actor` extension or header, when it has one.
        actor: Option<&'a str>,
        /// How it went: `ok`, or what failed.
        outcome: &'a str,
    },
}

/// Every field as it is, the error of a [`Event::Retry`] (and the like) in its `Display` form.
impl fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Event::Attempt { job, key, attempt } => f
                .debug_struct("Attempt")
                .field("job", &job)
                .field("key", &key)
                .field("attempt", &attempt)
                .finish(),
            Event::Retry {
                job,
                key,
                attempt,
                delay,
                verdict,
                error,
            } => f
                .debug_struct("Retry")
                .field("job", &job)
                .field("key", &key)
                .field("attempt", &attempt)
                .field("delay", &delay)
                .field("verdict", &verdict)
                .field("error", &format_args!("{error}"))
                .finish(),
            Event::Succeeded { job, key, attempts } => f
                .debug_struct("Succeeded")
                .field("job", &job)
                .field("key", &key)
                .field("attempts", &attempts)
                .finish(),
            Event::DeadLetter(letter) => f.debug_tuple("DeadLetter").field(letter).finish(),
            Event::DeadLetterLost { letter, error } => f
                .debug_struct("DeadLetterLost")
                .field("letter", letter)
                .field("error", &format_args!("{error}"))
                .finish(),
            Event::HandedBack {
                job,
                key,
                attempts,
                delivery,
                reason,
                error,
            } => f
                .debug_struct("HandedBack")
                .field("job", &job)
                .field("key", &key)
                .field("attempts", &attempts)
                .field("delivery", &delivery)
                .field("reason", &reason)
                .field("error", &format_args!("{error}"))
                .finish(),
            Event::Claimed { scope, key } => scoped(f, "Claimed", scope, key).finish(),
            Event::Replayed { scope, key } => scoped(f, "Replayed", scope, key).finish(),
            Event::InProgress {
                scope,
                key,
                retry_in,
            } => scoped(f, "InProgress", scope, key)
                .field("retry_in", &retry_in)
                .finish(),
            Event::Released { scope, key } => scoped(f, "Released", scope, key).finish(),
            Event::StepRecorded {
                scope,
                key,
                step,
                occurrence,
            } => scoped(f, "StepRecorded", scope, key)
                .field("step", &step)
                .field("occurrence", &occurrence)
                .finish(),
            Event::StepReplayed {
                scope,
                key,
                step,
                occurrence,
            } => scoped(f, "StepReplayed", scope, key)
                .field("step", &step)
                .field("occurrence", &occurrence)
                .finish(),
            Event::LeaseLost { scope, key } => scoped(f, "LeaseLost", scope, key).finish(),
            Event::StoreFailed { scope, key } => scoped(f, "StoreFailed", scope, key).finish(),
            Event::ClaimFailed { scope, key, error } => scoped(f, "ClaimFailed", scope, key)
                .field("error", &format_args!("{error}"))
                .finish(),
            Event::Evicted {
                store,
                records,
                youngest,
                oldest,
            } => f
                .debug_struct("Evicted")
                .field("store", &store)
                .field("records", &records)
                .field("youngest", &youngest)
                .field("oldest", &oldest)
                .finish(),
            Event::Breaker { breaker, from, to } => f
                .debug_struct("Breaker")
                .field("breaker", &breaker)
                .field("from", &from)
                .field("to", &to)
                .finish(),
            Event::Shared {
                kind,
                name,
                shared,
                error,
            } => f
                .debug_struct("Shared")
                .field("kind", &kind)
                .field("name", &name)
                .field("shared", &shared)
                .field("error", &error.map(|e| e.to_string()))
                .finish(),
            Event::ConsoleAction {
                action,
                targets,
                actor,
                outcome,
            } => f
                .debug_struct("ConsoleAction")
                .field("action", &action)
                .field("targets", &targets)
                .field("actor", &actor)
                .field("outcome", &outcome)
                .finish(),
        }
    }
}

/// The start of an idempotency event's `Debug`: its name, scope and key.
fn scoped<'f, 'b>(
    f: &'f mut fmt::Formatter<'b>,
    name: &str,
    scope: &str,
    key: &str,
) -> fmt::DebugStruct<'f, 'b> {
    let mut s = f.debug_struct(name);
    s.field("scope", &scope).field("key", &key);
    s
}

/// A hook the runtime calls for every [`Event`]. Closures `Fn(&Event)` are observers.
///
/// ```
/// use jobguard::{Event, Runtime};
///
/// let runtime = Runtime::builder()
///     .observer(|event: &Event<'_>| {
///         if let Event::Retry { job, delay, .. } = event {
///             println!("{job}: retrying in {delay:?}");
///         }
///     })
///     .build();
/// # drop(runtime);
/// ```
pub trait Observer: Send + Sync {
    /// Called synchronously, on the job's task: keep it quick.
    fn on_event(&self, event: &Event<'_>);
}

impl<F: Fn(&Event<'_>) + Send + Sync> Observer for F {
    fn on_event(&self, event: &Event<'_>) {
        self(event)
    }
}

/// The observer that ignores everything (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {
    fn on_event(&self, _: &Event<'_>) {}
}

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "tracing")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub mod tracing;

/// The built-in integrations' view of every event (`metrics` counters, `tracing` events); a
/// no-op without those features.
/// `job`, when given, is the event's job as `#[retry]` declares it, so its keys are made once.
pub(crate) fn record_job(event: &Event<'_>, job: Option<&'static Job>) {
    #[cfg(feature = "metrics")]
    match job {
        Some(job) => self::metrics::record_keyed(event, &job.metrics),
        None => self::metrics::record(event),
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (event, job);
    #[cfg(feature = "tracing")]
    self::tracing::record(event);
}

/// Writes an error-level line to the log: a `tracing` event (target `jobguard`) when that
/// feature is on and a subscriber is set, else a line on stderr, so that no report is lost to
/// a process that never set one up.
#[cold]
pub(crate) fn log_error(args: fmt::Arguments<'_>) {
    #[cfg(feature = "tracing")]
    if self::tracing::has_subscriber() {
        let message = args.to_string();
        ::tracing::error!(target: "jobguard", "{}", untargeted(&message));
        return;
    }
    eprintln!("{args}");
}

/// A log line without the `jobguard: ` it starts with on stderr: under `tracing` the target
/// says so already.
#[cfg(feature = "tracing")]
fn untargeted(message: &str) -> &str {
    message.strip_prefix("jobguard: ").unwrap_or(message)
}

/// Writes a warning to the log, as [`log_error`] does an error.
#[cold]
pub(crate) fn log_warn(args: fmt::Arguments<'_>) {
    #[cfg(feature = "tracing")]
    if self::tracing::has_subscriber() {
        let message = args.to_string();
        ::tracing::warn!(target: "jobguard", "{}", untargeted(&message));
        return;
    }
    eprintln!("{args}");
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn events_debug_with_the_error_in_words() {
        let error = std::io::Error::from(std::io::ErrorKind::TimedOut);
        let event = Event::Retry {
            job: "payments::charge",
            key: Some("idem-1"),
            attempt: 2,
            delay: Duration::from_millis(500),
            verdict: Verdict::Retry,
            error: &error,
        };
        assert_eq!(
            format!("{event:?}"),
            "Retry { job: \"payments::charge\", key: Some(\"idem-1\"), attempt: 2, \
             delay: 500ms, verdict: Retry, error: timed out }"
        );
        let claimed = Event::Claimed {
            scope: "payments.charge",
            key: "idem-1",
        };
        assert_eq!(
            format!("{claimed:?}"),
            "Claimed { scope: \"payments.charge\", key: \"idem-1\" }"
        );
    }
}
