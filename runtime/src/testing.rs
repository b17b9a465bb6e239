//! The conformance suite of [`Store`]: what every store must do, checked the same way on
//! [`MemoryStore`](crate::MemoryStore), a `redis-server`, a Redis Cluster and `PgStore`, and on
//! a store of your own:
//!
//! ```no_run
//! # async fn demo() {
//! // In a test of your store (`#[tokio::test(flavor = "multi_thread")]`):
//! jobguard::testing::check_store(|| async { jobguard::MemoryStore::new() }).await;
//! # }
//! ```
//!
//! [`check_store`] runs every check, each on a fresh store, prints each check's name as it
//! starts, and panics naming the check that failed. The checks: an exclusive claim; replay of a
//! completed record; release, renew and completion only by the token that holds the claim;
//! leases that lapse on time; fingerprints; isolated scopes and keys (hashed, escaped, long,
//! binary); claims racing for the same keys, and [`Idempotent`] deliveries racing; generations
//! that only grow and a release that keeps them; abandoned claims taken over and counted until
//! the key is poisoned and refused for its TTL, with its dead letter's role handed out until
//! [`Store::lettered`]; `forgive`, `lookup`, `inspect` and `forget`; a job's count of attempts;
//! and its durable steps (recorded only by the claim's holder, read back with
//! the next claim, gone with the job's completion, `forgive`, `forget` and its TTL).
//!
//! They run on the real clock, since a server keeps its leases on its own: where a lease must
//! lapse it is short (300 ms), and the checks poll with a deadline rather than sleep for a
//! guessed time. The whole suite takes a few seconds. A store whose server can say what it
//! keeps (a key's remaining time to live, the keys written) implements [`Backend`] and runs
//! [`check_backend`], which checks that too.
//!
//! [`PlainClaim`] and [`Claim`] are for tests that care what a claim found, not which claim it
//! was.

use crate::Error;
use crate::idempotency::Idempotent;
use crate::store::{
    ClaimOptions, Claimed, KeyInfo, KeyState, Letter, StepKey, StepRecord, Store, StoreFuture,
    StoreKey,
};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Runs every conformance check on a fresh store from `make`, one after another; see the
/// [module docs](self). Panics naming the check that failed.
pub async fn check_store<S, F, Fut>(make: F)
where
    S: Store + Clone + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    check_backend(|| async { Plain(make().await) }).await;
}

/// [`check_store`] on a [`Backend`], whose server's view of what it keeps is checked too.
pub async fn check_backend<B, F, Fut>(make: F)
where
    B: Backend + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = B>,
{
    macro_rules! each {
        ($($check:ident),* $(,)?) => {$(
            run_one(stringify!($check), make().await, |b| {
                Box::pin(async move { $check(&b).await })
            })
            .await;
        )*};
    }
    each!(
        a_claim_is_exclusive_and_a_completed_record_replays,
        release_frees_the_key_only_for_its_holder,
        renew_extends_the_lease_only_for_its_holder,
        a_lease_lapses_after_its_duration_and_not_before,
        a_stale_token_can_neither_complete_release_nor_renew_its_successors_claim,
        a_differing_fingerprint_is_key_reused_and_a_missing_one_never_mismatches,
        hashed_keys_and_scopes_are_isolated,
        a_clone_shares_the_store,
        two_hundred_keys_eight_concurrent_claimers_one_winner_each,
        eight_concurrent_deliveries_of_two_hundred_keys_run_each_body_once,
        generations_grow_with_every_claim_and_a_release_keeps_them,
        an_abandoned_claim_is_taken_over_and_counted_until_the_key_is_poisoned,
        a_crash_limit_of_zero_never_poisons,
        a_poisoned_key_is_refused_for_its_ttl,
        a_poisoned_keys_letter_is_handed_out_until_it_is_confirmed,
        a_lookup_reads_only_a_completed_record_and_claims_nothing,
        forgive_frees_a_poisoned_key_and_its_crashes_count_again_from_zero,
        forgive_leaves_a_completed_record_and_a_live_claim_as_they_are,
        a_forgive_racing_claims_of_a_poisoned_key_lets_one_of_them_acquire_it,
        a_forgive_racing_the_takeover_of_a_lapsed_claim_never_undoes_it,
        inspect_tells_each_state_and_forget_frees_the_key,
        attempts_are_counted_over_every_claim,
        steps_are_recorded_by_the_claims_holder_alone_and_resume_with_the_next_claim,
        a_completed_forgiven_or_forgotten_job_has_no_steps,
        steps_expire_with_their_job,
    );
}

/// Runs one check in a task of its own, so that its panic is caught and named.
async fn run_one<B: Backend + 'static>(
    name: &str,
    backend: B,
    check: impl FnOnce(B) -> Pin<Box<dyn Future<Output = ()> + Send>>,
) {
    println!("check_store: {name}");
    if let Err(error) = tokio::spawn(check(backend)).await {
        let why = match error.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".to_owned()),
            Err(error) => error.to_string(),
        };
        panic!("check_store: the store fails `{name}`: {why}");
    }
}

/// A store under test, and what its server can say about what it keeps.
pub trait Backend: Send + Sync {
    /// The store.
    type Store: Store + Clone + 'static;

    /// A handle on the store (a clone shares it).
    fn store(&self) -> Self::Store;

    /// The time the server keeps `key` for, in milliseconds (`-2` when the key is absent), or
    /// `None` (the default) when the backend cannot tell. A claim is kept for the longer of
    /// its lease and its TTL (so that a lapsed one is found and counted), a completed record
    /// for its TTL.
    fn pttl(&self, key: StoreKey<'_>) -> impl Future<Output = Option<i64>> + Send {
        let _ = key;
        std::future::ready(None)
    }

    /// Every key the store wrote, as the server names them, or `None` (the default) when the
    /// backend cannot tell.
    fn keys(&self) -> impl Future<Output = Option<Vec<String>>> + Send {
        std::future::ready(None)
    }
}

/// A store without a view of what it keeps.
struct Plain<S>(S);

impl<S: Store + Clone + 'static> Backend for Plain<S> {
    type Store = S;

    fn store(&self) -> S {
        self.0.clone()
    }
}

/// What a claim found, without the claim's number and crash count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller now holds the key.
    Acquired,
    /// The job already completed: its stored result.
    Completed(Vec<u8>),
    /// Another claim holds the key, for `retry_in` at most.
    InProgress {
        /// The time left on the other claim's lease.
        retry_in: Duration,
    },
    /// The key is claimed or completed with another fingerprint.
    KeyReused,
}

/// [`Store::claim`] without a crash limit, answering what it found as a [`Claim`]:
/// `store.claim_plain(key, token, fingerprint, lease)`. On every store.
pub trait PlainClaim: Store {
    /// Claims `key` for `lease` with `fingerprint`, the default TTL and no crash limit.
    fn claim_plain<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        let options = ClaimOptions::new(lease).fingerprint(fingerprint).crashes(0);
        let claim = self.claim(key, token, options);
        Box::pin(async move { Claim::of(claim.await?) })
    }
}

impl Claim {
    /// What `claimed` found; a poisoned key is [`Error::Poisoned`].
    pub fn of(claimed: Claimed) -> Result<Claim, Error> {
        Ok(match claimed {
            Claimed::Acquired { .. } => Claim::Acquired,
            Claimed::Completed(record) => Claim::Completed(record),
            Claimed::InProgress { retry_in } => Claim::InProgress { retry_in },
            Claimed::KeyReused => Claim::KeyReused,
            Claimed::Poisoned { crashes, .. } => return Err(Error::Poisoned { crashes }),
        })
    }
}

impl<S: Store + ?Sized> PlainClaim for S {}

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(300);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.conformance",
        key,
    }
}

/// `lookup` answers a completed record's result (with or without a fingerprint, binary bytes
/// unchanged) and `None` for a key that is free, claimed or released; it claims nothing: a
/// claim it looked at stays in progress, and the next claim of a released key is numbered as if
/// no lookup had happened.
pub async fn a_lookup_reads_only_a_completed_record_and_claims_nothing<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("looked-up");
    assert_eq!(store.lookup(k).await, Ok(None), "a free key");
    let Ok(Claimed::Acquired { generation, .. }) =
        store.claim(k, "t1", ClaimOptions::new(LONG)).await
    else {
        panic!("the first claim acquires");
    };
    assert_eq!(store.lookup(k).await, Ok(None), "a claimed key");
    assert!(matches!(
        store.claim_plain(k, "t2", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    let record = b"\x00{\"ok\":1}\xff:n";
    store.complete(k, "t1", record, DAY).await.unwrap();
    assert_eq!(store.lookup(k).await, Ok(Some(record.to_vec())));
    assert_eq!(
        store.claim_plain(k, "t2", None, LONG).await,
        Ok(Claim::Completed(record.to_vec()))
    );

    // With a fingerprint kept beside the result.
    let f = key("looked-up-fp");
    assert_eq!(
        store.claim_plain(f, "t1", Some("fp:12"), LONG).await,
        Ok(Claim::Acquired)
    );
    store.complete(f, "t1", b"r", DAY).await.unwrap();
    assert_eq!(store.lookup(f).await, Ok(Some(b"r".to_vec())));

    // An empty result is a result.
    let e = key("looked-up-empty");
    assert_eq!(
        store.claim_plain(e, "t1", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.complete(e, "t1", b"", DAY).await.unwrap();
    assert_eq!(store.lookup(e).await, Ok(Some(Vec::new())));

    // A released key: nothing to read, and the lookup took no claim of its own.
    let r = key("looked-up-released");
    let Ok(Claimed::Acquired { generation: g1, .. }) =
        store.claim(r, "t1", ClaimOptions::new(LONG)).await
    else {
        panic!("the first claim acquires");
    };
    store.release(r, "t1").await.unwrap();
    assert_eq!(store.lookup(r).await, Ok(None), "a released key");
    let Ok(Claimed::Acquired { generation: g2, .. }) =
        store.claim(r, "t3", ClaimOptions::new(LONG)).await
    else {
        panic!("a released key is claimed again");
    };
    if generation > 0 {
        assert_eq!(g2, g1 + 1, "the lookup was not a claim");
    }
}

/// A claim is exclusive and reports the holder's lease; a completed record replays to every
/// token, kept for the TTL, and binary records survive unchanged.
pub async fn a_claim_is_exclusive_and_a_completed_record_replays<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("order-A");
    assert_eq!(
        store.claim_plain(k, "t1", None, LONG).await,
        Ok(Claim::Acquired)
    );
    let Ok(Claim::InProgress { retry_in }) = store.claim_plain(k, "t2", None, LONG).await else {
        panic!("a second claim must find the first in progress");
    };
    assert!(
        retry_in > Duration::from_secs(58) && retry_in <= LONG,
        "{retry_in:?}"
    );
    // A plain claim's key is kept for the default TTL (a day), past its lease: a claim whose
    // lease lapses is there for the next claim to find and count.
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl > 86_000_000 && pttl <= 86_400_000, "{pttl}");
    }

    store
        .complete(k, "t1", br#"{"v":1,"ok":7}"#, DAY)
        .await
        .unwrap();
    for token in ["t1", "t2", "t3"] {
        assert_eq!(
            store.claim_plain(k, token, None, LONG).await,
            Ok(Claim::Completed(br#"{"v":1,"ok":7}"#.to_vec()))
        );
    }
    // The record is kept for the TTL, not the lease.
    if let Some(ttl) = b.pttl(k).await {
        assert!(ttl > 86_000_000 && ttl <= 86_400_000, "{ttl}");
    }
    // Binary records survive unchanged.
    let bk = key("binary");
    let bytes: Vec<u8> = (0..=255).collect();
    assert_eq!(
        store.claim_plain(bk, "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.complete(bk, "t", &bytes, DAY).await.unwrap();
    assert_eq!(
        store.claim_plain(bk, "u", None, LONG).await,
        Ok(Claim::Completed(bytes))
    );
}

/// `release` frees the key for its holder only, never for a token that the holder's starts
/// with or that starts with the holder's.
pub async fn release_frees_the_key_only_for_its_holder<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("k");
    assert_eq!(
        store.claim_plain(k, "t1", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.release(k, "intruder").await.unwrap();
    // Nor a token that the holder's starts with, or one that starts with the holder's.
    for other in ["t", "t1:", "t10", ""] {
        store.release(k, other).await.unwrap();
        assert_eq!(store.renew(k, other, LONG).await, Err(Error::LeaseLost));
        assert_eq!(
            store.complete(k, other, b"r", DAY).await,
            Err(Error::LeaseLost)
        );
    }
    assert!(matches!(
        store.claim_plain(k, "t2", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    store.release(k, "t1").await.unwrap();
    if let Some(pttl) = b.pttl(k).await {
        // The key is free, and keeps its history (generation, crash count) for the claim's TTL.
        assert!(pttl > 59_000, "{pttl}");
    }
    assert_eq!(
        store.claim_plain(k, "t2", None, LONG).await,
        Ok(Claim::Acquired)
    );
    // Releasing a key nobody holds is not an error.
    store.release(key("never-claimed"), "t").await.unwrap();
}

/// `renew` extends the lease for its holder only.
pub async fn renew_extends_the_lease_only_for_its_holder<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("k");
    // A TTL no longer than the lease: the key is kept for the lease, and a renew extends that.
    let options = ClaimOptions::new(SHORT).ttl(SHORT);
    assert!(matches!(
        store.claim(k, "t1", options).await,
        Ok(Claimed::Acquired { .. })
    ));
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl <= 300, "{pttl}");
    }
    store.renew(k, "t1", LONG).await.unwrap();
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl > 59_000);
    }
    assert_eq!(store.renew(k, "t2", SHORT).await, Err(Error::LeaseLost));
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl > 59_000, "a stranger's renew changes nothing");
    }
    // The lease is really extended: the key is still held well after the first lease.
    let Ok(Claim::InProgress { retry_in }) = store.claim_plain(k, "t3", None, SHORT).await else {
        panic!("renewed");
    };
    assert!(retry_in > Duration::from_secs(59), "{retry_in:?}");
    assert_eq!(
        store.renew(key("absent"), "t1", LONG).await,
        Err(Error::LeaseLost)
    );
}

/// Claims `k` until it is acquired; panics after `within`. Returns when it was acquired.
async fn claim_when_free<S: Store>(store: &S, k: StoreKey<'_>, within: Duration) -> Instant {
    let options = ClaimOptions::new(LONG).crashes(0);
    let got = claimed_when_free(store, k, "successor", options, within).await;
    assert!(
        matches!(got, Claimed::Acquired { .. }),
        "unexpected claim: {got:?}"
    );
    Instant::now()
}

/// Claims `k` with `options` until the claim is not [`Claimed::InProgress`] (another's lease
/// runs); panics after `within`. Returns what the claim found.
pub async fn claimed_when_free<S: Store>(
    store: &S,
    k: StoreKey<'_>,
    token: &str,
    options: ClaimOptions<'_>,
    within: Duration,
) -> Claimed {
    let deadline = Instant::now() + within;
    loop {
        match store.claim(k, token, options).await {
            Ok(Claimed::InProgress { retry_in }) => {
                assert!(Instant::now() < deadline, "still held after {within:?}");
                tokio::time::sleep(retry_in.min(Duration::from_millis(20))).await;
            }
            Ok(other) => return other,
            Err(e) => panic!("unexpected claim: {e:?}"),
        }
    }
}

/// A lease lapses after its duration, and not before.
pub async fn a_lease_lapses_after_its_duration_and_not_before<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("k");
    let before = Instant::now();
    assert_eq!(
        store.claim_plain(k, "t1", None, SHORT).await,
        Ok(Claim::Acquired)
    );
    let Ok(Claim::InProgress { retry_in }) = store.claim_plain(k, "t2", None, SHORT).await else {
        panic!("held");
    };
    assert!(
        retry_in <= SHORT && retry_in > Duration::ZERO,
        "{retry_in:?}"
    );
    let acquired = claim_when_free(&store, k, Duration::from_secs(5)).await;
    let held_for = acquired - before;
    // Redis expires at millisecond precision: allow 1 ms of rounding.
    assert!(held_for >= SHORT - Duration::from_millis(1), "{held_for:?}");
    assert!(held_for < SHORT + Duration::from_secs(2), "{held_for:?}");
}

/// A worker whose lease lapsed can neither complete, release nor renew its successor's claim;
/// once completed, no token holds a claim.
pub async fn a_stale_token_can_neither_complete_release_nor_renew_its_successors_claim<
    B: Backend,
>(
    b: &B,
) {
    let store = b.store();
    let k = key("k");
    assert_eq!(
        store.claim_plain(k, "stale", None, SHORT).await,
        Ok(Claim::Acquired)
    );
    claim_when_free(&store, k, Duration::from_secs(5)).await; // "successor" holds it now

    assert_eq!(
        store.complete(k, "stale", b"stale result", DAY).await,
        Err(Error::LeaseLost)
    );
    assert_eq!(store.renew(k, "stale", DAY).await, Err(Error::LeaseLost));
    store.release(k, "stale").await.unwrap();
    // The successor's claim is untouched: still held, with its own lease.
    assert!(matches!(
        store.claim_plain(k, "third", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl > 59_000);
    }
    store.renew(k, "successor", LONG).await.unwrap();
    store
        .complete(k, "successor", b"result", DAY)
        .await
        .unwrap();

    // Once completed, no token holds a claim: not even the one that completed it.
    for token in ["stale", "successor"] {
        assert_eq!(
            store.complete(k, token, b"overwrite", DAY).await,
            Err(Error::LeaseLost)
        );
        assert_eq!(store.renew(k, token, SHORT).await, Err(Error::LeaseLost));
        store.release(k, token).await.unwrap();
    }
    assert_eq!(
        store.claim_plain(k, "reader", None, LONG).await,
        Ok(Claim::Completed(b"result".to_vec()))
    );
    assert_eq!(
        store.complete(key("absent"), "stale", b"x", DAY).await,
        Err(Error::LeaseLost)
    );
}

/// A differing fingerprint is `KeyReused`, claimed or completed; a missing one never
/// mismatches; `n` and the empty string are fingerprints like any other.
pub async fn a_differing_fingerprint_is_key_reused_and_a_missing_one_never_mismatches<
    B: Backend,
>(
    b: &B,
) {
    let store = b.store();
    let k = key("k");
    assert_eq!(
        store.claim_plain(k, "t1", Some("fp-a"), LONG).await,
        Ok(Claim::Acquired)
    );
    // While claimed:
    assert_eq!(
        store.claim_plain(k, "t2", Some("fp-b"), LONG).await,
        Ok(Claim::KeyReused)
    );
    assert!(matches!(
        store.claim_plain(k, "t2", Some("fp-a"), LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    assert!(matches!(
        store.claim_plain(k, "t2", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    // Once completed, the fingerprint is kept with the record:
    store.complete(k, "t1", b"r", DAY).await.unwrap();
    assert_eq!(
        store.claim_plain(k, "t2", Some("fp-b"), LONG).await,
        Ok(Claim::KeyReused)
    );
    assert_eq!(
        store.claim_plain(k, "t2", Some("fp-a"), LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    assert_eq!(
        store.claim_plain(k, "t2", None, LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    // A record stored without a fingerprint matches any.
    let n = key("no-fp");
    assert_eq!(
        store.claim_plain(n, "t1", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.complete(n, "t1", b"r", DAY).await.unwrap();
    assert_eq!(
        store.claim_plain(n, "t2", Some("fp-z"), LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    // A fingerprint that reads like the "none" marker is still a fingerprint.
    let m = key("marker-fp");
    assert_eq!(
        store.claim_plain(m, "t1", Some("n"), LONG).await,
        Ok(Claim::Acquired)
    );
    assert_eq!(
        store.claim_plain(m, "t2", Some("1:n"), LONG).await,
        Ok(Claim::KeyReused)
    );
    // An empty fingerprint is a fingerprint, not an absent one.
    let e = key("empty-fp");
    assert_eq!(
        store.claim_plain(e, "t1", Some(""), LONG).await,
        Ok(Claim::Acquired)
    );
    assert_eq!(
        store.claim_plain(e, "t2", Some("x"), LONG).await,
        Ok(Claim::KeyReused)
    );
}

/// Pairs that a careless `scope:key` join or a hash of only some keys would collide (a store
/// that keeps long or unprintable keys as a SHA-256 of them, as the built-in ones do, must keep
/// them apart from a key written as such a digest).
pub fn tricky_pairs() -> Vec<(String, String)> {
    let hex = |key: &str| {
        use sha2::{Digest, Sha256};
        Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let long = "x".repeat(201);
    let long_digest_lookalike = format!("#sha256:{}", hex(&long));
    let mut pairs: Vec<(&str, String)> = vec![
        ("a", "b:c".into()),
        ("a:b", "c".into()),
        ("a%3Ab", "c".into()),
        ("a", "%3Ab:c".into()),
        ("s", "".into()),
        ("s", " ".into()),
        ("s", "  ".into()),
        ("s", "\t".into()),
        ("s", "\0".into()),
        ("s", "#".into()),
        ("s", "##".into()),
        ("s", "#sha256:".into()),
        ("s", long.clone()),
        ("s", long[..200].into()),
        ("s", long_digest_lookalike),
        ("s", "café".into()),
        ("s", "cafe".into()),
        ("s", "k".into()),
        ("s2", "k".into()),
        ("", "s:k".into()),
        ("s", "k ".into()),
        ("s", "k\n".into()),
        ("s", "K".into()),
    ];
    // The hex of a hashed key, written as a plain key.
    pairs.push(("s", hex(" ")));
    pairs.into_iter().map(|(s, k)| (s.to_owned(), k)).collect()
}

/// Every tricky `(scope, key)` pair is claimed independently; on a server, each is its own key,
/// and only long or non-printable keys are stored hashed; completing one scope's key leaves
/// another scope's alone; a long key round-trips.
pub async fn hashed_keys_and_scopes_are_isolated<B: Backend>(b: &B) {
    let store = b.store();
    let pairs = tricky_pairs();
    // Every pair is claimed independently: none finds another's claim.
    for (scope, key) in &pairs {
        let k = StoreKey { scope, key };
        assert_eq!(
            store.claim_plain(k, "t", None, LONG).await,
            Ok(Claim::Acquired),
            "({scope:?}, {key:?})"
        );
    }
    if let Some(keys) = b.keys().await {
        assert_eq!(keys.len(), pairs.len());
        // Long and non-printable keys are stored hashed, and only those.
        for k in &keys {
            let tail = k.splitn(3, ':').nth(2).unwrap();
            assert!(
                tail.len() <= 200 && tail.bytes().all(|b| b.is_ascii_graphic()),
                "{k:?}"
            );
        }
    }
    // Completing one scope's key leaves the other scope's alone.
    let one = StoreKey {
        scope: "s",
        key: "k",
    };
    let two = StoreKey {
        scope: "s2",
        key: "k",
    };
    store.complete(one, "t", b"one", DAY).await.unwrap();
    assert_eq!(
        store.claim_plain(one, "u", None, LONG).await,
        Ok(Claim::Completed(b"one".to_vec()))
    );
    assert!(matches!(
        store.claim_plain(two, "u", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    let long = "x".repeat(5000);
    let hashed = StoreKey {
        scope: "s",
        key: &long,
    };
    assert_eq!(
        store.claim_plain(hashed, "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.complete(hashed, "t", b"long", DAY).await.unwrap();
    assert_eq!(
        store.claim_plain(hashed, "u", None, LONG).await,
        Ok(Claim::Completed(b"long".to_vec()))
    );
}

/// A clone shares the store: a claim through one is seen through the other.
pub async fn a_clone_shares_the_store<B: Backend>(b: &B) {
    let store = b.store();
    let copy = store.clone();
    assert_eq!(
        store.claim_plain(key("k"), "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    assert!(matches!(
        copy.claim_plain(key("k"), "u", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
}

const KEYS: usize = 200;
const RACERS: usize = 8;

/// `RACERS` tasks each claim all `KEYS` keys, each starting at a different key; returns the
/// keys each task won as `(task, key)`.
///
/// No task claims its second key before every task has claimed its first: the tasks' first
/// keys differ, so each task wins its own (more than one winner, however the tasks are
/// scheduled), and all of them are running when the race for the other keys starts. Without
/// that, a task spawned while the others wait for a thread could claim every key alone.
pub async fn race<S: Store + Clone + 'static>(store: &S, tag: &str) -> Vec<(String, usize)> {
    let started = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for c in 0..RACERS {
        let (store, started) = (store.clone(), started.clone());
        let token = format!("{tag}-{c}");
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for i in 0..KEYS {
                let k = (i + c * KEYS / RACERS) % KEYS;
                let key = format!("order-{k}");
                let key = StoreKey {
                    scope: "tests.conformance.race",
                    key: &key,
                };
                let claimed = store
                    .claim_plain(key, &token, None, Duration::from_secs(120))
                    .await;
                if i == 0 {
                    // Before any panic below, so that a failed first claim fails the check
                    // rather than leave the other tasks waiting here; with a deadline, so that
                    // a claim that panicked inside the store cannot leave them waiting forever.
                    tokio::time::timeout(Duration::from_secs(60), started.wait())
                        .await
                        .expect("every claimer made its first claim");
                }
                match claimed {
                    Ok(Claim::Acquired) => won.push((token.clone(), k)),
                    Ok(Claim::InProgress { .. }) => {}
                    other => panic!("claim of {k}: {other:?}"),
                }
                // A store that answers without waiting (in memory) would let one task claim
                // every key before the next starts.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            won
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        won.extend(t.await.expect("claimer task"));
    }
    won
}

/// Exactly one claimer won each of the `KEYS` keys.
pub fn assert_one_winner_per_key(won: &[(String, usize)]) {
    let mut winners: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (who, k) in won {
        winners.entry(*k).or_default().push(who);
    }
    for k in 0..KEYS {
        let w = winners.get(&k).map_or(&[][..], Vec::as_slice);
        assert_eq!(w.len(), 1, "key {k} won by {w:?}");
    }
    assert_eq!(won.len(), KEYS);
}

/// 200 keys, 8 concurrent claimers: exactly one winner per key.
pub async fn two_hundred_keys_eight_concurrent_claimers_one_winner_each<B: Backend>(b: &B) {
    let won = race(&b.store(), "task").await;
    assert_one_winner_per_key(&won);
    // More than one claimer won something: they really raced (each won its first key at least,
    // `race` makes sure of that).
    let distinct: HashSet<_> = won.iter().map(|(w, _)| w).collect();
    assert!(distinct.len() > 1, "{distinct:?}");
}

/// How many times each order's body ran.
pub struct Ledger {
    /// Runs per order.
    pub runs: Vec<AtomicU32>,
}

impl Ledger {
    /// A ledger of `orders` orders, none run.
    pub fn new(orders: usize) -> Arc<Self> {
        Arc::new(Ledger {
            runs: (0..orders).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// Body runs over every order.
    pub fn total(&self) -> u32 {
        self.runs.iter().map(|r| r.load(Ordering::SeqCst)).sum()
    }
}

/// One delivery of `order`: claims its key, or waits up to 30 s for another delivery's run, and
/// runs the body once per order.
async fn charge<S: Store + Clone + 'static>(
    store: &S,
    ledger: &Ledger,
    order: usize,
    who: &str,
) -> Result<String, Error> {
    let key = order.to_string();
    Idempotent::new("tests.conformance.charge", &key)
        .store(store)
        .wait(Duration::from_secs(30))
        .run(async {
            ledger.runs[order].fetch_add(1, Ordering::SeqCst);
            // The side effect takes a moment, so the other deliveries find it in progress.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, Error>(format!("receipt {order} by {who}"))
        })
        .await
}

/// `RACERS` tasks each deliver every order through `Idempotent`, each starting at a
/// different one; returns every delivery's `(order, result)`.
async fn deliver_all<S: Store + Clone + 'static>(
    store: &S,
    ledger: &Arc<Ledger>,
    who: &str,
) -> Vec<(usize, String)> {
    let mut tasks = Vec::new();
    for d in 0..RACERS {
        let (store, ledger, who) = (store.clone(), ledger.clone(), format!("{who}/{d}"));
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..KEYS {
                let order = (i + d * KEYS / RACERS) % KEYS;
                let receipt = charge(&store, &ledger, order, &who)
                    .await
                    .unwrap_or_else(|e| panic!("delivery of {order}: {e}"));
                got.push((order, receipt));
            }
            got
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.extend(t.await.expect("delivery task"));
    }
    got
}

/// 8 concurrent deliveries of 200 keys through `Idempotent`: each body runs once, and every
/// delivery of an order gets the same receipt.
pub async fn eight_concurrent_deliveries_of_two_hundred_keys_run_each_body_once<B: Backend>(b: &B) {
    let store = b.store();
    let ledger = Ledger::new(KEYS);
    let got = deliver_all(&store, &ledger, "task").await;
    assert_eq!(got.len(), KEYS * RACERS);
    for (order, runs) in ledger.runs.iter().enumerate() {
        assert_eq!(runs.load(Ordering::SeqCst), 1, "order {order}");
    }
    let mut receipts: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (order, r) in &got {
        receipts.entry(*order).or_default().insert(r);
    }
    assert_eq!(receipts.len(), KEYS);
    for (order, r) in receipts {
        assert_eq!(r.len(), 1, "order {order} got {r:?}");
    }
}

/// The short lease of the crash checks: an abandoned claim is found lapsed this soon.
const CRASH_LEASE: Duration = Duration::from_millis(200);

/// An acquired claim of `generation` with `crashes`, as [`Shape::plain`] shows it: the checks
/// of generations and crashes leave the count of attempts and the steps to their own checks.
fn acquired(generation: u64, crashes: u32) -> Claimed {
    Claimed::Acquired {
        generation,
        crashes,
        attempts: 0,
        steps: None,
    }
}

/// A claim without its count of attempts and its steps (see [`acquired`]).
trait Shape {
    fn plain(self) -> Self;
}

impl Shape for Claimed {
    fn plain(self) -> Self {
        match self {
            Claimed::Acquired {
                generation,
                crashes,
                ..
            } => acquired(generation, crashes),
            Claimed::Poisoned {
                crashes, letter, ..
            } => Claimed::Poisoned {
                crashes,
                attempts: 0,
                letter,
            },
            other => other,
        }
    }
}

impl Shape for Result<Claimed, Error> {
    fn plain(self) -> Self {
        self.map(Shape::plain)
    }
}

/// Generations count a key's claims from 1 and only grow: a release frees the key and keeps its
/// generation (and crash count), so the next claim is one more. A live claim is in progress, a
/// completed record replays, and a plain `claim` of a released key acquires it.
pub async fn generations_grow_with_every_claim_and_a_release_keeps_them<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("gen");
    let options = ClaimOptions::new(LONG).ttl(DAY);
    assert_eq!(
        store.claim(k, "t1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    let Ok(Claimed::InProgress { retry_in }) = store.claim(k, "t2", options).await else {
        panic!("held");
    };
    assert!(retry_in > Duration::from_secs(58), "{retry_in:?}");
    store.release(k, "t1").await.unwrap();
    assert_eq!(
        store.claim(k, "t2", options).await.plain(),
        Ok(acquired(2, 0))
    );
    // A renewed claim keeps its generation; a stale token's release leaves it alone.
    store.renew(k, "t2", LONG).await.unwrap();
    store.release(k, "t1").await.unwrap();
    assert!(matches!(
        store.claim(k, "t3", options).await,
        Ok(Claimed::InProgress { .. })
    ));
    store.release(k, "t2").await.unwrap();
    assert_eq!(
        store.claim_plain(k, "t3", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.release(k, "t3").await.unwrap();
    assert_eq!(
        store.claim(k, "t4", options).await.plain(),
        Ok(acquired(4, 0))
    );
    store.complete(k, "t4", b"r", DAY).await.unwrap();
    assert_eq!(
        store.claim(k, "t5", options).await,
        Ok(Claimed::Completed(b"r".to_vec()))
    );
    // A fingerprint is checked against a live claim, not against a released key's history.
    let f = key("gen-fp");
    let with = |fp| ClaimOptions::new(LONG).fingerprint(Some(fp));
    assert_eq!(
        store.claim(f, "a", with("x")).await.plain(),
        Ok(acquired(1, 0))
    );
    assert_eq!(store.claim(f, "b", with("y")).await, Ok(Claimed::KeyReused));
    store.release(f, "a").await.unwrap();
    assert_eq!(
        store.claim(f, "b", with("y")).await.plain(),
        Ok(acquired(2, 0))
    );
}

/// A claim whose lease lapsed (its worker died) is taken over by the next claim and counted;
/// the stale holder can no longer complete, renew or release. A release between crashes keeps
/// the count. The claim that finds the crash limit reached poisons the key and holds its letter
/// role, every later one is refused, and a plain claim fails with `Error::Poisoned`. The
/// poisoned key is kept for the claim's TTL.
pub async fn an_abandoned_claim_is_taken_over_and_counted_until_the_key_is_poisoned<B: Backend>(
    b: &B,
) {
    let store = b.store();
    let k = key("crashy");
    let within = Duration::from_secs(5);
    let options = ClaimOptions::new(CRASH_LEASE)
        .crashes(3)
        .ttl(Duration::from_secs(3600));
    assert_eq!(
        store.claim(k, "w1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    // w1 dies: its lease lapses, and w2 takes over, counted.
    let got = claimed_when_free(&store, k, "w2", options, within).await;
    assert_eq!(got.plain(), acquired(2, 1));
    // w1's stale token can do nothing.
    assert_eq!(
        store.complete(k, "w1", b"late", DAY).await,
        Err(Error::LeaseLost)
    );
    assert_eq!(store.renew(k, "w1", LONG).await, Err(Error::LeaseLost));
    store.release(k, "w1").await.unwrap();
    // w2 fails and releases: not a crash, and the count is kept.
    store.release(k, "w2").await.unwrap();
    assert_eq!(
        store.claim(k, "w3", options).await.plain(),
        Ok(acquired(3, 1))
    );
    // w3 dies, w4 takes over; w4 dies.
    let got = claimed_when_free(&store, k, "w4", options, within).await;
    assert_eq!(got.plain(), acquired(4, 2));
    // The third crash reaches the limit: the key is poisoned, reported once.
    let got = claimed_when_free(&store, k, "w5", options, within).await;
    assert_eq!(
        got.plain(),
        Claimed::Poisoned {
            crashes: 3,
            attempts: 0,
            letter: Letter::Yours,
        }
    );
    // w5 holds the letter role for its lease: w6 is refused without it; once the letter is
    // confirmed, every claim is refused as settled.
    assert_eq!(
        store.claim(k, "w6", options).await.plain(),
        Ok(Claimed::Poisoned {
            crashes: 3,
            attempts: 0,
            letter: Letter::Held,
        })
    );
    store.lettered(k).await.unwrap();
    assert_eq!(
        store.claim(k, "w7", options).await.plain(),
        Ok(Claimed::Poisoned {
            crashes: 3,
            attempts: 0,
            letter: Letter::Written,
        })
    );
    assert_eq!(
        store.claim_plain(k, "w8", None, LONG).await,
        Err(Error::Poisoned { crashes: 3 })
    );
    assert_eq!(
        store.complete(k, "w4", b"late", DAY).await,
        Err(Error::LeaseLost)
    );
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl > 3_500_000 && pttl <= 3_600_000, "{pttl}");
    }
}

/// With a crash limit of 0 every abandoned claim is taken over and counted, and the key is
/// never poisoned; a live claim is never a crash.
pub async fn a_crash_limit_of_zero_never_poisons<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("never-poisoned");
    let options = ClaimOptions::new(CRASH_LEASE).crashes(0);
    assert_eq!(
        store.claim(k, "t0", options).await.plain(),
        Ok(acquired(1, 0))
    );
    for generation in 2..=4 {
        assert!(matches!(
            store.claim(k, "other", options).await,
            Ok(Claimed::InProgress { .. })
        ));
        let token = format!("t{generation}");
        let got = claimed_when_free(&store, k, &token, options, Duration::from_secs(5)).await;
        assert_eq!(got.plain(), acquired(generation, generation as u32 - 1));
    }
}

/// A poisoned key is refused for the TTL of the claim that poisoned it, and is free after,
/// without its crashes.
pub async fn a_poisoned_key_is_refused_for_its_ttl<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("poisoned-briefly");
    let ttl = Duration::from_millis(600);
    let options = ClaimOptions::new(CRASH_LEASE).crashes(1).ttl(ttl);
    assert_eq!(
        store.claim(k, "a", options).await.plain(),
        Ok(acquired(1, 0))
    );
    // The claim that poisons the key: the key is refused from some time after `before` on.
    let deadline = Instant::now() + Duration::from_secs(5);
    let before = loop {
        let before = Instant::now();
        match store.claim(k, "b", options).await {
            Ok(Claimed::InProgress { retry_in }) => {
                assert!(Instant::now() < deadline, "still held after 5 s");
                tokio::time::sleep(retry_in.min(Duration::from_millis(20))).await;
            }
            Ok(Claimed::Poisoned {
                crashes: 1,
                letter: Letter::Yours,
                ..
            }) => break before,
            other => panic!("{other:?}"),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let free_at = loop {
        match store.claim(k, "c", options).await {
            Ok(Claimed::Poisoned { .. }) => {
                assert!(Instant::now() < deadline, "still poisoned after 5 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(Claimed::Acquired { crashes, .. }) => {
                assert_eq!(crashes, 0, "the poisoned key's history went with it");
                break Instant::now();
            }
            other => panic!("{other:?}"),
        }
    };
    // Refused for the whole TTL (1 ms of rounding allowed).
    let refused = free_at - before;
    assert!(refused >= ttl - Duration::from_millis(1), "{refused:?}");
}

/// Claims `k` with `options` until it is poisoned: each claim acquired is abandoned (its lease
/// lapses), and taken over and counted by the next. Returns the generations acquired on the
/// way and the refusal.
async fn poison<S: Store>(
    store: &S,
    k: StoreKey<'_>,
    options: ClaimOptions<'_>,
) -> (Vec<u64>, Claimed) {
    let mut generations = Vec::new();
    for n in 0..100 {
        let token = format!("dies-{n}");
        match claimed_when_free(store, k, &token, options, Duration::from_secs(5)).await {
            Claimed::Acquired { generation, .. } => generations.push(generation),
            refused @ Claimed::Poisoned { .. } => return (generations, refused),
            other => panic!("unexpected claim: {other:?}"),
        }
    }
    panic!("not poisoned after 100 abandoned claims");
}

/// The letter role of a poisoned key goes to the claim that poisoned it, for its lease, then
/// to the next claimer while no letter is confirmed (a sink that failed loses no letter), one
/// claimer at a time; once [`Store::lettered`] confirms it, no claimer gets it again. A key that
/// is not poisoned ignores `lettered`.
pub async fn a_poisoned_keys_letter_is_handed_out_until_it_is_confirmed<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("lettered");
    let options = ClaimOptions::new(CRASH_LEASE)
        .crashes(1)
        .ttl(Duration::from_secs(3600));
    let (_, refused) = poison(&store, k, options).await;
    assert_eq!(
        refused.plain(),
        Claimed::Poisoned {
            crashes: 1,
            attempts: 0,
            letter: Letter::Yours,
        }
    );
    // The holder's letter failed: it confirms nothing. While its lease runs the role is held;
    // after it, the next claimer gets it, and holds it in turn.
    assert_eq!(
        store.claim(k, "second", options).await.plain(),
        Ok(Claimed::Poisoned {
            crashes: 1,
            attempts: 0,
            letter: Letter::Held,
        })
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.claim(k, "third", options).await {
            Ok(Claimed::Poisoned {
                letter: Letter::Held,
                ..
            }) => {
                assert!(Instant::now() < deadline, "the role still held after 5 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(Claimed::Poisoned {
                crashes: 1,
                letter: Letter::Yours,
                ..
            }) => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        store.claim(k, "fourth", options).await.plain(),
        Ok(Claimed::Poisoned {
            crashes: 1,
            attempts: 0,
            letter: Letter::Held,
        })
    );
    // The third's letter is written and confirmed: settled for good.
    store.lettered(k).await.unwrap();
    for token in ["fifth", "sixth"] {
        assert_eq!(
            store.claim(k, token, options).await.plain(),
            Ok(Claimed::Poisoned {
                crashes: 1,
                attempts: 0,
                letter: Letter::Written,
            })
        );
    }
    store.lettered(k).await.unwrap();
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl > 3_500_000 && pttl <= 3_600_000, "expiry kept: {pttl}");
    }

    // `lettered` leaves a key that is not poisoned as it is.
    let free = key("lettered-free");
    assert_eq!(
        store.claim(free, "a", options).await.plain(),
        Ok(acquired(1, 0))
    );
    store.lettered(free).await.unwrap();
    store.complete(free, "a", b"done", DAY).await.unwrap();
    store.lettered(free).await.unwrap();
    assert_eq!(
        store.claim(free, "b", options).await,
        Ok(Claimed::Completed(b"done".to_vec()))
    );
    store.lettered(key("lettered-absent")).await.unwrap();
    assert_eq!(
        store
            .claim(key("lettered-absent"), "c", options)
            .await
            .plain(),
        Ok(acquired(1, 0))
    );
}

/// `forgive` frees a poisoned key: the next claim acquires it with a generation larger than
/// any before and no crash counted, and it takes the crash limit's number of abandoned claims
/// again to poison it again. The poisoned key's expiry is kept. A lapsed claim is forgiven with
/// the crashes (the next claim counts none), a released key's count goes back to 0, and each
/// `forgive` says whether it cleared anything.
pub async fn forgive_frees_a_poisoned_key_and_its_crashes_count_again_from_zero<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("forgiven");
    let options = ClaimOptions::new(CRASH_LEASE)
        .crashes(2)
        .ttl(Duration::from_secs(3600));
    let (generations, refused) = poison(&store, k, options).await;
    assert_eq!(generations, [1, 2]);
    assert_eq!(
        refused.plain(),
        Claimed::Poisoned {
            crashes: 2,
            attempts: 0,
            letter: Letter::Yours,
        }
    );
    assert_eq!(store.forgive(k).await, Ok(true), "a poisoned key");
    if let Some(pttl) = b.pttl(k).await {
        assert!(pttl > 3_500_000 && pttl <= 3_600_000, "expiry kept: {pttl}");
    }
    assert_eq!(store.forgive(k).await, Ok(false), "nothing left to forgive");
    // Free again, its generation kept: the next claim is numbered after the dead workers'.
    assert_eq!(
        store.claim(k, "w3", options).await.plain(),
        Ok(acquired(3, 0))
    );
    // A live claim is left alone: still in progress, still its holder's.
    assert_eq!(store.forgive(k).await, Ok(false), "a live claim");
    assert!(matches!(
        store.claim(k, "other", options).await,
        Ok(Claimed::InProgress { .. })
    ));
    // The count starts again at 0: w3 dies, w4 takes over (one crash) and dies, and only the
    // claim after that finds the limit of 2 reached again.
    let got = claimed_when_free(&store, k, "w4", options, Duration::from_secs(5)).await;
    assert_eq!(got.plain(), acquired(4, 1));
    let got = claimed_when_free(&store, k, "w5", options, Duration::from_secs(5)).await;
    assert_eq!(
        got.plain(),
        Claimed::Poisoned {
            crashes: 2,
            attempts: 0,
            letter: Letter::Yours,
        },
        "poisoned again after the limit's number of crashes, and reported again"
    );
    assert_eq!(store.forgive(k).await, Ok(true));
    // w6 completes: the job ran, and replays from now on.
    assert_eq!(
        store.claim(k, "w6", options).await.plain(),
        Ok(acquired(5, 0))
    );
    store.complete(k, "w6", b"ran", DAY).await.unwrap();
    assert_eq!(
        store.claim(k, "w7", options).await,
        Ok(Claimed::Completed(b"ran".to_vec()))
    );

    // A claim whose lease lapsed: forgiven with the crashes, so its takeover counts none.
    let l = key("forgiven-lapse");
    assert_eq!(
        store.claim(l, "w1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    let got = claimed_when_free(&store, l, "w2", options, Duration::from_secs(5)).await;
    assert_eq!(got.plain(), acquired(2, 1), "w1's lapse, counted");
    // w2 dies too; before anyone claims the key again, it is forgiven.
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.forgive(l).await != Ok(true) {
        assert!(Instant::now() < deadline, "w2's lease never lapsed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        store.claim(l, "w3", options).await.plain(),
        Ok(acquired(3, 0))
    );
    // w2 can no longer complete, renew or release what w3 holds.
    assert_eq!(
        store.complete(l, "w2", b"late", DAY).await,
        Err(Error::LeaseLost)
    );
    assert_eq!(store.renew(l, "w2", LONG).await, Err(Error::LeaseLost));

    // A released key that has crashes counted: the count goes back to 0, the generation stays.
    store.release(l, "w3").await.unwrap();
    let got = claimed_when_free(&store, l, "w4", options, Duration::from_secs(5)).await;
    assert_eq!(got.plain(), acquired(4, 0));
    let got = claimed_when_free(&store, l, "w5", options, Duration::from_secs(5)).await;
    assert_eq!(got.plain(), acquired(5, 1), "w4's lapse, counted");
    store.release(l, "w5").await.unwrap();
    assert_eq!(
        store.forgive(l).await,
        Ok(true),
        "a released key with a crash"
    );
    assert_eq!(store.forgive(l).await, Ok(false), "and without");
    assert_eq!(
        store.claim(l, "w6", options).await.plain(),
        Ok(acquired(6, 0))
    );
}

/// `forgive` leaves a completed record (it replays, its result and expiry unchanged), a live
/// claim (in progress, renewed, completed and released by its holder only, its crash count
/// kept) and a key the store does not hold exactly as they are, and says so (`false`).
pub async fn forgive_leaves_a_completed_record_and_a_live_claim_as_they_are<B: Backend>(b: &B) {
    let store = b.store();
    let options = ClaimOptions::new(CRASH_LEASE).crashes(3).ttl(DAY);

    // Absent: nothing is written.
    let absent = key("forgive-absent");
    assert_eq!(store.forgive(absent).await, Ok(false));
    if let Some(pttl) = b.pttl(absent).await {
        assert_eq!(pttl, -2, "no record written");
    }
    assert_eq!(store.lookup(absent).await, Ok(None));

    // Completed after a crash: untouched, and it replays.
    let done = key("forgive-done");
    assert_eq!(
        store.claim(done, "w1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    let got = claimed_when_free(&store, done, "w2", options, Duration::from_secs(5)).await;
    assert_eq!(got.plain(), acquired(2, 1));
    store.complete(done, "w2", b"receipt", DAY).await.unwrap();
    let before = b.pttl(done).await;
    assert_eq!(store.forgive(done).await, Ok(false), "a completed record");
    if let (Some(before), Some(after)) = (before, b.pttl(done).await) {
        assert!(
            after <= before && after > before - 5_000,
            "{before} {after}"
        );
    }
    assert_eq!(store.lookup(done).await, Ok(Some(b"receipt".to_vec())));
    assert_eq!(
        store.claim(done, "w3", options).await,
        Ok(Claimed::Completed(b"receipt".to_vec()))
    );
    // With a fingerprint, still checked against the record.
    let fp = key("forgive-done-fp");
    let with = |fp| ClaimOptions::new(LONG).fingerprint(Some(fp));
    assert_eq!(
        store.claim(fp, "a", with("x")).await.plain(),
        Ok(acquired(1, 0))
    );
    store.complete(fp, "a", b"r", DAY).await.unwrap();
    assert_eq!(store.forgive(fp).await, Ok(false));
    assert_eq!(
        store.claim(fp, "b", with("y")).await,
        Ok(Claimed::KeyReused)
    );
    assert_eq!(
        store.claim(fp, "b", with("x")).await,
        Ok(Claimed::Completed(b"r".to_vec()))
    );

    // A live claim that has a crash counted: untouched, crash count included.
    let live = key("forgive-live");
    let long = ClaimOptions::new(LONG).crashes(3).ttl(DAY);
    assert_eq!(
        store.claim(live, "w1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    let got = claimed_when_free(&store, live, "w2", long, Duration::from_secs(5)).await;
    assert_eq!(got.plain(), acquired(2, 1));
    assert_eq!(store.forgive(live).await, Ok(false), "a live claim");
    let Ok(Claimed::InProgress { retry_in }) = store.claim(live, "w3", long).await else {
        panic!("still held");
    };
    assert!(retry_in > Duration::from_secs(58), "{retry_in:?}");
    assert_eq!(store.lookup(live).await, Ok(None));
    store.renew(live, "w2", LONG).await.unwrap();
    store.release(live, "w2").await.unwrap();
    assert_eq!(
        store.claim(live, "w3", long).await.plain(),
        Ok(acquired(3, 1)),
        "the holder's crash count was kept"
    );
    store.complete(live, "w3", b"done", DAY).await.unwrap();
    assert_eq!(
        store.claim(live, "w4", long).await,
        Ok(Claimed::Completed(b"done".to_vec()))
    );
}

/// Eight claims of `name` (tokens `c0`..`c7`, with `options`) and one `forgive` of it, let go
/// at once: the claims' answers in order, and the forgive's.
async fn race_forgive<S: Store + Clone + 'static>(
    store: &S,
    name: &'static str,
    options: ClaimOptions<'static>,
) -> (Vec<Result<Claimed, Error>>, Result<bool, Error>) {
    let barrier = Arc::new(tokio::sync::Barrier::new(9));
    let mut claims = Vec::new();
    for n in 0..8 {
        let (store, barrier) = (store.clone(), barrier.clone());
        claims.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(key(name), &format!("c{n}"), options).await
        }));
    }
    let forgiver = {
        let (store, barrier) = (store.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            store.forgive(key(name)).await
        })
    };
    let mut answers = Vec::new();
    for claim in claims {
        answers.push(claim.await.expect("claimer"));
    }
    (answers, forgiver.await.expect("forgiver"))
}

/// A `forgive` racing eight claims of a key whose claim lapsed: whichever goes first, exactly
/// one claim acquires the key (generation 2), and the winner's claim is never undone by the
/// forgive (its `complete` is taken, and the next claim replays it). A forgive that read the
/// lapsed claim and then wrote over the takeover would free a live claim and make two holders.
pub async fn a_forgive_racing_the_takeover_of_a_lapsed_claim_never_undoes_it<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("forgive-takeover");
    let short = ClaimOptions::new(CRASH_LEASE).crashes(5).ttl(DAY);
    assert_eq!(
        store.claim(k, "dead", short).await.plain(),
        Ok(acquired(1, 0))
    );
    // The dead worker's lease runs out (time passing, on the server's clock for a server).
    tokio::time::sleep(CRASH_LEASE + Duration::from_millis(100)).await;
    let long = ClaimOptions::new(LONG).crashes(5).ttl(DAY);
    let (claims, forgiven) = race_forgive(&store, "forgive-takeover", long).await;
    let mut acquired_by = Vec::new();
    for (n, claim) in claims.into_iter().enumerate() {
        match claim {
            Ok(Claimed::Acquired { generation, .. }) => {
                assert_eq!(generation, 2, "c{n}");
                acquired_by.push(format!("c{n}"));
            }
            Ok(Claimed::InProgress { .. }) => {}
            other => panic!("c{n}: {other:?}"),
        }
    }
    assert!(forgiven.is_ok());
    assert_eq!(acquired_by.len(), 1, "one holder: {acquired_by:?}");
    store
        .complete(k, &acquired_by[0], b"once", DAY)
        .await
        .expect("the winner's claim stands");
    assert_eq!(
        store.claim(k, "late", long).await,
        Ok(Claimed::Completed(b"once".to_vec()))
    );
}

/// A `forgive` of a poisoned key racing eight claims of it: the claims before it are refused
/// as poisoned, and of those after it exactly one acquires the key, the others
/// finding it in progress. Never two holders.
pub async fn a_forgive_racing_claims_of_a_poisoned_key_lets_one_of_them_acquire_it<B: Backend>(
    b: &B,
) {
    let store = b.store();
    let k = key("forgive-race");
    let options = ClaimOptions::new(CRASH_LEASE).crashes(1).ttl(DAY);
    let (generations, refused) = poison(&store, k, options).await;
    assert_eq!(generations, [1]);
    assert!(matches!(
        refused,
        Claimed::Poisoned {
            letter: Letter::Yours,
            ..
        }
    ));
    let long = ClaimOptions::new(LONG).crashes(1).ttl(DAY);
    let (claims, forgiven) = race_forgive(&store, "forgive-race", long).await;
    let mut acquired_by = Vec::new();
    for (n, claim) in claims.into_iter().enumerate() {
        match claim {
            Ok(Claimed::Acquired {
                generation,
                crashes,
                ..
            }) => {
                assert_eq!((generation, crashes), (2, 0));
                acquired_by.push(format!("c{n}"));
            }
            Ok(Claimed::Poisoned { .. } | Claimed::InProgress { .. }) => {}
            other => panic!("c{n}: {other:?}"),
        }
    }
    assert_eq!(forgiven, Ok(true));
    assert!(acquired_by.len() <= 1, "two holders: {acquired_by:?}");
    // After the race the key is held by the one that acquired it, or free for the next.
    let after = store.claim(k, "late", long).await;
    match acquired_by.first() {
        Some(holder) => {
            assert!(matches!(after, Ok(Claimed::InProgress { .. })), "{after:?}");
            store.complete(k, holder, b"once", DAY).await.unwrap();
        }
        None => assert_eq!(after.plain(), Ok(acquired(2, 0))),
    }
}

/// [`Store::inspect`] tells a key's state without changing it (free, claimed with the time
/// left on its lease, completed with its result, released with its history, poisoned with its
/// crashes), and [`Store::forget`] drops a key whole, so that the next claim is a first one.
pub async fn inspect_tells_each_state_and_forget_frees_the_key<B: Backend>(b: &B) {
    let store = b.store();
    let never = key("inspect-never");
    assert_eq!(
        store.inspect(never).await,
        Ok(KeyInfo::free()),
        "a key never claimed"
    );
    let lease = ClaimOptions::new(Duration::from_secs(60));
    let c = key("inspect-claimed");
    assert_eq!(
        store.claim(c, "w1", lease).await.plain(),
        Ok(acquired(1, 0))
    );
    let info = store.inspect(c).await.unwrap();
    assert_eq!(info.state, KeyState::Claimed, "{info:?}");
    assert_eq!((info.generation, info.crashes), (Some(1), 0), "{info:?}");
    let left = info.lease_left.expect("a claim's lease");
    assert!(
        left > Duration::from_secs(50) && left <= Duration::from_secs(60),
        "{left:?}"
    );
    assert!(
        matches!(
            store.claim(c, "w2", lease).await,
            Ok(Claimed::InProgress { .. })
        ),
        "inspect took nothing from the claim"
    );
    store.complete(c, "w1", b"done", DAY).await.unwrap();
    let info = store.inspect(c).await.unwrap();
    assert_eq!(info.state, KeyState::Completed, "{info:?}");
    assert_eq!(info.result.as_deref(), Some(&b"done"[..]));

    let r = key("inspect-released");
    assert_eq!(
        store.claim(r, "w1", lease).await.plain(),
        Ok(acquired(1, 0))
    );
    store.release(r, "w1").await.unwrap();
    let info = store.inspect(r).await.unwrap();
    assert_eq!(info.state, KeyState::Free, "{info:?}");
    assert_eq!(
        (info.generation, info.crashes),
        (Some(1), 0),
        "history kept: {info:?}"
    );

    let p = key("inspect-poisoned");
    let options = ClaimOptions::new(CRASH_LEASE)
        .crashes(1)
        .ttl(Duration::from_secs(3600));
    let (_, refused) = poison(&store, p, options).await;
    assert!(
        matches!(refused, Claimed::Poisoned { crashes: 1, .. }),
        "{refused:?}"
    );
    let info = store.inspect(p).await.unwrap();
    assert_eq!(
        (info.state, info.crashes),
        (KeyState::Poisoned, 1),
        "{info:?}"
    );

    assert_eq!(store.forget(c).await, Ok(true), "a completed key");
    assert_eq!(store.inspect(c).await, Ok(KeyInfo::free()));
    // Acquired without crashes; the generation may go on from the forgotten one's (as after
    // a record's expiry: see `Store::claim`).
    let first = store.claim(c, "w3", lease).await;
    assert!(
        matches!(first, Ok(Claimed::Acquired { crashes: 0, .. })),
        "{first:?}"
    );
    assert_eq!(store.forget(p).await, Ok(true), "a poisoned key");
    let first = store.claim(p, "w1", options).await;
    assert!(
        matches!(first, Ok(Claimed::Acquired { crashes: 0, .. })),
        "{first:?}"
    );
    assert_eq!(store.forget(never).await, Ok(false), "a key never claimed");
}

/// A key counts its job's attempts over every claim: the claim that acquires it counts one
/// ([`Claimed::Acquired`]'s `attempts`), its holder each further one ([`Store::attempted`]);
/// the count is kept through a release and a takeover, a token that no longer holds the claim
/// counts nothing ([`Error::LeaseLost`]), a poisoned key's refusals carry it
/// ([`Claimed::Poisoned`]), and a forgotten key starts again at 1.
pub async fn attempts_are_counted_over_every_claim<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("attempts");
    let attempts = |claimed: Claimed| match claimed {
        Claimed::Acquired { attempts, .. } => attempts,
        other => panic!("not acquired: {other:?}"),
    };
    let long = ClaimOptions::new(LONG).ttl(DAY);
    assert_eq!(attempts(store.claim(k, "w1", long).await.unwrap()), 1);
    assert_eq!(store.attempted(k, "w1").await, Ok(2));
    assert_eq!(store.attempted(k, "w1").await, Ok(3));
    assert_eq!(store.attempted(k, "other").await, Err(Error::LeaseLost));
    store.release(k, "w1").await.unwrap();
    assert_eq!(
        store.attempted(k, "w1").await,
        Err(Error::LeaseLost),
        "released"
    );
    assert_eq!(attempts(store.claim(k, "w2", long).await.unwrap()), 4);

    // w2 dies holding the key: the takeover counts on.
    let short = ClaimOptions::new(SHORT).ttl(DAY);
    let lapsing = key("attempts-lapsing");
    assert_eq!(
        attempts(store.claim(lapsing, "w1", short).await.unwrap()),
        1
    );
    assert_eq!(store.attempted(lapsing, "w1").await, Ok(2));
    let taken = claimed_when_free(&store, lapsing, "w2", short, Duration::from_secs(5)).await;
    assert_eq!(attempts(taken), 3, "counted on after the takeover");
    assert_eq!(store.attempted(lapsing, "w1").await, Err(Error::LeaseLost));

    assert_eq!(store.forget(k).await, Ok(true));
    assert_eq!(
        attempts(store.claim(k, "w3", long).await.unwrap()),
        1,
        "forgotten"
    );

    // Poisoned after two abandoned claims: the refusal carries the count, for the letter.
    let dying = key("attempts-poisoned");
    let limited = ClaimOptions::new(SHORT).ttl(DAY).crashes(2);
    assert_eq!(
        attempts(store.claim(dying, "w1", limited).await.unwrap()),
        1
    );
    assert_eq!(store.attempted(dying, "w1").await, Ok(2));
    let second = claimed_when_free(&store, dying, "w2", limited, Duration::from_secs(5)).await;
    assert_eq!(attempts(second), 3);
    let refused = claimed_when_free(&store, dying, "w3", limited, Duration::from_secs(5)).await;
    assert!(
        matches!(
            refused,
            Claimed::Poisoned {
                crashes: 2,
                attempts: 3,
                ..
            }
        ),
        "{refused:?}"
    );
    let again = store.claim(dying, "w4", limited).await.unwrap();
    assert!(
        matches!(again, Claimed::Poisoned { attempts: 3, .. }),
        "{again:?}"
    );
}

/// A step of the checks' jobs.
fn step(name: &str, occurrence: u32) -> StepKey<'_> {
    StepKey { name, occurrence }
}

/// Claims `k`; when acquired, the steps the claim read, sorted.
async fn claim_steps<S: Store>(
    store: &S,
    k: StoreKey<'_>,
    token: &str,
    options: ClaimOptions<'_>,
) -> (Claimed, Vec<(String, u32, Vec<u8>)>) {
    let claimed = store.claim(k, token, options).await.unwrap();
    let steps = match &claimed {
        Claimed::Acquired { steps, .. } => steps.clone().expect("the store keeps steps"),
        _ => Vec::new(),
    };
    (claimed, sorted(steps))
}

fn sorted(steps: Vec<StepRecord>) -> Vec<(String, u32, Vec<u8>)> {
    let mut steps: Vec<_> = (steps.into_iter())
        .map(|s| (s.name, s.occurrence, s.value))
        .collect();
    steps.sort();
    steps
}

/// A step is recorded ([`Store::record_step`]) only while its token holds a live claim, and
/// replaces the value of the same name and occurrence; the steps (any name, binary values) come
/// back with the next claim after a release, and after the takeover of a lapsed claim; a token
/// that no longer holds the claim (released, or taken over) records nothing.
pub async fn steps_are_recorded_by_the_claims_holder_alone_and_resume_with_the_next_claim<
    B: Backend,
>(
    b: &B,
) {
    let store = b.store();
    let k = key("steps-resume");
    let options = ClaimOptions::new(LONG).ttl(DAY);
    let (claimed, steps) = claim_steps(&store, k, "w1", options).await;
    assert_eq!(
        (claimed.plain(), steps),
        (acquired(1, 0), Vec::new()),
        "a fresh key"
    );
    let binary = [0u8, 255, b':', b'\n'];
    for (name, n, value) in [
        ("capture.v1", 1, &b"first"[..]),
        ("reserve", 1, b"r1"),
        ("reserve", 2, &binary[..]),
        ("name: with colon, and späces", 7, b"{}"),
        ("capture.v1", 1, b"again"),
    ] {
        let recorded = store.record_step(k, "w1", step(name, n), value).await;
        assert_eq!(recorded, Ok(()), "{name}#{n}");
    }
    assert_eq!(
        store.record_step(k, "w2", step("stranger", 1), b"x").await,
        Err(Error::LeaseLost),
        "a token that holds no claim"
    );
    let expected = vec![
        ("capture.v1".to_owned(), 1, b"again".to_vec()),
        ("name: with colon, and späces".to_owned(), 7, b"{}".to_vec()),
        ("reserve".to_owned(), 1, b"r1".to_vec()),
        ("reserve".to_owned(), 2, binary.to_vec()),
    ];
    assert_eq!(sorted(store.steps(k).await.unwrap()), expected);

    store.release(k, "w1").await.unwrap();
    assert_eq!(
        store.record_step(k, "w1", step("late", 1), b"x").await,
        Err(Error::LeaseLost),
        "a released claim"
    );
    let short = ClaimOptions::new(SHORT).ttl(DAY).crashes(0);
    let (claimed, steps) = claim_steps(&store, k, "w2", short).await;
    assert_eq!(claimed.plain(), acquired(2, 0));
    assert_eq!(steps, expected, "resumed after a release");

    // w2's lease lapses; w3 takes the job over with its steps, and w2 records nothing.
    let taken = claimed_when_free(&store, k, "w3", short, Duration::from_secs(5)).await;
    assert_eq!(taken.plain(), acquired(3, 1));
    assert_eq!(sorted(store.steps(k).await.unwrap()), expected);
    assert_eq!(
        store.record_step(k, "w2", step("zombie", 1), b"x").await,
        Err(Error::LeaseLost),
        "a token whose claim was taken over"
    );
    assert_eq!(sorted(store.steps(k).await.unwrap()), expected);
}

/// A completed job replays its result and has no steps left; `forgive` and `forget` drop a
/// job's steps, so that its next claim starts without them.
pub async fn a_completed_forgiven_or_forgotten_job_has_no_steps<B: Backend>(b: &B) {
    let store = b.store();
    let options = ClaimOptions::new(LONG).ttl(DAY);
    let one = step("one", 1);

    let c = key("steps-completed");
    assert_eq!(
        store.claim(c, "w1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    store.record_step(c, "w1", one, b"1").await.unwrap();
    store.complete(c, "w1", b"done", DAY).await.unwrap();
    assert_eq!(store.steps(c).await, Ok(Vec::new()), "completed");
    let (claimed, steps) = claim_steps(&store, c, "w2", options).await;
    assert_eq!(claimed, Claimed::Completed(b"done".to_vec()));
    assert!(steps.is_empty());

    let f = key("steps-forgiven");
    let lapsing = ClaimOptions::new(CRASH_LEASE).ttl(DAY);
    assert_eq!(
        store.claim(f, "w1", lapsing).await.plain(),
        Ok(acquired(1, 0))
    );
    store.record_step(f, "w1", one, b"1").await.unwrap();
    // Its worker dies: once the lease lapsed, forgive clears the crash, and the steps with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !store.forgive(f).await.unwrap() {
        assert!(Instant::now() < deadline, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.steps(f).await, Ok(Vec::new()), "forgiven");
    let (claimed, steps) = claim_steps(&store, f, "w2", options).await;
    assert_eq!((claimed.plain(), steps), (acquired(2, 0), Vec::new()));

    let g = key("steps-forgotten");
    assert_eq!(
        store.claim(g, "w1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    store.record_step(g, "w1", one, b"1").await.unwrap();
    store.release(g, "w1").await.unwrap();
    assert_eq!(store.forget(g).await, Ok(true));
    assert_eq!(store.steps(g).await, Ok(Vec::new()), "forgotten");
    let (claimed, steps) = claim_steps(&store, g, "w2", options).await;
    assert!(matches!(claimed, Claimed::Acquired { crashes: 0, .. }));
    assert!(steps.is_empty(), "{steps:?}");
}

/// A job's steps share its TTL: once the key's history expired, its steps are gone, and the
/// next claim starts without them.
pub async fn steps_expire_with_their_job<B: Backend>(b: &B) {
    let store = b.store();
    let k = key("steps-expire");
    let options = ClaimOptions::new(SHORT).ttl(SHORT);
    assert_eq!(
        store.claim(k, "w1", options).await.plain(),
        Ok(acquired(1, 0))
    );
    store
        .record_step(k, "w1", step("one", 1), b"1")
        .await
        .unwrap();
    store.release(k, "w1").await.unwrap();
    assert_eq!(
        store.steps(k).await.unwrap().len(),
        1,
        "kept by the release"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !store.steps(k).await.unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the steps outlived their job's TTL"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (claimed, steps) = claim_steps(&store, k, "w2", options).await;
    assert!(matches!(claimed, Claimed::Acquired { crashes: 0, .. }));
    assert!(steps.is_empty(), "{steps:?}");
}
