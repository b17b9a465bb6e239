//! Durable steps: within one job, each effect runs once.
//!
//! A job rarely has one effect. A checkout captures the payment, reserves the stock, then sends
//! the receipt. `#[idempotent]` guards the job as a whole, and a retry or a redelivery runs its
//! whole body again: the receipt's timeout would capture the payment a second time. A **step**
//! records its `Ok` value under the job's key, and every later run of the same job returns the
//! recorded value without running the step again, so the job resumes at the first step not yet
//! recorded.
//!
#![cfg_attr(feature = "macros", doc = "```")]
#![cfg_attr(not(feature = "macros"), doc = "```ignore")]
//! use std::sync::atomic::{AtomicU32, Ordering};
//!
//! static CAPTURED: AtomicU32 = AtomicU32::new(0);
//! static SENT: AtomicU32 = AtomicU32::new(0);
//!
//! #[jobguard::step(name = "capture.v1")]
//! async fn capture(order: &str) -> Result<String, jobguard::Error> {
//!     CAPTURED.fetch_add(1, Ordering::Relaxed); // the payment gateway's call
//!     Ok(format!("payment for {order}"))
//! }
//!
//! #[jobguard::step]
//! async fn receipt(payment: &str) -> Result<(), jobguard::Error> {
//!     // the mail server times out the first time
//!     match SENT.fetch_add(1, Ordering::Relaxed) {
//!         0 => Err(jobguard::Error::Timeout),
//!         _ => Ok(()),
//!     }
//! }
//!
//! #[jobguard::idempotent(key = order)]
//! #[jobguard::retry(attempts = 3, base = "10ms", on = all)]
//! async fn checkout(order: &str) -> Result<(), jobguard::Error> {
//!     let payment = capture(order).await?;
//!     receipt(&payment).await
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! checkout("order-A").await.unwrap();
//! // The second attempt replayed the capture: the payment was taken once.
//! assert_eq!(CAPTURED.load(Ordering::Relaxed), 1);
//! assert_eq!(SENT.load(Ordering::Relaxed), 2);
//! # }
//! ```
//!
//! # What is recorded, and when it replays
//!
//! * A step is recorded under (the job's scope, the job's key, the step's name, its
//!   **occurrence**): the n-th call of one name within one run of the job's body is occurrence
//!   n, so a loop over line items records each item's call. A run is one attempt: each
//!   `#[retry]` attempt around the job counts from 1 again, and so does every later claim.
//! * Its `Ok` value is recorded; an `Err` is not, and the next run runs the step again.
//! * Every later run of the same job key replays the recorded value without running the step:
//!   a `#[retry]` attempt around the job, a redelivery after a crash or a handed-back failure, a
//!   redrive of the job's dead letter. The steps are read with the job's claim (on Redis, in
//!   the claim's own round trip), so a replay costs no round trip.
//! * The name is the step's identity: keep it while the step's meaning stays, and version it
//!   (`name = "capture.v2"`) when a change makes an old recorded value wrong to replay. A value
//!   that no longer reads back as the step's type fails the step with
//!   [`Error::Corrupt`], naming the job's key and the step, and the
//!   step does not run (fail closed).
//! * A step is recorded only while the job's claim holds: a worker whose lease was taken over
//!   (a paused process that wakes after another worker finished its job) has its write refused
//!   with [`Error::LeaseLost`], and records nothing.
//!   [`fence()`](crate::fence) gives the claim's generation inside a step, for the downstream.
//! * `#[retry]` on a step retries that step alone, inside the step: its attempts are one
//!   occurrence, and its final `Ok` is what is recorded.
//! * Steps share their job's record: its TTL, and its end. A completed job replays its result
//!   and never reads its steps (the store drops them); [`Store::forget`]
//!   and [`Store::forgive`] drop them too, so a job forgiven after its
//!   worker crashed runs its steps again.
//! * Outside a job (no `#[idempotent]` claim in scope, or a task the job spawned), a step just
//!   runs and records nothing. Inside `#[idempotent(transaction = tx)]`, the transaction is what
//!   makes the job atomic, and steps record nothing either.
//! * A step whose value could not be written (the store out of reach after a few tries) still
//!   returns it, since its effect took place, and the failure is logged and raised as
//!   [`Event::StoreFailed`]: a later run runs that step again.

use crate::bounds::{FromJobguard, Recordable};
use crate::observe::{Event, log_error};
use crate::store::record::{decode, encode_replayable, encode_unreplayable};
use crate::store::{MAX_STEP_NAME, StepKey, StepRecord, Store, StoreKey};
use crate::{Error, Runtime};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

tokio::task_local! {
    /// The journal of the job whose claim the running task holds.
    static JOURNAL: Arc<Journal>;
}

/// Runs `work` as the durable step `name` of the job running on this task: inside an
/// `#[idempotent]` job, a value recorded for this step by an earlier run of the job is returned
/// without running `work`; otherwise `work` runs, and its `Ok` value is recorded. Outside a job,
/// `work` runs and nothing is recorded. What `#[jobguard::step]` expands to; see the [module
/// docs](mod@crate::step) for the rules.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), jobguard::Error> {
/// let order = "order-A";
/// let charge = jobguard::idempotency::Idempotent::new("shop.checkout", order)
///     .run(async {
///         let payment = jobguard::step("capture.v1", async {
///             Ok::<_, jobguard::Error>(format!("payment for {order}"))
///         })
///         .await?;
///         Ok::<_, jobguard::Error>(payment)
///     })
///     .await?;
/// assert_eq!(charge, "payment for order-A");
/// # Ok(())
/// # }
/// ```
///
/// Errors of its own, in `E` (which needs `From<jobguard::Error>`), and the step does not run:
/// a `name` that is empty or longer than [`MAX_STEP_NAME`] bytes
/// ([`Error::Config`]); a recorded value that does not decode
/// ([`Error::Corrupt`]); a store that keeps no steps, or cannot be
/// reached to read them. After the step ran: [`Error::LeaseLost`]
/// when the job's claim was taken over, and its value is not recorded.
pub fn step<T, E, F>(name: &str, work: F) -> impl Future<Output = Result<T, E>>
where
    F: Future<Output = Result<T, E>>,
    T: Recordable,
    E: FromJobguard,
{
    // Not an `async fn`: a bound the step's types miss is one error at the call.
    run(name, work)
}

async fn run<T, E, F>(name: &str, work: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    T: Recordable,
    E: FromJobguard,
{
    match JOURNAL.try_with(Arc::clone) {
        Ok(journal) => journal.step(name, work).await,
        Err(_) => work.await,
    }
}

/// Runs `fut` with `journal` as the journal of the job on this task.
pub(crate) fn scope<F: Future>(journal: Arc<Journal>, fut: F) -> impl Future<Output = F::Output> {
    JOURNAL.scope(journal, fut)
}

/// The journal of the job whose claim the running task holds, when that job is `job` and its
/// key `key`: the retry engine of that job's own body counts its attempts in it. A `#[retry]`
/// on a step, or on another call inside the job, is another job (or has another key, or none)
/// and counts nothing here.
pub(crate) fn of_job(job: &str, key: &str) -> Option<Arc<Journal>> {
    JOURNAL
        .try_with(|journal| (journal.job == job && journal.key == key).then(|| journal.clone()))
        .ok()
        .flatten()
}

/// What the work learns of one held claim: its steps (what the claim read, what this claim
/// recorded since, the count of each name's calls in the run under way), the job's count of
/// attempts in the key's record, and whether the claim was found taken over.
pub(crate) struct Journal {
    store: Arc<dyn Store>,
    runtime: Runtime,
    /// The job's name, as events give it.
    job: String,
    scope: String,
    key: String,
    token: String,
    /// The job's attempts counted in its key's record so far ([`Store::attempted`]); 0 when
    /// the store keeps no count for the key.
    attempts: AtomicU32,
    /// Set once the store said another claim holds the key: this worker's run of the job is a
    /// zombie's, and its give-up writes no dead letter (the job is the other worker's).
    lost: AtomicBool,
    book: Mutex<Book>,
}

struct Book {
    /// The recorded values by name, then occurrence, as the claim read them; `None` when the
    /// store keeps no steps for the key.
    recorded: Option<HashMap<String, HashMap<u32, Vec<u8>>>>,
    /// The run ([`crate::attempt::run`]) the counts belong to.
    run: u64,
    /// The calls of each name in that run.
    counts: HashMap<String, u32>,
    /// Steps whose work is running: a step called inside another counts in the same run.
    running: u32,
}

impl Journal {
    /// The journal of the claim `token` holds on `key`, with the steps its claim read (`None`:
    /// the store keeps none for the key, and a step fails before it runs).
    pub(crate) fn new(
        store: Arc<dyn Store>,
        runtime: Runtime,
        job: &str,
        key: StoreKey<'_>,
        token: &str,
        attempts: u32,
        steps: Option<Vec<StepRecord>>,
    ) -> Self {
        Journal {
            store,
            runtime,
            job: job.to_owned(),
            scope: key.scope.to_owned(),
            key: key.key.to_owned(),
            token: token.to_owned(),
            attempts: AtomicU32::new(attempts),
            lost: AtomicBool::new(false),
            book: Mutex::new(Book {
                recorded: steps.map(by_name),
                run: 0,
                counts: HashMap::new(),
                running: 0,
            }),
        }
    }

    fn key(&self) -> StoreKey<'_> {
        StoreKey {
            scope: &self.scope,
            key: &self.key,
        }
    }

    /// The job's attempts counted in its key's record so far, over every claim; `None` when
    /// the store keeps no count for the key.
    pub(crate) fn attempts(&self) -> Option<u32> {
        Some(self.attempts.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// Whether the store said this claim was taken over (a step's record, a count or a
    /// renewal found [`Error::LeaseLost`]).
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Notes that the claim was taken over.
    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::Relaxed);
    }

    /// Counts one more attempt of the job in its key's record, before a retry. A count that
    /// cannot be written (the store out of reach, the lease lost) is logged, and the count is
    /// no longer known: the dead letter then infers it (see [`crate::apalis`]).
    pub(crate) async fn attempted(&self) {
        if self.attempts().is_none() {
            return;
        }
        let counted = match self.store.attempted(self.key(), &self.token).await {
            Ok(attempts) => attempts,
            Err(Error::LeaseLost) => {
                self.lose();
                0
            }
            Err(e) => {
                log_error(format_args!(
                    "jobguard: the attempts of job {} with key {} could not be counted ({e}); \
                     its dead letter, if any, infers them from the deliveries",
                    self.job, self.key
                ));
                0
            }
        };
        self.attempts.store(counted, Ordering::Relaxed);
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic while the lock was held leaves counts and values that are still valid.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn step<T, E, F>(&self, name: &str, work: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Recordable,
        E: FromJobguard,
    {
        if name.is_empty() || name.len() > MAX_STEP_NAME {
            return Err(E::from(Error::Config(format!(
                "step name {name:?} of job {} is {} bytes; a step's name is 1 to {MAX_STEP_NAME} \
                 bytes",
                self.job,
                name.len()
            ))));
        }
        let occurrence = self.count(name);
        let step = StepKey { name, occurrence };
        if let Some(value) = self.replay::<T>(step).map_err(E::from)? {
            self.runtime.emit(&Event::StepReplayed {
                scope: &self.job,
                key: &self.key,
                step: name,
                occurrence,
            });
            return Ok(value);
        }
        let value = {
            let _running = Running::new(self);
            traced(&self.job, &self.key, step, work).await?
        };
        self.record(step, &value).await.map_err(E::from)?;
        Ok(value)
    }

    /// The occurrence of this call of `name`: one more than the calls of `name` so far in the
    /// run under way. A new run (another attempt of the job's body) counts from 1 again.
    fn count(&self, name: &str) -> u32 {
        let run = crate::attempt::run();
        let mut book = self.book();
        if book.running == 0 && book.run != run {
            book.run = run;
            book.counts.clear();
        }
        let count = match book.counts.get_mut(name) {
            Some(count) => count,
            None => book.counts.entry(name.to_owned()).or_insert(0),
        };
        *count += 1;
        *count
    }

    /// The value recorded for `step`, decoded; `None` when it was not recorded.
    fn replay<T: Recordable>(&self, step: StepKey<'_>) -> Result<Option<T>, Error> {
        let book = self.book();
        let Some(recorded) = &book.recorded else {
            return Err(Error::Config(format!(
                "the store keeps no durable steps for key {:?} of {:?} (see the store's docs); \
                 step {:?} of job {} does not run",
                self.key, self.scope, step.name, self.job
            )));
        };
        let Some(bytes) = recorded
            .get(step.name)
            .and_then(|r| r.get(&step.occurrence))
        else {
            return Ok(None);
        };
        decode::<T>(bytes).map(Some).map_err(|error| match error {
            Error::Corrupt(why) => Error::Corrupt(format!(
                "step {:?} (occurrence {}) of job key {:?} of {:?}: {why}; the step does not run",
                step.name, step.occurrence, self.key, self.scope
            )),
            other => other,
        })
    }

    /// Records `value` as `step`, trying the write up to four times. `Err(LeaseLost)`: the
    /// claim was taken over, and nothing was recorded. A write that keeps failing otherwise is
    /// logged and raised, and the step's value returned all the same: its effect took place.
    async fn record<T: Recordable>(&self, step: StepKey<'_>, value: &T) -> Result<(), Error> {
        let bytes = match encode_replayable(value) {
            Ok(bytes) => bytes,
            Err(why) => {
                log_error(format_args!(
                    "jobguard: step {} of job {} with key {} succeeded but its value cannot be \
                     kept to replay ({why}); it is recorded without it, and a later run fails \
                     with this reason instead of running the step again",
                    step.name, self.job, self.key
                ));
                encode_unreplayable(&why)
            }
        };
        let mut pause = Duration::from_millis(50);
        for attempt in 1.. {
            match (self.store)
                .record_step(self.key(), &self.token, step, &bytes)
                .await
            {
                Ok(()) => break,
                Err(Error::LeaseLost) => {
                    self.lose();
                    self.runtime.emit(&Event::LeaseLost {
                        scope: &self.job,
                        key: &self.key,
                    });
                    log_error(format_args!(
                        "jobguard: step {} of job {} with key {} ran but the job's lease was \
                         lost before it was recorded; another worker holds the job",
                        step.name, self.job, self.key
                    ));
                    return Err(Error::LeaseLost);
                }
                Err(error) if attempt == 4 => {
                    self.runtime.emit(&Event::StoreFailed {
                        scope: &self.job,
                        key: &self.key,
                    });
                    log_error(format_args!(
                        "jobguard: step {} of job {} with key {} ran but could not be recorded \
                         ({error}); a later run of the job runs it again",
                        step.name, self.job, self.key
                    ));
                    return Ok(());
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        let mut book = self.book();
        if let Some(recorded) = &mut book.recorded {
            match recorded.get_mut(step.name) {
                Some(values) => values.insert(step.occurrence, bytes),
                None => (recorded.entry(step.name.to_owned()).or_default())
                    .insert(step.occurrence, bytes),
            };
        }
        drop(book);
        self.runtime.emit(&Event::StepRecorded {
            scope: &self.job,
            key: &self.key,
            step: step.name,
            occurrence: step.occurrence,
        });
        Ok(())
    }
}

/// A step's work running: steps called inside it count in the run of the step around them.
struct Running<'j>(&'j Journal);

impl<'j> Running<'j> {
    fn new(journal: &'j Journal) -> Self {
        journal.book().running += 1;
        Running(journal)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.book().running -= 1;
    }
}

/// The steps as the journal looks them up: by name, then occurrence.
fn by_name(steps: Vec<StepRecord>) -> HashMap<String, HashMap<u32, Vec<u8>>> {
    let mut by_name: HashMap<String, HashMap<u32, Vec<u8>>> = HashMap::new();
    for step in steps {
        (by_name.entry(step.name).or_default()).insert(step.occurrence, step.value);
    }
    by_name
}

/// `work` inside a span named [`STEP_SPAN`](crate::observe::tracing::STEP_SPAN) with the job,
/// its key, the step and its occurrence, when a `tracing` subscriber listens.
#[cfg(feature = "tracing")]
async fn traced<F: Future>(job: &str, key: &str, step: StepKey<'_>, work: F) -> F::Output {
    if !crate::observe::tracing_listens() {
        return work.await;
    }
    let span = crate::observe::tracing::step_span(job, key, step.name, step.occurrence);
    ::tracing::Instrument::instrument(work, span).await
}

#[cfg(not(feature = "tracing"))]
async fn traced<F: Future>(_: &str, _: &str, _: StepKey<'_>, work: F) -> F::Output {
    work.await
}
