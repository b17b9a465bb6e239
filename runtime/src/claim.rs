//! The claim session: the one protocol every guarded entry point follows on a key.
//!
//! `#[idempotent]` ([`Idempotent`](crate::idempotency::Idempotent)), the HTTP
//! `Idempotency-Key` layer and the job-runner layer all go through it, so that a rule changed
//! here changes everywhere:
//!
//! 1. **claim** the key ([`Session::claim`]): one [`Store::claim`], numbered (the fence)
//!    and counting the claims that dead workers abandoned (crashes, then poisoning);
//! 2. **hold** it while the work runs ([`Held::run`]): the lease is renewed every third of
//!    itself, the work reads the claim's generation with [`fence()`](crate::fence), and its
//!    durable steps ([`step`](crate::step())) find the steps the claim read, and record theirs
//!    under the claim's token;
//! 3. then **complete** it with the result ([`Held::complete`], retried a few times), or
//!    **release** it ([`Held::release`]) when the work failed, so that a redelivery runs it
//!    again. A held claim dropped before either (the work was cancelled, or panicked) is
//!    released from `drop`.
//!
//! What the caller answers for each claim outcome (replay a result, wait, refuse, dead-letter
//! a poisoned job) stays with the caller: a job returns a typed [`Error`], a request a
//! problem document.

use crate::attempt::Fenced;
use crate::observe::{Event, log_error};
use crate::step::Journal;
use crate::store::{ClaimOptions, Claimed, StepRecord, Store, StoreKey};
use crate::{Error, Runtime};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

/// What a session guards, for the words of its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// A job: it "succeeded", its "result" is stored, "another worker" may run it.
    Job,
    /// An HTTP request: it "was answered", its "response" is stored, "a repeat" may run it.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    Request,
}

/// One claim on one key, from the claim to its end.
pub(crate) struct Session {
    store: Arc<dyn Store>,
    runtime: Runtime,
    /// What events call the work: the job's name, or a request's store scope.
    name: String,
    scope: String,
    key: String,
    token: String,
    lease: Duration,
    work: Work,
    /// Set once `LeaseLost` was raised: the heartbeat finds a lease lost, and the result's
    /// write is then refused for the same reason; the event says it once.
    lost: AtomicBool,
}

impl Session {
    /// A session on `key` in `scope` of `store`, under a new random token, with events raised
    /// through `runtime` under `name`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        runtime: Runtime,
        name: &str,
        key: StoreKey<'_>,
        lease: Duration,
        work: Work,
    ) -> Self {
        Session {
            store,
            runtime,
            name: name.to_owned(),
            scope: key.scope.to_owned(),
            key: key.key.to_owned(),
            token: crate::store::record::new_token(),
            lease,
            work,
            lost: AtomicBool::new(false),
        }
    }

    /// The key this session claims.
    pub(crate) fn key(&self) -> StoreKey<'_> {
        StoreKey {
            scope: &self.scope,
            key: &self.key,
        }
    }

    /// The store this session claims in.
    pub(crate) fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// The runtime this session raises its events through.
    pub(crate) fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Raises `event` through the session's runtime (`LeaseLost` once).
    pub(crate) fn emit(&self, event: Event<'_>) {
        if matches!(event, Event::LeaseLost { .. }) && self.lost.swap(true, Ordering::Relaxed) {
            return;
        }
        self.runtime.emit(&event);
    }

    /// Claims the key with `options` (the lease is the session's). A store that cannot be
    /// reached is an [`Error`] the caller fails closed on, raised as `ClaimFailed`.
    pub(crate) async fn claim(&self, options: ClaimOptions<'_>) -> Result<Claimed, Error> {
        let options = ClaimOptions {
            lease: self.lease,
            ..options
        };
        match self.store.claim(self.key(), &self.token, options).await {
            Ok(claimed) => Ok(claimed),
            Err(error) => {
                let error = error.at_key(&self.scope, &self.key);
                self.emit(Event::ClaimFailed {
                    scope: &self.name,
                    key: &self.key,
                    error: &error,
                });
                Err(error)
            }
        }
    }

    /// The claim was acquired as `generation`, with the job's `attempts` counted so far and
    /// its recorded `steps` ([`Claimed::Acquired`]): from here until [`Held::complete`] or
    /// [`Held::release`], the session holds the key, and releases it if dropped.
    pub(crate) fn hold(
        self,
        generation: u64,
        attempts: u32,
        steps: Option<Vec<StepRecord>>,
    ) -> Held {
        self.emit(Event::Claimed {
            scope: &self.name,
            key: &self.key,
        });
        let counted = crate::runtime::HeldClaim::new(&self.runtime);
        let journal = Journal::new(
            self.store.clone(),
            self.runtime.clone(),
            &self.name,
            self.key(),
            &self.token,
            attempts,
            steps,
        );
        Held {
            session: self,
            generation,
            journal: Arc::new(journal),
            armed: true,
            counted: Some(counted),
        }
    }
}

/// A session whose claim is held.
pub(crate) struct Held {
    session: Session,
    generation: u64,
    /// The work's durable steps.
    journal: Arc<Journal>,
    /// Cleared once the claim is completed or released: nothing is left for `drop` to do.
    armed: bool,
    /// The claim counted in its runtime until its completion or release is written (see
    /// [`Runtime::shutdown`]); handed to the release of a dropped claim.
    counted: Option<crate::runtime::HeldClaim>,
}

impl Held {
    /// The session this claim belongs to.
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// Runs `work` inside the claim: [`fence()`](crate::fence) gives its generation, its steps
    /// record under the claim, and the lease is renewed every third of itself until the work
    /// ends. A store error at a renewal
    /// is tried again at the next; a lost lease is said once (the work runs on: stopping it
    /// halfway would leave its effect half done, and the result's write will be refused).
    pub(crate) async fn run<F: Future>(&self, work: F) -> F::Output {
        let s = &self.session;
        let work = Fenced::new(self.generation, work);
        let mut work = pin!(crate::step::scope(self.journal.clone(), work));
        // Work that ends at its first poll needs no timer.
        let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
        if let Poll::Ready(done) = first {
            return done;
        }
        let every = s.lease / 3;
        let mut lost = false;
        loop {
            tokio::select! {
                biased;
                done = &mut work => return done,
                _ = tokio::time::sleep(every), if !lost => {
                    match s.store.renew(s.key(), &s.token, s.lease).await {
                        Ok(()) => {}
                        Err(Error::LeaseLost) => {
                            lost = true;
                            self.journal.lose();
                            s.emit(Event::LeaseLost { scope: &s.name, key: &s.key });
                            let (what, who) = match s.work {
                                Work::Job => ("job ran", "another worker may run it too"),
                                Work::Request => ("request ran", "a repeat may run it too"),
                            };
                            log_error(format_args!(
                                "jobguard: lease on {}:{} lost while the {what}; {who}",
                                s.scope, s.key
                            ));
                        }
                        // The lease still runs: try again at the next beat.
                        Err(_) => {}
                    }
                }
            }
        }
    }

    /// Replaces the claim with the completed `record`, kept for `ttl`, trying the write up to
    /// four times. `Err(LeaseLost)`: another claim took the key over, and nothing was written;
    /// `Err` of the store: the record could not be written, and the claim lapses with its
    /// lease (the next claim counts it as a crash). Both are raised and logged here.
    pub(crate) async fn complete(mut self, record: &[u8], ttl: Duration) -> Result<(), Error> {
        self.armed = false;
        let s = &self.session;
        let (done, stored, again) = match s.work {
            Work::Job => (
                "succeeded",
                "result was stored; another worker may have run it",
                "a redelivery after the lease lapses will run it again",
            ),
            Work::Request => (
                "was answered",
                "response was stored; a repeat may have run it too",
                "a repeat after the lease lapses runs it again",
            ),
        };
        let mut pause = Duration::from_millis(50);
        let mut attempt = 1;
        loop {
            match s.store.complete(s.key(), &s.token, record, ttl).await {
                Ok(()) => return Ok(()),
                Err(Error::LeaseLost) => {
                    s.emit(Event::LeaseLost {
                        scope: &s.name,
                        key: &s.key,
                    });
                    log_error(format_args!(
                        "jobguard: {}:{} {done} but its lease was lost before its {stored}",
                        s.scope, s.key
                    ));
                    return Err(Error::LeaseLost);
                }
                Err(error) if attempt == 4 => {
                    s.emit(Event::StoreFailed {
                        scope: &s.name,
                        key: &s.key,
                    });
                    log_error(format_args!(
                        "jobguard: {}:{} {done} but what it returned could not be stored \
                         ({error}); {again}",
                        s.scope, s.key
                    ));
                    return Err(error);
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
            }
        }
    }

    /// Releases the claim so that a redelivery (or a repeat) runs the work again, trying a few
    /// times; a claim that cannot be released lapses with its lease.
    pub(crate) async fn release(mut self) {
        self.armed = false;
        let s = &self.session;
        release(&*s.store, s.key(), &s.token).await;
        s.emit(Event::Released {
            scope: &s.name,
            key: &s.key,
        });
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let s = &mut self.session;
        release_dropped(
            s.store.clone(),
            s.runtime.clone(),
            std::mem::take(&mut s.scope),
            std::mem::take(&mut s.name),
            std::mem::take(&mut s.key),
            std::mem::take(&mut s.token),
            self.counted.take(),
        );
    }
}

/// Releases `token`'s claim, trying a few times; a claim that cannot be released lapses with
/// its lease.
async fn release(store: &dyn Store, key: StoreKey<'_>, token: &str) {
    for _ in 0..3 {
        if store.release(key, token).await.is_ok() {
            return;
        }
    }
    log_error(format_args!(
        "jobguard: claim on {}:{} could not be released; it lapses with its lease",
        key.scope, key.key
    ));
}

/// Releases the claim of work that was dropped (cancelled) or panicked, and raises `Released`
/// under `name`: at once when the store answers without waiting (as
/// [`MemoryStore`](crate::MemoryStore) does), so that a redelivery right after the cancellation
/// finds the key free; else in a task. Outside a tokio runtime the claim lapses with its lease.
fn release_dropped(
    store: Arc<dyn Store>,
    runtime: Runtime,
    scope: String,
    name: String,
    key: String,
    token: String,
    counted: Option<crate::runtime::HeldClaim>,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        log_error(format_args!(
            "jobguard: claim on {scope}:{key} dropped outside a runtime; it lapses with its lease"
        ));
        return;
    };
    let mut releasing = Box::pin(async move {
        let key = StoreKey {
            scope: &scope,
            key: &key,
        };
        release(&*store, key, &token).await;
        runtime.emit(&Event::Released {
            scope: &name,
            key: key.key,
        });
        drop(counted);
    });
    // While a panic unwinds, nothing of the observers' runs here: a panic in one would abort.
    if !std::thread::panicking() {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if releasing.as_mut().poll(&mut cx).is_ready() {
            return;
        }
    }
    handle.spawn(releasing);
}
