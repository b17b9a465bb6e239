//! The in-memory store: the embedded default, for one process.

use super::{Claim, Store, StoreFuture, StoreKey};
use crate::Error;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
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

type Map = HashMap<Id, Entry, BuildHasherDefault<PreHashed>>;
type Shard = Mutex<Map>;

struct Inner {
    shards: Box<[Shard]>,
    per_shard: usize,
    /// Hashes each `(scope, key)` once per operation: the hash picks the shard and is the one
    /// the shard's map files the record under (see [`PreHashed`]).
    hasher: RandomState,
}

/// A record's `(scope, key)`, as the map keeps it: one allocation holding the scope then the key,
/// the scope's length to split them again, and the hash computed from the pair.
struct Id {
    hash: u64,
    scope_len: usize,
    text: Box<str>,
}

/// An operation's `(scope, key)`, borrowed, with its hash: what a lookup probes the map with,
/// so nothing is copied until a claim inserts a new record.
struct Probe<'a> {
    hash: u64,
    key: StoreKey<'a>,
}

/// What an [`Id`] and a [`Probe`] have in common, so a map keyed by `Id` can be searched with a
/// `Probe` (`Id: Borrow<dyn AsId>`). Two ids are equal when both their scopes and their keys
/// are, so no two `(scope, key)` pairs share a record, whatever characters they contain.
trait AsId {
    fn pre_hash(&self) -> u64;
    fn parts(&self) -> (&str, &str);
}

impl AsId for Id {
    fn pre_hash(&self) -> u64 {
        self.hash
    }
    fn parts(&self) -> (&str, &str) {
        self.text.split_at(self.scope_len)
    }
}

impl AsId for Probe<'_> {
    fn pre_hash(&self) -> u64 {
        self.hash
    }
    fn parts(&self) -> (&str, &str) {
        (self.key.scope, self.key.key)
    }
}

impl Probe<'_> {
    fn as_id(&self) -> &dyn AsId {
        self
    }

    fn to_id(&self) -> Id {
        let mut text = String::with_capacity(self.key.scope.len() + self.key.key.len());
        text.push_str(self.key.scope);
        text.push_str(self.key.key);
        Id {
            hash: self.hash,
            scope_len: self.key.scope.len(),
            text: text.into_boxed_str(),
        }
    }
}

// `Id`'s `Hash` and `Eq` are those of `dyn AsId`, as `Borrow` requires.
impl Hash for dyn AsId + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.pre_hash());
    }
}

impl PartialEq for dyn AsId + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn AsId + '_ {}

impl<'a> Borrow<dyn AsId + 'a> for Id {
    fn borrow(&self) -> &(dyn AsId + 'a) {
        self
    }
}

impl Hash for Id {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Id {}

/// The shards' hasher: an id hashes as the keyed hash [`Inner::hasher`] computed once for it, so
/// a lookup, an insert or a resize never hashes the scope and key again.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("the map's keys hash as one u64")
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

struct Entry {
    expires: Instant,
    state: State,
    fingerprint: Option<Box<str>>,
}

enum State {
    Claimed { token: Box<str> },
    Completed { record: Box<[u8]> },
}

impl Entry {
    fn claimed(token: &str, fingerprint: Option<&str>, expires: Instant) -> Self {
        Entry {
            expires,
            state: State::Claimed {
                token: token.into(),
            },
            fingerprint: fingerprint.map(Box::from),
        }
    }

    /// `token` holds a live claim on this record.
    fn held_by(&self, token: &str, now: Instant) -> bool {
        matches!(&self.state, State::Claimed { token: t } if **t == *token) && self.expires > now
    }
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
                shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
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
        let (probe, shard) = self.locate(key);
        let shard = lock(shard);
        match shard.get(probe.as_id()) {
            Some(Entry {
                state: State::Completed { record },
                expires,
                ..
            }) if *expires > now => Some(record.to_vec()),
            _ => None,
        }
    }

    /// `key`'s hash, computed once, and its shard. The shard is picked by bits 32–35 of the
    /// hash, which the shard's map leaves alone (it places a record by the low bits and tags it
    /// with the top seven), so the records of one shard still spread over its whole table.
    fn locate<'k>(&self, key: StoreKey<'k>) -> (Probe<'k>, &Shard) {
        let hash = self.inner.hasher.hash_one(key);
        let shard = &self.inner.shards[(hash >> 32) as usize % SHARDS];
        (Probe { hash, key }, shard)
    }

    fn claim_now(
        &self,
        key: StoreKey<'_>,
        token: &str,
        fingerprint: Option<&str>,
        lease: Duration,
    ) -> Result<Claim, Error> {
        let now = Instant::now();
        let (probe, shard) = self.locate(key);
        let mut shard = lock(shard);
        if let Some(entry) = shard.get_mut(probe.as_id()) {
            if entry.expires > now {
                if let (Some(theirs), Some(ours)) = (&entry.fingerprint, fingerprint)
                    && **theirs != *ours
                {
                    return Ok(Claim::KeyReused);
                }
                return Ok(match &entry.state {
                    State::Completed { record } => Claim::Completed(record.to_vec()),
                    State::Claimed { .. } => Claim::InProgress {
                        retry_in: entry.expires - now,
                    },
                });
            }
            // Expired: the key is free again. The new claim takes the record's place (and keeps
            // its id), so it needs no room.
            *entry = Entry::claimed(token, fingerprint, now + lease);
            return Ok(Claim::Acquired);
        }
        if shard.len() >= self.inner.per_shard {
            shard.retain(|_, e| e.expires > now);
            if shard.len() >= self.inner.per_shard {
                return Err(Error::Store(format!(
                    "memory store full: {} live records; raise MemoryStore::with_capacity or shorten the ttl",
                    self.capacity()
                )));
            }
        }
        // A second probe of the table, with the hash already computed.
        shard.insert(
            probe.to_id(),
            Entry::claimed(token, fingerprint, now + lease),
        );
        Ok(Claim::Acquired)
    }

    /// Runs `f` on `key`'s record, with the time read once for the operation, if `token` holds a
    /// live claim on it.
    fn with_claim<R>(
        &self,
        key: StoreKey<'_>,
        token: &str,
        f: impl FnOnce(&mut Entry, Instant) -> R,
    ) -> Option<R> {
        let now = Instant::now();
        let (probe, shard) = self.locate(key);
        let mut shard = lock(shard);
        match shard.get_mut(probe.as_id()) {
            Some(entry) if entry.held_by(token, now) => Some(f(entry, now)),
            _ => None,
        }
    }

    fn release_now(&self, key: StoreKey<'_>, token: &str) {
        let now = Instant::now();
        let (probe, shard) = self.locate(key);
        let mut shard = lock(shard);
        if shard
            .get(probe.as_id())
            .is_some_and(|e| e.held_by(token, now))
        {
            shard.remove(probe.as_id());
        }
    }
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
        let done = self.with_claim(key, token, |entry, now| {
            entry.state = State::Completed {
                record: record.into(),
            };
            entry.expires = now + ttl;
        });
        Box::pin(std::future::ready(done.ok_or(Error::LeaseLost)))
    }

    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        self.release_now(key, token);
        Box::pin(std::future::ready(Ok(())))
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        let done = self.with_claim(key, token, |entry, now| entry.expires = now + lease);
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

    #[tokio::test]
    async fn no_two_scope_key_pairs_share_a_record() {
        let s = MemoryStore::new();
        let pairs = [
            ("ab", "c"),
            ("a", "bc"),
            ("abc", ""),
            ("", "abc"),
            ("a\0", "bc"),
        ];
        for (i, &(scope, key)) in pairs.iter().enumerate() {
            let k = StoreKey { scope, key };
            assert_eq!(claim(&s, k, "t"), Claim::Acquired, "{scope:?} {key:?}");
            s.complete(k, "t", i.to_string().as_bytes(), LEASE)
                .await
                .unwrap();
        }
        for (i, &(scope, key)) in pairs.iter().enumerate() {
            let k = StoreKey { scope, key };
            assert_eq!(s.completed(k), Some(i.to_string().into_bytes()));
        }
        assert_eq!(s.len(), pairs.len());
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_record_is_reclaimed_in_place_even_when_full() {
        let s = MemoryStore::with_capacity(SHARDS); // one record per shard
        assert_eq!(claim(&s, K, "a"), Claim::Acquired);
        s.complete(K, "a", b"x", Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(s.completed(K), Some(b"x".to_vec()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(s.completed(K), None, "expired");
        assert_eq!(claim(&s, K, "b"), Claim::Acquired);
        assert_eq!(s.len(), 1);
        assert_eq!(s.complete(K, "a", b"y", LEASE).await, Err(Error::LeaseLost));
        s.renew(K, "b", Duration::from_secs(60)).await.unwrap();
        tokio::time::advance(LEASE).await;
        assert!(
            matches!(claim(&s, K, "c"), Claim::InProgress { retry_in } if retry_in == LEASE),
            "renewed from now"
        );
        s.release(K, "c").await.unwrap();
        assert_eq!(s.len(), 1, "a non-holder's release is a no-op");
        s.release(K, "b").await.unwrap();
        assert!(s.is_empty());
        assert_eq!(claim(&s, K, "d"), Claim::Acquired);
    }
}
