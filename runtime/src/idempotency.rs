//! Idempotency: claim a key once, run the work inside the claim, store the result, replay it.
//!
//! [`Idempotent`] is what `#[idempotent]` expands to, and can be used without the macro:
//!
//! ```
//! use jobguard::idempotency::Idempotent;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let charge = |order: &'static str| {
//!     Idempotent::new("payments.charge", order).run(async move {
//!         // the side effect runs at most once per key
//!         Ok::<_, jobguard::Error>(format!("receipt for {order}"))
//!     })
//! };
//! assert_eq!(charge("order-A").await.unwrap(), "receipt for order-A");
//! assert_eq!(charge("order-A").await.unwrap(), "receipt for order-A"); // replayed
//! # }
//! ```
//!
//! # The window
//!
//! The result is stored after the work succeeded. If the store cannot take the write (retried a
//! few times), the call still returns the work's `Ok` — the side effect did happen, and returning
//! an error would make the queue deliver it again — and reports the failure at error level and as
//! [`Event::StoreFailed`]. Until the claim's lease lapses, a redelivery sees
//! `InProgress`; after it, a redelivery runs the work again. Keep that window short with a short
//! `lease`, and make the side effect itself idempotent where the dependency allows it (pass the
//! key on to a gateway that accepts idempotency keys), or pass [`fence()`](crate::fence) to a
//! downstream that refuses writes from an older claim. The claim left to lapse this way is
//! counted as a crash by the next claim, as a dead worker's would be: a store that keeps failing
//! to take results can bring a job to its crash limit.
//!
//! # Crashes and poison jobs
//!
//! A claim whose lease lapsed without a stored result or a release was held by a worker that
//! died (or stalled past its lease). The next claim takes it over, and the store counts it. The
//! claim that finds [`crashes`](Idempotent::crashes) of them counted (3 by default) is refused:
//! the call fails with [`Error::Poisoned`] (permanent, so `#[retry]` does not retry it), the job
//! is dead-lettered once with [`GiveUp::Crashed`] through the job's dead-letter sink (its
//! `#[retry(dead_letter = SINK)]`, else the runtime's), and every later delivery is refused with [`Error::Poisoned`] and no letter,
//! until the key's TTL ends. A job that kills its worker (an abort, an out-of-memory kill, a
//! segfault in a native library) thus runs at most `crashes` times, instead of taking down
//! every worker its broker redelivers it to.
//!
//! # Forgiving a key
//!
//! A worker process that dies abandons every claim it holds, so a job that only ran beside a
//! poison job in that process is counted as crashed too, and may be poisoned with it. An
//! operator forgives such a key with [`forgive`] (the job's name and key, as its dead letter
//! gives them) or [`Store::forgive`] (a [`StoreKey`]): the key is free again and its crash
//! count starts again at 0, its generation (the [fence](crate::fence)) kept, so the next
//! delivery runs the job and takes `crashes` more abandoned claims to poison it again. A
//! completed record and a live claim are left as they are.
//!
//! A **redrive of a `crashed` letter** forgives the key itself. A call of a job inside the
//! [redrive](crate::dead_letter::redis::RedisDeadLetters::redrive) of that job and key's
//! `crashed` letter whose claim is refused as poisoned forgives the key once, says so at warn
//! level, and claims it again: redriving the letter runs the job (and removes the letter when it
//! succeeds), where it would otherwise fail with [`Error::Poisoned`] until the key's TTL ends.
//! A letter of another reason (`exhausted`, say) forgives nothing.
//! The redrive is the operator's word that the poison job is to run again, **in the redriving
//! process**: do it once the cause is fixed, from a process that may die. If the redriven run
//! kills its process again, the letter stays (the redrive did not succeed), and its lapsed claim
//! counts as a crash like any other: the count started again at 0, so later deliveries may run
//! the job up to `crashes` more times before it is poisoned again, with a second letter. The
//! forgiving is on the redrive's own task: a redrive
//! closure that only enqueues the job for a runner must call [`forgive`] first, or the runner's
//! delivery is refused. Outside a redrive, a poisoned key is never forgiven on its own.

use crate::attempt::FirstAttempt;
use crate::bounds::{FromJobguard, Replayable};
use crate::claim::{Held, Session, Work};
use crate::dead_letter::DeadLetterSink;
use crate::observe::{Event, log_error, log_warn};
use crate::record::{DeadLetter, GiveUp};
use crate::store::record::{decode, encode_replayable, encode_unreplayable, key_reused, settled};
use crate::store::{ClaimOptions, Claimed, DEFAULT_CRASHES, DefaultScope, Letter, Store, StoreKey};
use crate::{Error, Runtime};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use crate::store::record::{DEFAULT_LEASE, DEFAULT_TTL, RECORD_VERSION};

/// One idempotent call: the key, its namespace, and how to treat a key already claimed.
#[must_use]
pub struct Idempotent<'a> {
    /// The job's name as given: what events and metrics call it.
    name: &'a str,
    /// The key's namespace in the store: the name, with `.` for `::`.
    scope: Cow<'a, str>,
    key: &'a str,
    ttl: Duration,
    lease: Duration,
    crashes: u32,
    wait: Option<Duration>,
    fingerprint: Option<String>,
    store: Option<Arc<dyn Store>>,
    sink: Option<&'a dyn DeadLetterSink>,
    /// The job's arguments for its crash letter.
    payload: Option<&'a dyn crate::retry::Payload>,
    /// The attribute's default scope, checked to be this function's alone before the claim.
    default_scope: Option<&'static DefaultScope>,
}

impl<'a> Idempotent<'a> {
    /// A call keyed by `key` for the job named `scope`, the key's namespace. A scope written as a
    /// Rust path (`my_crate::payments::charge`, the attribute's default) is stored with `.` for
    /// `::`; events and metrics name the job as given.
    pub fn new(scope: &'a str, key: &'a str) -> Self {
        Idempotent {
            name: scope,
            scope: stored_scope(scope),
            key,
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            crashes: DEFAULT_CRASHES,
            wait: None,
            fingerprint: None,
            store: None,
            sink: None,
            payload: None,
            default_scope: None,
        }
    }

    /// The scope is `#[idempotent]`'s default for one function: checked, before anything is
    /// claimed, to be no other function's (see [`DefaultScope`]).
    #[doc(hidden)]
    pub fn default_scope(mut self, scope: &'static DefaultScope) -> Self {
        self.default_scope = Some(scope);
        self
    }

    /// How long a completed result is replayed.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The claim's lease: how long a crashed worker can block the key. Renewed every third of it
    /// while the work runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// The crash limit (default [`DEFAULT_CRASHES`], 3): after this many abandoned claims (each
    /// lease lapsed without a result or a release), the job is refused with
    /// [`Error::Poisoned`] and dead-lettered once. `0` never poisons. See the
    /// [module docs](self#crashes-and-poison-jobs).
    pub fn crashes(mut self, crashes: u32) -> Self {
        self.crashes = crashes;
        self
    }

    /// When another worker holds the key, wait up to `limit` for its result instead of failing
    /// with [`Error::InProgress`] at once.
    pub fn wait(mut self, limit: Duration) -> Self {
        self.wait = Some(limit);
        self
    }

    /// A digest of the arguments: the same key with another fingerprint is [`Error::KeyReused`].
    pub fn fingerprint(mut self, fingerprint: String) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// The store, instead of the runtime's.
    pub fn store<S: Store + Clone + 'static>(mut self, store: &S) -> Self {
        self.store = Some(Arc::new(store.clone()));
        self
    }

    /// Where the job's one [`GiveUp::Crashed`] letter goes, instead of the runtime's sink: the
    /// job's own (`#[retry(dead_letter = SINK)]` beside `#[idempotent]` passes it here), so that
    /// every letter of a job lands in one place.
    pub fn dead_letter(mut self, sink: &'a dyn DeadLetterSink) -> Self {
        self.sink = Some(sink);
        self
    }

    /// The job's arguments, serialized into its [`GiveUp::Crashed`] letter (and only then), so
    /// that the letter can be redriven as the retry engine's can: `#[retry(payload = ...)]`
    /// beside `#[idempotent]` passes its payload here.
    #[doc(hidden)]
    pub fn payload(mut self, payload: &'a dyn crate::retry::Payload) -> Self {
        self.payload = Some(payload);
        self
    }

    /// Claims the key, then replays a stored result or runs `work` inside the claim.
    ///
    /// * Completed before: the stored `Ok` value, and `work` is not run.
    /// * Claimed elsewhere: [`Error::InProgress`] (or the other run's result, with [`wait`](Self::wait)).
    /// * Abandoned [`crashes`](Self::crashes) times: [`Error::Poisoned`], and `work` is not run
    ///   (the first caller to find it so dead-letters the job, with
    ///   [`GiveUp::Crashed`]).
    /// * Store unreachable: [`Error::Store`], and `work` is not run (fail closed).
    /// * `work` fails, is cancelled or panics: the claim is released so a redelivery runs it again.
    /// * `work` succeeds: the value is stored for the TTL and returned.
    pub fn run<T, E, F>(self, work: F) -> impl Future<Output = Result<T, E>>
    where
        F: Future<Output = Result<T, E>>,
        T: Replayable,
        E: FromJobguard,
    {
        // Not an `async fn`: a bound the job's types miss is one error at the call, not a
        // second one at the `.await`.
        self.claimed(work)
    }

    async fn claimed<T, E, F>(self, work: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Replayable,
        E: FromJobguard,
    {
        if let Some(scope) = self.default_scope {
            scope.check().map_err(E::from)?;
        }
        let runtime = Runtime::current();
        let store = self
            .store
            .clone()
            .unwrap_or_else(|| runtime.inner.store.clone());
        let key = StoreKey {
            scope: &self.scope,
            key: self.key,
        };
        let session = Session::new(store, runtime, self.name, key, self.lease, Work::Job);
        let options = ClaimOptions::new(self.lease)
            .fingerprint(self.fingerprint.as_deref())
            .ttl(self.ttl)
            .crashes(self.crashes);

        let mut deadline = self.wait.map(|w| tokio::time::Instant::now() + w);
        // Under a job runner, a delivery that finds the key claimed waits out the claim's lease
        // (see `wait_out`) instead of spending the delivery on `InProgress`.
        let runner = crate::attempt::Delivery::current().is_some();
        let mut poll = Duration::from_millis(10);
        // A call that waits for another worker's run says so once, not at every look.
        let mut waiting = false;
        // A redrive forgives a poisoned key once: a key poisoned again is refused.
        let mut forgiven = false;
        let (generation, attempts, steps) = loop {
            match session.claim(options).await.map_err(E::from)? {
                Claimed::Acquired {
                    generation,
                    crashes,
                    attempts,
                    steps,
                } => {
                    if crashes > 0 {
                        crashed_before(self.name, self.key, crashes, self.crashes);
                    }
                    break (generation, attempts, steps);
                }
                Claimed::Completed(bytes) => {
                    let value = match decode::<T>(&bytes) {
                        Ok(value) => value,
                        // An unreplayable result's job ran and completed: settled.
                        Err(error) => {
                            return Err(E::from(settled(error).at_key(key.scope, key.key)));
                        }
                    };
                    session.emit(Event::Replayed {
                        scope: self.name,
                        key: key.key,
                    });
                    return Ok(value);
                }
                Claimed::KeyReused => {
                    // Against a completed record, no redelivery can change that while the
                    // record stands: settled. Against a live claim it can (that run may fail
                    // and release the key), so a runner may deliver the job again.
                    let completed = matches!(session.store().lookup(key).await, Ok(Some(_)));
                    return Err(E::from(key_reused(completed)));
                }
                Claimed::Poisoned {
                    crashes,
                    attempts,
                    letter,
                } => {
                    // Inside a redrive of this job's own `crashed` letter, the operator asked
                    // for the poison job to run again: the key is forgiven, and claimed again.
                    if !forgiven && crate::dead_letter::redriven_crashed(self.name, self.key) {
                        forgiven = true;
                        let forgive = session.store().forgive(key).await;
                        if forgive.map_err(|e| E::from(e.at_key(key.scope, key.key)))? {
                            log_warn(format_args!(
                                "jobguard: job {} with key {} is redriven from its crashed dead \
                                 letter: its poisoned key ({crashes} crashes) is forgiven and the \
                                 job runs again",
                                self.name, self.key
                            ));
                        }
                        continue;
                    }
                    // Settled once its one letter is written, now or before: a runner
                    // integration must not deliver it again. Until then (the sink failed, or
                    // another delivery holds the letter role) it may, so that a later delivery
                    // writes the letter.
                    let settled = match letter {
                        Letter::Yours => self.letter_crashed(&session, crashes, attempts).await,
                        Letter::Held => false,
                        Letter::Written => true,
                    };
                    if settled {
                        crate::attempt::Delivery::settle();
                    }
                    return Err(E::from(Error::Poisoned { crashes }));
                }
                Claimed::InProgress { retry_in } => {
                    if !waiting {
                        waiting = true;
                        session.emit(Event::InProgress {
                            scope: self.name,
                            key: key.key,
                            retry_in,
                        });
                        if deadline.is_none() && runner {
                            deadline = Some(tokio::time::Instant::now() + wait_out(retry_in));
                        }
                    }
                    let now = tokio::time::Instant::now();
                    match deadline {
                        Some(end) if now < end => {
                            let nap = poll
                                .min(retry_in.max(Duration::from_millis(1)))
                                .min(end - now);
                            tokio::time::sleep(nap).await;
                            poll = (poll * 2).min(Duration::from_secs(1));
                        }
                        _ => return Err(E::from(Error::InProgress)),
                    }
                }
            }
        };

        let held = session.hold(generation, attempts, steps);
        match held.run(FirstAttempt::new(work)).await {
            Ok(value) => self.finish(held, value).await,
            Err(error) => {
                held.release().await;
                Err(error)
            }
        }
    }

    /// Dead-letters a job whose claims were abandoned `crashes` times (having made `attempts`
    /// attempts, 0 when not counted), through the job's sink
    /// ([`dead_letter`](Self::dead_letter)) or else the runtime's, and confirms it to the store.
    /// `true` once the letter is written; a sink's failure is logged (the letter whole) and
    /// raised, never returned, and leaves the letter role to a later delivery.
    async fn letter_crashed(&self, session: &Session, crashes: u32, attempts: u32) -> bool {
        let runtime = session.runtime();
        // The redriven letter of this job stays as its one letter: nothing is raised or sent.
        let written = if crate::dead_letter::redriven(self.name, Some(self.key)) {
            true
        } else {
            let now = std::time::SystemTime::now();
            let error = Error::Poisoned { crashes };
            log_error(format_args!(
                "jobguard: job {} with key {} refused for good: its worker died {crashes} times \
                 running it; dead-lettered, it will not run again",
                self.name, self.key
            ));
            let letter = DeadLetter::new(
                self.name,
                Some(self.key.to_owned()),
                GiveUp::Crashed,
                // The attempts the dead runs made, as the key's record counted them; the runs
                // themselves when the store keeps no count.
                if attempts > 0 { attempts } else { crashes },
                error.to_string(),
                now,
                now,
            )
            .with_history(vec![error.to_string()]);
            let letter = crate::retry::with_payload(letter, self.payload);
            runtime.emit(&Event::DeadLetter(&letter));
            let sink = self.sink.unwrap_or(&*runtime.inner.dead_letters);
            crate::dead_letter::deliver_observed(sink, letter, |event| runtime.emit(event)).await
        };
        if written {
            // Unconfirmed, the role goes to a later delivery, which writes a second letter:
            // one too many rather than none.
            if let Err(e) = session.store().lettered(session.key()).await {
                log_error(format_args!(
                    "jobguard: the dead letter of job {} with key {} was written but the store \
                     could not note it ({e}); a later delivery may write it again",
                    self.name, self.key
                ));
            }
        }
        written
    }

    /// Stores the value, retrying the write a few times. A value that cannot be kept to replay
    /// (it does not serialize, holds a float JSON keeps as `null`, or does not read back as its
    /// own type) is returned all the same, and the key is completed without it: a redelivery
    /// gets [`Error::Unreplayable`] rather than running the job again.
    async fn finish<T: Serialize + DeserializeOwned, E: From<Error>>(
        &self,
        held: Held,
        value: T,
    ) -> Result<T, E> {
        let record = match encode_replayable(&value) {
            Ok(record) => record,
            Err(why) => {
                let key = held.session().key();
                held.session().emit(Event::StoreFailed {
                    scope: self.name,
                    key: key.key,
                });
                log_error(format_args!(
                    "jobguard: job {}:{} succeeded but its result cannot be kept to replay \
                     ({why}); its key is recorded as completed without it, and a redelivery \
                     will fail with this reason instead of running the job again",
                    key.scope, key.key
                ));
                encode_unreplayable(&why)
            }
        };
        match held.complete(&record, self.ttl).await {
            // The side effect took place: a result that could not be stored (said in the log)
            // does not turn the call into a failure the queue would deliver again.
            Err(Error::LeaseLost) => Err(E::from(Error::LeaseLost)),
            Ok(()) | Err(_) => Ok(value),
        }
    }
}

/// How long a delivery under a job runner waits for a key another claim holds: the rest of
/// that claim's lease, and a little more for the store's clock. A worker that died holding the
/// key stops renewing it, so the claim lapses within this wait and the delivery takes it over
/// (counting the crash) and runs the job, rather than being handed back with `InProgress` and
/// spending one of the job's deliveries; a live worker renews its claim, and the delivery is
/// handed back once the wait ends, unless that worker's result arrives first (it is replayed).
fn wait_out(retry_in: Duration) -> Duration {
    retry_in.saturating_add(Duration::from_millis(250))
}

/// Says that a key is claimed with crashes in its history (a worker died holding it: its lease
/// lapsed without a result or a release; this claim may be the one that took it over, or a
/// later one, since a release keeps the count): the `crashes` so far, against the `limit` (`0`:
/// none), so that an operator sees a job killing its workers before it is poisoned.
#[cold]
fn crashed_before(job: &str, key: &str, crashes: u32, limit: u32) {
    let limit = match limit {
        0 => "no crash limit".to_owned(),
        n => format!("poisoned at {n}"),
    };
    log_warn(format_args!(
        "jobguard: job {job} with key {key} runs with {crashes} crash(es) counted, of workers that \
         died holding it ({limit})"
    ));
}

/// The scope a job named `name` stores its keys under: the name, with `.` for `::`.
fn stored_scope(name: &str) -> Cow<'_, str> {
    if name.contains("::") {
        Cow::Owned(name.replace("::", "."))
    } else {
        Cow::Borrowed(name)
    }
}

/// Forgives the crashes of the job named `job` under `key` in `store`: a poisoned key becomes
/// free and the key's crash count starts again at 0, so that the job runs at its next delivery.
/// `Ok(true)` when there was something to forgive; a completed record and a live claim are
/// left as they are (`Ok(false)`). See [`Store::forgive`], which this calls, and the
/// [module docs](self#forgiving-a-key).
///
/// `job` is the job's name as its [`DeadLetter`] and its events give it: `#[idempotent]`'s
/// `scope`, else the function's module path and name (`my_crate::payments::charge`), which is
/// stored with `.` for `::` as [`Idempotent::new`] stores it. `key` is the key as the
/// job computed it (the letter's [`key`](crate::DeadLetter::key)). The runtime's store is
/// `Runtime::current().store()`.
///
/// A store that cannot forgive fails with [`Error::Store`] ([`Store::forgive`]'s default); a
/// store that cannot be reached with [`Error::Store`]; a record it cannot read with
/// [`Error::Corrupt`].
///
/// ```
/// use jobguard::{ClaimOptions, Claimed, MemoryStore, Store, StoreKey};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), jobguard::Error> {
/// let store = MemoryStore::new();
/// // `payments::charge` keeps its keys under the scope `payments.charge`. Its crash limit is
/// // 1 here: a worker that dies holding `order-A` poisons it.
/// let key = StoreKey { scope: "payments.charge", key: "order-A" };
/// let lease = Duration::from_secs(30);
/// let options = ClaimOptions::new(lease).crashes(1);
/// store.claim(key, "worker-1", options).await?; // its process dies
/// tokio::time::advance(lease).await;
/// assert!(matches!(
///     store.claim(key, "worker-2", options).await?,
///     Claimed::Poisoned { crashes: 1, .. }
/// ));
///
/// // The operator forgives it, by the job's name and key as its dead letter gives them:
/// assert!(jobguard::idempotency::forgive(&store, "payments::charge", "order-A").await?);
/// // The next delivery runs the job, under a generation larger than the dead worker's.
/// assert!(matches!(
///     store.claim(key, "worker-3", options).await?,
///     Claimed::Acquired { generation: 2, crashes: 0, .. }
/// ));
/// // Nothing left to forgive while it runs.
/// assert!(!jobguard::idempotency::forgive(&store, "payments.charge", "order-A").await?);
/// # Ok(())
/// # }
/// ```
pub async fn forgive<S: Store + ?Sized>(store: &S, job: &str, key: &str) -> Result<bool, Error> {
    let scope = stored_scope(job);
    store.forgive(StoreKey { scope: &scope, key }).await
}
