//! The records of what happened to a job, shared by the engine, the breaker, the sinks and the
//! observers: why a job gave up, its dead letter, a breaker's state. Plain data; this module
//! imports nothing of the crate but [`Error`](crate::Error).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::SystemTime;

/// Why a job gave up and was dead-lettered.
///
/// New reasons may come in later versions (`Crashed` came with crash counting), so a `match`
/// outside this crate needs a `_` arm; [`as_str`](GiveUp::as_str) names every reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GiveUp {
    /// Every attempt failed transiently.
    Exhausted,
    /// A failure said retrying cannot help.
    Permanent,
    /// The total budget ran out.
    Budget,
    /// The circuit breaker in front of the dependency was open.
    CircuitOpen,
    /// The job's [`RetryBudget`](crate::RetryBudget) was empty: the retry the policy asked for
    /// would have taken retries past their share of the calls, so the call ended with its last
    /// error instead.
    RetryBudget,
    /// The job's worker died while running it as many times as its crash limit allows
    /// (`#[idempotent(crashes = N)]`, 3 by default): each claim lapsed without a result or a
    /// release. The job is refused from now on ([`Error::Poisoned`](crate::Error::Poisoned)).
    /// The letter's `attempts` counts those crashed runs, and its two times are when the crash
    /// limit was found (the crashed runs left no record of when they started).
    Crashed,
}

impl GiveUp {
    /// The reason as a short lowercase label (`exhausted`, `permanent`, `budget`, `circuit_open`,
    /// `retry_budget`, `crashed`), as used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            GiveUp::Exhausted => "exhausted",
            GiveUp::Permanent => "permanent",
            GiveUp::Budget => "budget",
            GiveUp::CircuitOpen => "circuit_open",
            GiveUp::RetryBudget => "retry_budget",
            GiveUp::Crashed => "crashed",
        }
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The record of one give-up. Every give-up sends exactly one to the job's sink; the error is
/// still returned to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The job's name: its module path and function name, or the name given to
    /// [`Policy::run`](crate::Policy::run).
    pub job: String,
    /// The idempotency key, when the job has one.
    pub key: Option<String>,
    /// Why it gave up.
    pub reason: GiveUp,
    /// Attempts made: for a job that holds a claim around its retries (`#[idempotent]` outside
    /// `#[retry]`), the count in its key's record over every claim and delivery; else, under a
    /// job runner's [`Delivery`](crate::Delivery), `(number - 1) × the policy's attempts + this
    /// delivery's` (see `jobguard::apalis`).
    pub attempts: u32,
    /// The last error's `Display`.
    pub error: String,
    /// When the first attempt started: under a job runner, the first attempt of the last
    /// delivery.
    pub first_attempt: SystemTime,
    /// When the last attempt started.
    pub last_attempt: SystemTime,
    /// The `Display` of the last failures, oldest first, at most [`DeadLetter::HISTORY`]; the
    /// last one is [`error`](Self::error). Empty in records written before this field existed.
    #[serde(default)]
    pub history: Vec<String>,
    /// The job's arguments as JSON, when the job declared them (`#[retry(payload = (a, b))]`),
    /// so that a redrive can run it again. Serialized only when the job gives up; decode it with
    /// [`payload_as`](Self::payload_as).
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
}

impl DeadLetter {
    /// How many errors [`history`](Self::history) keeps: the last ones, the oldest dropped.
    pub const HISTORY: usize = 5;

    /// A record with the given fields, an empty history and no payload.
    pub fn new(
        job: impl Into<String>,
        key: Option<String>,
        reason: GiveUp,
        attempts: u32,
        error: impl Into<String>,
        first_attempt: SystemTime,
        last_attempt: SystemTime,
    ) -> Self {
        DeadLetter {
            job: job.into(),
            key,
            reason,
            attempts,
            error: error.into(),
            first_attempt,
            last_attempt,
            history: Vec::new(),
            payload: None,
        }
    }

    /// The record with this error history (oldest first), cut to its last
    /// [`HISTORY`](Self::HISTORY) entries.
    pub fn with_history(mut self, mut history: Vec<String>) -> Self {
        if history.len() > Self::HISTORY {
            history.drain(..history.len() - Self::HISTORY);
        }
        self.history = history;
        self
    }

    /// The record with this payload: the job's arguments as JSON.
    pub fn with_payload(mut self, payload: Option<serde_json::Value>) -> Self {
        self.payload = payload;
        self
    }

    /// Decodes the payload into the job's argument type, e.g. `(String, u64)` for
    /// `payload = (order_id, amount)`. `None` when the letter has no payload.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Option<Result<T, crate::Error>> {
        let value = self.payload.as_ref()?;
        Some(
            T::deserialize(value)
                .map_err(|e| crate::Error::Corrupt(format!("dead letter payload: {e}"))),
        )
    }
}

/// The state of a [`CircuitBreaker`](crate::CircuitBreaker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go through; failures are counted.
    Closed,
    /// Calls fail fast with [`Error::CircuitOpen`](crate::Error::CircuitOpen) until the cooldown ends.
    Open,
    /// The cooldown ended: a bounded number of probes go through; the rest fail fast.
    HalfOpen,
}

impl BreakerState {
    /// The state as a short lowercase label (`closed`, `open`, `half_open`), as used in metrics
    /// and logs.
    ///
    /// ```
    /// assert_eq!(jobguard::BreakerState::HalfOpen.as_str(), "half_open");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
