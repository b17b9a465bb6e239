//! Counters and a gauge through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`), recorded for every [`Event`] into whatever recorder the process installed
//! (`metrics-exporter-prometheus`, StatsD, …). Without a recorder they cost one check each.
//!
//! | metric | kind | labels | incremented when |
//! |---|---|---|---|
//! | `jobguard_attempts_total` | counter | `job` | an attempt starts |
//! | `jobguard_retries_total` | counter | `job` | a failed attempt will be retried |
//! | `jobguard_dead_lettered_total` | counter | `job`, `reason` | a job gives up (`reason`: [`GiveUp::as_str`](crate::GiveUp::as_str)) |
//! | `jobguard_handed_back_total` | counter | `job` | a job's retries ran out on a delivery that is not the runner's last: no letter, the runner delivers it again |
//! | `jobguard_replays_total` | counter | `job` (the idempotency scope) | a completed key is replayed |
//! | `jobguard_steps_replayed_total` | counter | `job` | a durable step recorded by an earlier run of its job is replayed instead of run ([`step`](crate::step())) |
//! | `jobguard_in_progress_total` | counter | `job` (the idempotency scope) | a key is found claimed by another worker (once a call, also while it waits) |
//! | `jobguard_lease_lost_total` | counter | `job` (the idempotency scope) | a claim's lease lapsed while its job ran: another worker may run it too |
//! | `jobguard_claim_failed_total` | counter | `job` (the idempotency scope) | a key could not be claimed (the store out of reach or failing, a record it cannot read): the job did not run |
//! | `jobguard_store_failed_total` | counter | `job` (the idempotency scope) | a job succeeded but its result was not stored to replay: the write failed, the result cannot be kept, or an HTTP response was larger than the layer stores |
//! | `jobguard_breaker_transitions_total` | counter | `breaker`, `to` | a breaker changes state (`to`: [`BreakerState::as_str`](crate::BreakerState::as_str)) |
//! | `jobguard_breaker_state` | gauge | `breaker` | a breaker changes state: 0 closed, 1 open, 2 half-open |
//! | `jobguard_shared` | gauge | `kind`, `name` | a [shared](crate::fleet) breaker or retry budget loses Redis (0: on local state) or finds it again (1) |
//! | `jobguard_shared_lost_total` | counter | `kind`, `name` | a shared breaker or retry budget loses Redis and falls back to local state |
//! | `jobguard_dead_letters_dropped_total` | counter | `sink` | an in-memory sink drops its oldest letter at capacity (`sink="memory"`), or a Redis stream is trimmed to its `max_len` (`sink="redis"`, by the letters trimmed) |
//! | `jobguard_dead_letters_lost_total` | counter | `job` | a sink refuses a job's dead letter (its `send` fails: Redis down, a closure's error); the letter is in the log, whole |
//! | `jobguard_store_evictions_total` | counter | `store` | a bounded store gives up completed records before their TTL, by the number given up |
//! | `jobguard_store_bytes` | gauge | `store` | the bytes [`MemoryStore`](crate::MemoryStore)s hold, summed: set by [`MemoryStore::stats`](crate::MemoryStore::stats), and once a second at most by a store that gives records up |
//!
//! The names already end in `_total`, so an exporter that appends the suffix to counters (the
//! Prometheus exporter's `with_recommended_naming(true)`) leaves them as they are.
//!
//! The health signal is the pair attempts and dead letters: attempts slightly above the job count
//! and dead letters near zero is healthy; a rising ratio of attempts to jobs is the early warning
//! that a dependency is degrading.
//!
//! ```
//! // After installing a recorder, give every metric its help text:
//! jobguard::observe::metrics::describe();
//! ```
//!
//! A `job` or `breaker` label value is interned the first time it is seen (up to
//! [`MAX_INTERNED`] distinct values per label, kept for the life of the process), so recording
//! an event for a known job allocates nothing. Values beyond that bound are still recorded, at
//! the cost of an allocation per event.

use crate::observe::Event;
use crate::record::BreakerState;
use crate::record::DeadLetter;
use ::metrics::{Key, Label, Level, Metadata};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, OnceLock};

/// `jobguard_attempts_total{job}`: attempts started.
pub const ATTEMPTS: &str = "jobguard_attempts_total";
/// `jobguard_retries_total{job}`: failed attempts that will be retried.
pub const RETRIES: &str = "jobguard_retries_total";
/// `jobguard_dead_lettered_total{job,reason}`: give-ups.
pub const DEAD_LETTERED: &str = "jobguard_dead_lettered_total";
/// `jobguard_handed_back_total{job}`: give-ups handed back to the job runner for another
/// delivery, without a dead letter.
pub const HANDED_BACK: &str = "jobguard_handed_back_total";
/// `jobguard_replays_total{job}`: idempotent calls answered from a stored result.
pub const REPLAYS: &str = "jobguard_replays_total";
/// `jobguard_steps_replayed_total{job}`: durable steps replayed instead of run.
pub const STEPS_REPLAYED: &str = "jobguard_steps_replayed_total";
/// `jobguard_in_progress_total{job}`: idempotent calls that found the key held by another worker.
pub const IN_PROGRESS: &str = "jobguard_in_progress_total";
/// `jobguard_lease_lost_total{job}`: claims whose lease lapsed while the job ran.
pub const LEASE_LOST: &str = "jobguard_lease_lost_total";
/// `jobguard_claim_failed_total{job}`: idempotent calls that failed closed because the key
/// could not be claimed (see [`Event::ClaimFailed`]).
pub const CLAIM_FAILED: &str = "jobguard_claim_failed_total";
/// `jobguard_store_failed_total{job}`: successful jobs whose result was not stored to replay.
pub const STORE_FAILED: &str = "jobguard_store_failed_total";
/// `jobguard_breaker_transitions_total{breaker,to}`: breaker state changes.
pub const BREAKER_TRANSITIONS: &str = "jobguard_breaker_transitions_total";
/// `jobguard_breaker_state{breaker}`: 0 closed, 1 open, 2 half-open.
pub const BREAKER_STATE: &str = "jobguard_breaker_state";
/// `jobguard_shared{kind,name}`: 1 while a shared breaker or retry budget reaches Redis, 0 while
/// it is on local state.
pub const SHARED: &str = "jobguard_shared";
/// `jobguard_shared_lost_total{kind,name}`: times a shared breaker or retry budget lost Redis.
pub const SHARED_LOST: &str = "jobguard_shared_lost_total";
/// `jobguard_dead_letters_dropped_total{sink}`: letters a bounded sink dropped at capacity.
pub const DEAD_LETTERS_DROPPED: &str = "jobguard_dead_letters_dropped_total";
/// `jobguard_dead_letters_lost_total{job}`: dead letters a sink refused (see
/// [`Event::DeadLetterLost`]).
pub const DEAD_LETTERS_LOST: &str = "jobguard_dead_letters_lost_total";

/// `jobguard_store_evictions_total{store}`: completed records a bounded store gave up before
/// their TTL.
pub const STORE_EVICTIONS: &str = "jobguard_store_evictions_total";
/// `jobguard_store_bytes{store}`: the memory an in-process store holds, in bytes.
pub const STORE_BYTES: &str = "jobguard_store_bytes";

/// The most distinct values of one label (`job`, `breaker`) kept interned.
pub const MAX_INTERNED: usize = 1024;

/// Registers the help text of every jobguard metric with the current recorder. Call it once
/// after installing the recorder; metrics work without it, minus their `# HELP` lines.
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge};
    describe_counter!(ATTEMPTS, "Job attempts started.");
    describe_counter!(RETRIES, "Failed job attempts that will be retried.");
    describe_counter!(
        DEAD_LETTERED,
        "Jobs that gave up and were dead-lettered, by reason."
    );
    describe_counter!(
        HANDED_BACK,
        "Jobs whose retries ran out on a delivery that is not the runner's last, handed back for another."
    );
    describe_counter!(REPLAYS, "Idempotent calls answered from a stored result.");
    describe_counter!(
        STEPS_REPLAYED,
        "Durable steps answered from a value an earlier run of their job recorded."
    );
    describe_counter!(
        IN_PROGRESS,
        "Idempotent calls that found their key held by another worker."
    );
    describe_counter!(
        LEASE_LOST,
        "Idempotency claims whose lease lapsed while the job ran: another worker may run it too."
    );
    describe_counter!(
        CLAIM_FAILED,
        "Idempotent calls (or HTTP requests) that failed closed, not run, because their key \
         could not be claimed."
    );
    describe_counter!(
        STORE_FAILED,
        "Jobs (or HTTP requests) that succeeded but whose result was not stored to replay."
    );
    describe_counter!(
        BREAKER_TRANSITIONS,
        "Circuit breaker state changes, by new state."
    );
    describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker state: 0 closed, 1 open, 2 half-open."
    );
    describe_gauge!(
        SHARED,
        "Whether a shared breaker or retry budget reaches Redis (1) or is on local state (0)."
    );
    describe_counter!(
        SHARED_LOST,
        "Times a shared breaker or retry budget lost Redis and fell back to local state."
    );
    describe_counter!(
        DEAD_LETTERS_DROPPED,
        "Dead letters dropped by a bounded sink at capacity."
    );
    describe_counter!(
        DEAD_LETTERS_LOST,
        "Dead letters their sink refused (written to the log whole instead), by job."
    );
    describe_counter!(
        STORE_EVICTIONS,
        "Completed records a bounded store gave up before their TTL to make room."
    );
    describe_gauge!(STORE_BYTES, "Bytes held by in-process idempotency stores.");
}

/// The gauge value of a breaker state.
pub const fn state_value(state: BreakerState) -> f64 {
    match state {
        BreakerState::Closed => 0.0,
        BreakerState::Open => 1.0,
        BreakerState::HalfOpen => 2.0,
    }
}

static METADATA: Metadata<'static> = Metadata::new("jobguard", Level::INFO, Some(module_path!()));

/// The keys of one job's per-attempt counters, made once for the life of the process: a
/// `#[retry]` function keeps them in a `static`, so counting its attempts hashes nothing.
pub(crate) struct JobKeys {
    labels: [Label; 1],
    keys: OnceLock<[Key; 2]>,
}

impl JobKeys {
    pub(crate) const fn new(job: &'static str) -> Self {
        JobKeys {
            labels: [Label::from_static_parts("job", job)],
            keys: OnceLock::new(),
        }
    }

    /// `[attempts, retries]`.
    fn keys(&'static self) -> &'static [Key; 2] {
        self.keys.get_or_init(|| {
            [
                Key::from_static_labels(ATTEMPTS, &self.labels),
                Key::from_static_labels(RETRIES, &self.labels),
            ]
        })
    }
}

/// The metrics view of one event of a job whose keys are made.
#[inline]
pub(crate) fn record_keyed(event: &Event<'_>, job: &'static JobKeys) {
    match *event {
        Event::Attempt { .. } => increment_key(&job.keys()[0]),
        Event::Retry { .. } => increment_key(&job.keys()[1]),
        _ => record(event),
    }
}

#[inline]
fn increment_key(key: &Key) {
    ::metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

/// The metrics view of one event.
pub(crate) fn record(event: &Event<'_>) {
    match *event {
        Event::Attempt { job, .. } => increment(ATTEMPTS, Dim::Job, job),
        Event::Retry { job, .. } => increment(RETRIES, Dim::Job, job),
        Event::DeadLetter(letter) => dead_lettered(letter),
        Event::DeadLetterLost { letter, .. } => increment(DEAD_LETTERS_LOST, Dim::Job, &letter.job),
        Event::HandedBack { job, .. } => increment(HANDED_BACK, Dim::Job, job),
        Event::Replayed { scope, .. } => increment(REPLAYS, Dim::Job, scope),
        Event::StepReplayed { scope, .. } => increment(STEPS_REPLAYED, Dim::Job, scope),
        Event::InProgress { scope, .. } => increment(IN_PROGRESS, Dim::Job, scope),
        Event::LeaseLost { scope, .. } => increment(LEASE_LOST, Dim::Job, scope),
        Event::StoreFailed { scope, .. } => increment(STORE_FAILED, Dim::Job, scope),
        Event::ClaimFailed { scope, .. } => increment(CLAIM_FAILED, Dim::Job, scope),
        Event::Breaker { breaker, to, .. } => breaker_transition(breaker, to),
        Event::Evicted { store, records, .. } => store_evicted(store, records),
        Event::Shared {
            kind, name, shared, ..
        } => shared_changed(kind, name, shared),
        _ => {}
    }
}

/// A shared breaker or budget lost Redis, or found it again: rare, so its keys are made here.
fn shared_changed(kind: &str, name: &str, shared: bool) {
    let labels = || {
        vec![
            Label::new("kind", kind.to_owned()),
            Label::new("name", name.to_owned()),
        ]
    };
    let gauge = Key::from_parts(SHARED, labels());
    let lost = Key::from_parts(SHARED_LOST, labels());
    ::metrics::with_recorder(|r| {
        r.register_gauge(&gauge, &METADATA)
            .set(if shared { 1.0 } else { 0.0 });
        if !shared {
            r.register_counter(&lost, &METADATA).increment(1);
        }
    });
}

/// Counts `count` letters a bounded sink dropped (a Redis stream trimmed to its bound).
#[cold]
pub(crate) fn dead_letters_dropped(sink: &'static str, count: u64) {
    let key = Key::from_parts(DEAD_LETTERS_DROPPED, vec![Label::new("sink", sink)]);
    ::metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(count));
}

/// The `store` label of [`MemoryStore`](crate::MemoryStore)'s metrics.
static MEMORY_STORE: [Label; 1] = [Label::from_static_parts("store", "memory")];

/// `jobguard_store_evictions_total{store="memory"}`, hashed once (at compile time): a store at
/// its bound reports evictions on most claims.
static MEMORY_EVICTIONS: Key = Key::from_static_parts(STORE_EVICTIONS, &MEMORY_STORE);

fn store_evicted(store: &str, records: u64) {
    let other;
    let key = match store {
        "memory" => &MEMORY_EVICTIONS,
        _ => {
            other = Key::from_parts(STORE_EVICTIONS, vec![Label::new("store", store.to_owned())]);
            &other
        }
    };
    ::metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(records));
}

/// Moves a store's bytes gauge by `delta`.
pub(crate) fn store_bytes_changed(store: &'static str, delta: f64) {
    let key = match store {
        "memory" => Key::from_static_labels(STORE_BYTES, &MEMORY_STORE),
        other => Key::from_parts(STORE_BYTES, vec![Label::new("store", other)]),
    };
    ::metrics::with_recorder(|r| r.register_gauge(&key, &METADATA).increment(delta));
}

#[cold]
fn dead_lettered(letter: &DeadLetter) {
    let labels = vec![
        Label::new("job", letter.job.clone()),
        Label::new("reason", letter.reason.as_str()),
    ];
    let key = Key::from_parts(DEAD_LETTERED, labels);
    ::metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
}

#[cold]
fn breaker_transition(breaker: &str, to: BreakerState) {
    let transitions = key(BREAKER_TRANSITIONS, Dim::BreakerTo(to), breaker);
    let state = key(BREAKER_STATE, Dim::Breaker, breaker);
    ::metrics::with_recorder(|r| {
        r.register_counter(&transitions, &METADATA).increment(1);
        r.register_gauge(&state, &METADATA).set(state_value(to));
    });
}

#[inline]
fn increment(name: &'static str, dim: Dim, value: &str) {
    let key = key(name, dim, value);
    ::metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
}

/// A key labelled by `dim` with `value`, from the interned labels when there is room for them.
fn key(name: &'static str, dim: Dim, value: &str) -> Key {
    match interned(dim, value) {
        Some(labels) => Key::from_static_labels(name, labels),
        None => Key::from_parts(name, dim.labels(value.to_owned())),
    }
}

/// The labels a metric is keyed by, all but one of them fixed: `value` is the other's.
#[derive(Clone, Copy)]
enum Dim {
    /// `job = value`.
    Job,
    /// `breaker = value`.
    Breaker,
    /// `breaker = value, to = state`.
    BreakerTo(BreakerState),
}

const DIMS: usize = 5;

impl Dim {
    const fn index(self) -> usize {
        match self {
            Dim::Job => 0,
            Dim::Breaker => 1,
            Dim::BreakerTo(BreakerState::Closed) => 2,
            Dim::BreakerTo(BreakerState::Open) => 3,
            Dim::BreakerTo(BreakerState::HalfOpen) => 4,
        }
    }

    fn labels<V: Into<::metrics::SharedString>>(self, value: V) -> Vec<Label> {
        match self {
            Dim::Job => vec![Label::new("job", value)],
            Dim::Breaker => vec![Label::new("breaker", value)],
            Dim::BreakerTo(to) => vec![Label::new("breaker", value), Label::new("to", to.as_str())],
        }
    }
}

type Interned = [HashMap<&'static str, &'static [Label]>; DIMS];

/// Every interned label, shared by the threads; locked only the first time a thread sees a value.
static GLOBAL: LazyLock<Mutex<Interned>> = LazyLock::new(Mutex::default);

thread_local! {
    /// This thread's view of [`GLOBAL`]: read without a lock.
    static LOCAL: RefCell<Interned> = RefCell::default();
}

/// The labels of `dim` with `value`, leaked once per distinct value for the life of the process,
/// or `None` once [`MAX_INTERNED`] values of `dim` are interned.
fn interned(dim: Dim, value: &str) -> Option<&'static [Label]> {
    LOCAL
        .try_with(|local| {
            if let Some(&labels) = local.borrow()[dim.index()].get(value) {
                return Some(labels);
            }
            let (name, labels) = intern_globally(dim, value)?;
            local.borrow_mut()[dim.index()].insert(name, labels);
            Some(labels)
        })
        .ok()
        .flatten()
}

#[cold]
fn intern_globally(dim: Dim, value: &str) -> Option<(&'static str, &'static [Label])> {
    let mut global = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    let map = &mut global[dim.index()];
    if let Some((&name, &labels)) = map.get_key_value(value) {
        return Some((name, labels));
    }
    if map.len() >= MAX_INTERNED {
        return None;
    }
    let name: &'static str = Box::leak(value.to_owned().into_boxed_str());
    let labels: &'static [Label] = dim.labels(name).leak();
    map.insert(name, labels);
    Some((name, labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interned_labels_are_shared_and_bounded_per_label() {
        let a = interned(Dim::Job, "tests::interned").unwrap();
        let b = interned(Dim::Job, "tests::interned").unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(a[0].key(), "job");
        assert_eq!(a[0].value(), "tests::interned");
        let other = std::thread::spawn(|| interned(Dim::Job, "tests::interned").unwrap())
            .join()
            .unwrap();
        assert!(std::ptr::eq(a, other), "one leak per value across threads");
        let to = interned(Dim::BreakerTo(BreakerState::HalfOpen), "tests::interned").unwrap();
        let to: Vec<_> = to.iter().map(|l| (l.key(), l.value())).collect();
        assert_eq!(to, [("breaker", "tests::interned"), ("to", "half_open")]);
    }

    #[test]
    fn keys_past_the_bound_still_carry_their_label() {
        for i in 0..=MAX_INTERNED {
            let _ = interned(Dim::Breaker, &format!("bound-{i}"));
        }
        let k = key(ATTEMPTS, Dim::Breaker, "past-the-bound");
        let labels: Vec<_> = k.labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(labels, [("breaker", "past-the-bound")]);
    }

    #[test]
    fn states_map_to_gauge_values() {
        assert_eq!(state_value(BreakerState::Closed), 0.0);
        assert_eq!(state_value(BreakerState::Open), 1.0);
        assert_eq!(state_value(BreakerState::HalfOpen), 2.0);
    }
}
