//! A store written outside the crate, from the `Store` trait's docs alone (a `Mutex<HashMap>`
//! on tokio's clock), passes the conformance suite `jobguard::testing::check_store`, as the
//! built-in stores do; and it serves `#[idempotent]` like them.

use jobguard::store::{
    ClaimOptions, Claimed, KeyInfo, KeyState, Letter, StepKey, StepRecord, Store, StoreFuture,
    StoreKey,
};
use jobguard::{Error, Runtime};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// What the store keeps of one key.
struct Entry {
    state: State,
    fingerprint: Option<String>,
    generation: u64,
    crashes: u32,
    /// The job's attempts over every claim.
    attempts: u32,
    /// The job's recorded steps, while claimed or released.
    steps: Vec<StepRecord>,
    /// When the entry (its history included) goes.
    expires: Instant,
}

enum State {
    Claimed {
        token: String,
        lease_end: Instant,
    },
    Completed(Vec<u8>),
    /// Released: only the generation and the crash count are kept.
    Free,
    /// Refused; the letter role is held until `Some(end)`, or the letter is written (`None`).
    Poisoned {
        letter_end: Option<Instant>,
    },
}

#[derive(Clone, Default)]
struct MapStore(Arc<Mutex<HashMap<(String, String), Entry>>>);

impl MapStore {
    /// Runs `f` on the key's live entry (an expired one is gone) under the lock.
    fn with<T>(&self, key: StoreKey<'_>, f: impl FnOnce(&mut Option<Entry>, Instant) -> T) -> T {
        let mut map = self.0.lock().unwrap();
        let id = (key.scope.to_owned(), key.key.to_owned());
        let now = Instant::now();
        let mut entry = map.remove(&id).filter(|e| e.expires > now);
        let out = f(&mut entry, now);
        if let Some(entry) = entry {
            map.insert(id, entry);
        }
        out
    }

    /// `Some(entry)` when `token` holds a live claim on it.
    fn held<'e>(entry: &'e mut Option<Entry>, token: &str, now: Instant) -> Option<&'e mut Entry> {
        entry.as_mut().filter(|e| {
            matches!(&e.state, State::Claimed { token: t, lease_end } if t == token && *lease_end > now)
        })
    }
}

fn ready<'a, T: Send + 'a>(value: Result<T, Error>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(value))
}

impl Store for MapStore {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        ready(Ok(self.with(key, |entry, now| {
            let (generation, mut crashes, attempts, steps) = match entry {
                None => (0, 0, 0, Vec::new()),
                Some(e) => {
                    let reused = matches!((&e.fingerprint, options.fingerprint),
                        (Some(theirs), Some(ours)) if theirs != ours);
                    match &mut e.state {
                        State::Completed(_) if reused => return Claimed::KeyReused,
                        State::Completed(record) => return Claimed::Completed(record.clone()),
                        State::Poisoned { letter_end } => {
                            let letter = match *letter_end {
                                None => Letter::Written,
                                Some(end) if end > now => Letter::Held,
                                Some(_) => {
                                    *letter_end = Some(now + options.lease);
                                    Letter::Yours
                                }
                            };
                            return Claimed::Poisoned {
                                crashes: e.crashes,
                                attempts: e.attempts,
                                letter,
                            };
                        }
                        State::Claimed { lease_end, .. } if *lease_end > now => {
                            if reused {
                                return Claimed::KeyReused;
                            }
                            return Claimed::InProgress {
                                retry_in: *lease_end - now,
                            };
                        }
                        // Abandoned by a worker that died: counted.
                        State::Claimed { .. } => {
                            (e.generation, e.crashes + 1, e.attempts, e.steps.clone())
                        }
                        State::Free => (e.generation, e.crashes, e.attempts, e.steps.clone()),
                    }
                }
            };
            if options.crashes > 0 && crashes >= options.crashes {
                let e = entry.as_mut().expect("only a key with history has crashes");
                e.state = State::Poisoned {
                    letter_end: Some(now + options.lease),
                };
                e.crashes = crashes;
                e.steps.clear();
                e.expires = now + options.ttl;
                return Claimed::Poisoned {
                    crashes,
                    attempts: e.attempts,
                    letter: Letter::Yours,
                };
            }
            if entry.is_none() {
                crashes = 0;
            }
            *entry = Some(Entry {
                state: State::Claimed {
                    token: token.to_owned(),
                    lease_end: now + options.lease,
                },
                fingerprint: options.fingerprint.map(str::to_owned),
                generation: generation + 1,
                crashes,
                attempts: attempts + 1,
                steps: steps.clone(),
                expires: now + options.ttl.max(options.lease),
            });
            Claimed::Acquired {
                generation: generation + 1,
                crashes,
                attempts: attempts + 1,
                steps: Some(steps),
            }
        })))
    }

    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        ready(self.with(key, |entry, now| {
            let e = Self::held(entry, token, now).ok_or(Error::LeaseLost)?;
            e.state = State::Completed(record.to_vec());
            e.steps.clear();
            e.expires = now + ttl;
            Ok(())
        }))
    }

    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        self.with(key, |entry, now| {
            if let Some(e) = Self::held(entry, token, now) {
                e.state = State::Free;
            }
        });
        ready(Ok(()))
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        ready(self.with(key, |entry, now| {
            let e = Self::held(entry, token, now).ok_or(Error::LeaseLost)?;
            e.state = State::Claimed {
                token: token.to_owned(),
                lease_end: now + lease,
            };
            e.expires = e.expires.max(now + lease);
            Ok(())
        }))
    }

    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        ready(Ok(self.with(key, |entry, _| match entry {
            Some(Entry {
                state: State::Completed(record),
                ..
            }) => Some(record.clone()),
            _ => None,
        })))
    }

    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        ready(Ok(self.with(key, |entry, now| {
            let Some(e) = entry else { return false };
            let forgiven = match &e.state {
                State::Poisoned { .. } => true,
                State::Claimed { lease_end, .. } => *lease_end <= now,
                State::Free => e.crashes > 0,
                State::Completed(_) => false,
            };
            if forgiven {
                e.state = State::Free;
                e.crashes = 0;
                e.steps.clear();
            }
            forgiven
        })))
    }

    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
        self.with(key, |entry, _| {
            if let Some(Entry {
                state: State::Poisoned { letter_end },
                ..
            }) = entry
            {
                *letter_end = None;
            }
        });
        ready(Ok(()))
    }

    fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
        ready(Ok(self.with(key, |entry, now| {
            let Some(e) = entry else {
                return KeyInfo::free();
            };
            let info = |state| KeyInfo::new(state, Some(e.generation), e.crashes);
            match &e.state {
                State::Claimed { lease_end, .. } => {
                    info(KeyState::Claimed).lease_left(lease_end.saturating_duration_since(now))
                }
                State::Completed(record) => info(KeyState::Completed).result(record.clone()),
                State::Free => info(KeyState::Free),
                State::Poisoned { .. } => info(KeyState::Poisoned),
            }
        })))
    }

    fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        ready(Ok(self.with(key, |entry, _| entry.take().is_some())))
    }

    fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32> {
        ready(self.with(key, |entry, now| {
            let e = Self::held(entry, token, now).ok_or(Error::LeaseLost)?;
            e.attempts += 1;
            Ok(e.attempts)
        }))
    }

    fn record_step<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        step: StepKey<'a>,
        value: &'a [u8],
    ) -> StoreFuture<'a, ()> {
        ready(self.with(key, |entry, now| {
            let e = Self::held(entry, token, now).ok_or(Error::LeaseLost)?;
            e.steps
                .retain(|s| (s.name.as_str(), s.occurrence) != (step.name, step.occurrence));
            e.steps
                .push(StepRecord::new(step.name, step.occurrence, value.to_vec()));
            Ok(())
        }))
    }

    fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
        ready(Ok(self.with(key, |entry, _| match entry {
            Some(e) if matches!(e.state, State::Claimed { .. } | State::Free) => e.steps.clone(),
            _ => Vec::new(),
        })))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_written_outside_the_crate_passes_the_conformance_suite() {
    jobguard::testing::check_store(|| async { MapStore::default() }).await;
}

#[jobguard::idempotent(key = order, scope = "tests.outside")]
async fn charge(order: &str) -> Result<Option<u64>, Error> {
    Ok(jobguard::fence())
}

#[tokio::test]
async fn it_serves_an_idempotent_job() {
    let runtime = Runtime::builder().store(MapStore::default()).build();
    assert_eq!(runtime.scope(charge("order-A")).await, Ok(Some(1)));
    assert_eq!(
        runtime.scope(charge("order-A")).await,
        Ok(Some(1)),
        "replayed"
    );
}

/// A store that does not keep its promises fails the suite, naming the check.
#[derive(Clone, Default)]
struct Forgetful(MapStore);

impl Store for Forgetful {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        self.0.claim(key, token, options)
    }
    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        _: &'a [u8],
        _: Duration,
    ) -> StoreFuture<'a, ()> {
        // Completes nothing: the key stays claimed.
        self.0.renew(key, token, Duration::from_secs(60))
    }
    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        self.0.release(key, token)
    }
    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        self.0.renew(key, token, lease)
    }
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.0.lookup(key)
    }
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        self.0.forgive(key)
    }
    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
        self.0.lettered(key)
    }
    fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
        self.0.inspect(key)
    }
    fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        self.0.forget(key)
    }
    fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32> {
        self.0.attempted(key, token)
    }
    fn record_step<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        step: StepKey<'a>,
        value: &'a [u8],
    ) -> StoreFuture<'a, ()> {
        self.0.record_step(key, token, step, value)
    }
    fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
        self.0.steps(key)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[should_panic(
    expected = "check_store: the store fails `a_claim_is_exclusive_and_a_completed_record_replays`"
)]
async fn a_store_that_breaks_the_contract_fails_the_suite_by_name() {
    jobguard::testing::check_store(|| async { Forgetful::default() }).await;
}
