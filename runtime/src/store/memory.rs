//! The in-memory store: the embedded default, for one process.

use super::{Claim, Store, StoreFuture, StoreKey};
use crate::Error;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

const SHARDS: usize = 16;
/// The default bound: records (claims and completed results) kept at once.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// An idempotency store in this process's memory. `Clone` shares state.
///
/// Sharded (16 locks, each held for a map operation only) and bounded. At capacity it first
/// evicts expired records; it never evicts a live claim or a completed record before its TTL,
/// and answers a claim it has no room for with [`Error::Store`] instead: a full store fails
/// closed rather than forgetting that a job already ran. TTLs and leases read `tokio::time`.
///
/// It protects one process. Workers in several processes need a shared store such as
/// `RedisStore`.
///
/// ```
/// use jobguard::store::memory::MemoryStore;
/// use jobguard::{Claim, Store, StoreKey};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), jobguard::Error> {
/// let store = MemoryStore::new();
/// let key = StoreKey { scope: "payments.charge", key: "order-A" };
/// assert_eq!(store.claim(key, "t1", None, Duration::from_secs(30)).await?, Claim::Acquired);
/// assert!(matches!(store.claim(key, "t2", None, Duration::from_secs(30)).await?, Claim::InProgress { .. }));
/// store.complete(key, "t1", b"{}", Duration::from_secs(60)).await?;
/// assert_eq!(store.claim(key, "t3", None, Duration::from_secs(30)).await?, Claim::Completed(b"{}".to_vec()));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

type Map = HashMap<(String, String), Entry>;
type Shard = Mutex<Map>;

struct Inner {
    shards: Box<[Shard]>,
    per_shard: usize,
    hasher: RandomState,
}

struct Entry {
    state: State,
    expires: Instant,
    fingerprint: Option<String>,
}

enum State {
    Claimed { token: String },
    Completed { record: Vec<u8> },
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store holding up to [`DEFAULT_CAPACITY`] records.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A store holding up to `capacity` records (at least one per shard).
    pub fn with_capacity(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                per_shard,
                hasher: RandomState::new(),
            }),
        }
    }

    /// The most records kept at once.
    pub fn capacity(&self) -> usize {
        self.inner.per_shard * SHARDS
    }

    /// Records kept now, expired ones not yet evicted included.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// `true` when no record is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The completed record for `key`, if there is a live one: what a replay would return.
    pub fn completed(&self, key: StoreKey<'_>) -> Option<Vec<u8>> {
        let now = Instant::now();
        let shard = lock(self.shard(key));
        match shard.get(&owned(key)) {
            Some(Entry {
                state: State::Completed { record },
                expires,
                ..
            }) if *expires > now => Some(record.clone()),
            _ => None,
        }
    }

    fn shard(&self, key: StoreKey<'_>) -> &Shard {
        let mut h = self.inner.hasher.build_hasher();
        key.scope.hash(&mut h);
        key.key.hash(&mut h);
        &self.inner.shards[(h.finish() as usize) % SHARDS]
    }

    fn claim_now(
        &self,
        key: StoreKey<'_>,
        token: &str,
        fingerprint: Option<&str>,
        lease: Duration,
    ) -> Result<Claim, Error> {
        let now = Instant::now();
        let mut shard = lock(self.shard(key));
        let id = owned(key);
        if let Some(entry) = shard.get(&id).filter(|e| e.expires > now) {
            if let (Some(theirs), Some(ours)) = (&entry.fingerprint, fingerprint)
                && theirs != ours
            {
                return Ok(Claim::KeyReused);
            }
            return Ok(match &entry.state {
                State::Completed { record } => Claim::Completed(record.clone()),
                State::Claimed { .. } => Claim::InProgress {
                    retry_in: entry.expires - now,
                },
            });
        }
        if !shard.contains_key(&id) && shard.len() >= self.inner.per_shard {
            shard.retain(|_, e| e.expires > now);
            if shard.len() >= self.inner.per_shard {
                return Err(Error::Store(format!(
                    "memory store full: {} live records; raise MemoryStore::with_capacity or shorten the ttl",
                    self.capacity()
                )));
            }
        }
        shard.insert(
            id,
            Entry {
                state: State::Claimed {
                    token: token.to_owned(),
                },
                expires: now + lease,
                fingerprint: fingerprint.map(str::to_owned),
            },
        );
        Ok(Claim::Acquired)
    }

    /// Runs `f` on `key`'s entry if `token` holds a live claim on it.
    fn with_claim<R>(
        &self,
        key: StoreKey<'_>,
        token: &str,
        f: impl FnOnce(&mut Map, (String, String)) -> R,
    ) -> Option<R> {
        let now = Instant::now();
        let mut shard = lock(self.shard(key));
        let id = owned(key);
        let holds = matches!(shard.get(&id), Some(Entry { state: State::Claimed { token: t }, expires, .. }) if t == token && *expires > now);
        holds.then(|| f(&mut shard, id))
    }
}

fn owned(key: StoreKey<'_>) -> (String, String) {
    (key.scope.to_owned(), key.key.to_owned())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is one map operation; a panic inside one cannot leave it half-done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store for MemoryStore {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        Box::pin(std::future::ready(self.claim_now(
            key,
            token,
            fingerprint,
            lease,
        )))
    }

    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        let done = self.with_claim(key, token, |shard, id| {
            if let Some(e) = shard.get_mut(&id) {
                e.state = State::Completed {
                    record: record.to_vec(),
                };
                e.expires = Instant::now() + ttl;
            }
        });
        Box::pin(std::future::ready(done.ok_or(Error::LeaseLost)))
    }

    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        self.with_claim(key, token, |shard, id| shard.remove(&id));
        Box::pin(std::future::ready(Ok(())))
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        let done = self.with_claim(key, token, |shard, id| {
            if let Some(e) = shard.get_mut(&id) {
                e.expires = Instant::now() + lease;
            }
        });
        Box::pin(std::future::ready(done.ok_or(Error::LeaseLost)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: StoreKey<'static> = StoreKey {
        scope: "s",
        key: "k",
    };
    const LEASE: Duration = Duration::from_secs(30);

    fn claim(s: &MemoryStore, key: StoreKey<'_>, token: &str) -> Claim {
        s.claim_now(key, token, None, LEASE).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn lease_lapses_and_a_stale_token_cannot_touch_the_successor() {
        let s = MemoryStore::new();
        assert_eq!(claim(&s, K, "old"), Claim::Acquired);
        tokio::time::advance(LEASE).await;
        assert_eq!(claim(&s, K, "new"), Claim::Acquired);
        assert_eq!(
            s.complete(K, "old", b"x", LEASE).await,
            Err(Error::LeaseLost)
        );
        assert_eq!(s.renew(K, "old", LEASE).await, Err(Error::LeaseLost));
        s.release(K, "old").await.unwrap();
        assert!(
            matches!(claim(&s, K, "third"), Claim::InProgress { retry_in } if retry_in == LEASE)
        );
        s.complete(K, "new", b"ok", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(claim(&s, K, "fourth"), Claim::Completed(b"ok".to_vec()));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(claim(&s, K, "fifth"), Claim::Acquired, "ttl honoured");
    }

    #[tokio::test(start_paused = true)]
    async fn full_store_evicts_expired_first_and_never_a_live_record() {
        let s = MemoryStore::with_capacity(SHARDS); // one record per shard
        let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        let mut refused = 0;
        let mut won = Vec::new();
        for k in &keys {
            match s.claim_now(StoreKey { scope: "s", key: k }, "t", None, LEASE) {
                Ok(Claim::Acquired) => won.push(k.clone()),
                Err(Error::Store(_)) => refused += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(!won.is_empty() && won.len() <= SHARDS);
        assert_eq!(
            refused,
            keys.len() - won.len(),
            "no room: refused, not forgotten"
        );
        for k in &won {
            // still held: no live claim was evicted to make room
            assert!(matches!(
                claim(&s, StoreKey { scope: "s", key: k }, "u"),
                Claim::InProgress { .. }
            ));
        }
        tokio::time::advance(LEASE).await;
        // expired claims make room again
        let fresh: usize = keys
            .iter()
            .filter(|k| {
                matches!(
                    s.claim_now(StoreKey { scope: "t", key: k }, "t", None, LEASE),
                    Ok(Claim::Acquired)
                )
            })
            .count();
        assert!(fresh > 0 && fresh <= SHARDS);
    }

    #[tokio::test]
    async fn fingerprints_and_scopes() {
        let s = MemoryStore::new();
        assert_eq!(
            s.claim_now(K, "a", Some("f1"), LEASE).unwrap(),
            Claim::Acquired
        );
        assert_eq!(
            s.claim_now(K, "b", Some("f2"), LEASE).unwrap(),
            Claim::KeyReused
        );
        assert!(matches!(
            s.claim_now(K, "b", Some("f1"), LEASE).unwrap(),
            Claim::InProgress { .. }
        ));
        assert_eq!(
            s.claim_now(
                StoreKey {
                    scope: "other",
                    key: "k"
                },
                "c",
                None,
                LEASE
            )
            .unwrap(),
            Claim::Acquired
        );
    }
}
