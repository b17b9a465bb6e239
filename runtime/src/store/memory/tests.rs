use super::*;
use crate::testing::{Claim, PlainClaim};

const K: StoreKey<'static> = StoreKey {
    scope: "s",
    key: "k",
};
const LEASE: Duration = Duration::from_secs(30);

/// A claim that counts no crash, as [`Store::claim`] makes it, answered at once.
fn claim_now(
    s: &MemoryStore,
    key: StoreKey<'_>,
    token: &str,
    fingerprint: Option<&str>,
    lease: Duration,
) -> Result<Claim, Error> {
    let options = ClaimOptions::new(lease).fingerprint(fingerprint).crashes(0);
    Claim::of(s.claim_counted(key, token, &options)?)
}

fn claim(s: &MemoryStore, key: StoreKey<'_>, token: &str) -> Claim {
    claim_now(s, key, token, None, LEASE).unwrap()
}

fn counted(s: &MemoryStore, token: &str, crashes: u32) -> Claimed {
    let options = ClaimOptions::new(LEASE).crashes(crashes);
    s.claim_counted(K, token, &options).unwrap()
}

/// Claims and completes `n` keys `{prefix}{i}` with `ttl`.
async fn fill(s: &MemoryStore, prefix: &str, n: usize, ttl: Duration) {
    for i in 0..n {
        let key = format!("{prefix}{i}");
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        assert_eq!(claim(s, k, "t"), Claim::Acquired, "{key}");
        s.complete(k, "t", &[7; 100], ttl).await.unwrap();
    }
}

/// Entries in the shards' orders of completed records, of released keys and of claims, and
/// records, over all shards.
fn entries(s: &MemoryStore) -> (usize, usize, usize, usize) {
    s.inner
        .shards
        .iter()
        .fold((0, 0, 0, 0), |(c, f, l, r), shard| {
            let shard = lock(shard);
            let completed: usize = shard.completed.iter().map(|o| o.entries.len()).sum();
            (
                c + completed,
                f + shard.released.len(),
                l + shard.claims.len(),
                r + shard.records.len(),
            )
        })
}

#[test]
fn a_record_counts_its_overhead_and_its_bytes() {
    // The figures the module docs give.
    assert_eq!(size_of::<Record>(), 104);
    assert_eq!(RECORD_OVERHEAD, 204);
    let s = MemoryStore::new();
    let fp = ClaimOptions::new(LEASE).fingerprint(Some("fp"));
    s.claim_counted(K, "token", &fp).unwrap();
    // "s" + "k" + "fp" + "token"
    assert_eq!(s.stats().bytes, 204 + 1 + 1 + 2 + 5);
}

#[tokio::test]
async fn the_bytes_follow_the_payload() {
    let s = MemoryStore::new();
    let fp = ClaimOptions::new(LEASE).fingerprint(Some("fp"));
    s.claim_counted(K, "token", &fp).unwrap();
    s.complete(K, "token", b"result!", LEASE).await.unwrap();
    assert_eq!(s.stats().bytes, 204 + 1 + 1 + 2 + 7);
    let other = StoreKey {
        scope: "s",
        key: "other",
    };
    assert_eq!(claim(&s, other, "t"), Claim::Acquired);
    s.release(other, "t").await.unwrap();
    // A released key's history: no payload.
    assert_eq!(s.stats().bytes, (204 + 11) + (204 + 6));
}

#[tokio::test]
async fn a_jobs_steps_count_their_bytes_until_it_completes() {
    let s = MemoryStore::new();
    assert_eq!(claim(&s, K, "token"), Claim::Acquired);
    let claimed = 204 + 1 + 1 + 5;
    assert_eq!(STEP_OVERHEAD, 88);
    let step = StepKey {
        name: "capture",
        occurrence: 1,
    };
    s.record_step(K, "token", step, b"12345").await.unwrap();
    assert_eq!(s.stats().bytes, claimed + 88 + 7 + 5);
    // Recorded again: the new value's bytes in place of the old one's.
    s.record_step(K, "token", step, b"1").await.unwrap();
    assert_eq!(s.stats().bytes, claimed + 88 + 7 + 1);
    s.release(K, "token").await.unwrap();
    assert_eq!(
        s.stats().bytes,
        204 + 2 + 88 + 7 + 1,
        "kept with the released history"
    );
    assert_eq!(claim(&s, K, "again"), Claim::Acquired);
    s.complete(K, "again", b"done", LEASE).await.unwrap();
    assert_eq!(s.stats().bytes, 204 + 2 + 4, "gone with the completion");
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
    assert!(matches!(claim(&s, K, "third"), Claim::InProgress { retry_in } if retry_in == LEASE));
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
        match claim_now(&s, StoreKey { scope: "s", key: k }, "t", None, LEASE) {
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
        // Still held: no live claim was given up to make room.
        assert!(matches!(
            claim(&s, StoreKey { scope: "s", key: k }, "u"),
            Claim::InProgress { .. }
        ));
    }
    tokio::time::advance(LEASE).await;
    // Lapsed claims make room again.
    let fresh = keys
        .iter()
        .filter(|k| {
            matches!(
                claim_now(&s, StoreKey { scope: "t", key: k }, "t", None, LEASE),
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
        claim_now(&s, K, "a", Some("f1"), LEASE),
        Ok(Claim::Acquired)
    );
    assert_eq!(
        claim_now(&s, K, "b", Some("f2"), LEASE),
        Ok(Claim::KeyReused)
    );
    assert!(matches!(
        claim_now(&s, K, "b", Some("f1"), LEASE),
        Ok(Claim::InProgress { .. })
    ));
    let other = StoreKey {
        scope: "other",
        key: "k",
    };
    assert_eq!(claim_now(&s, other, "c", None, LEASE), Ok(Claim::Acquired));
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
    assert_eq!(
        s.len(),
        1,
        "a released key keeps its generation and crash count"
    );
    assert_eq!(claim(&s, K, "d"), Claim::Acquired);
}

#[tokio::test(start_paused = true)]
async fn a_fingerprint_survives_completion_and_a_reclaim_replaces_it() {
    let s = MemoryStore::new();
    assert_eq!(
        claim_now(&s, K, "a", Some("f1"), LEASE),
        Ok(Claim::Acquired)
    );
    s.complete(K, "a", b"r", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        claim_now(&s, K, "b", Some("f2"), LEASE),
        Ok(Claim::KeyReused)
    );
    assert_eq!(
        claim_now(&s, K, "b", None, LEASE),
        Ok(Claim::Completed(b"r".to_vec()))
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        claim_now(&s, K, "c", Some("f2"), LEASE),
        Ok(Claim::Acquired)
    );
    assert!(matches!(
        claim_now(&s, K, "d", Some("f2"), LEASE),
        Ok(Claim::InProgress { .. })
    ));
    assert_eq!(
        claim_now(&s, K, "d", Some("f1"), LEASE),
        Ok(Claim::KeyReused)
    );
}

#[tokio::test(start_paused = true)]
async fn the_oldest_completed_records_go_first_and_only_past_the_floor() {
    let floor = Duration::from_secs(60);
    let s = MemoryStore::builder()
        .max_bytes(SHARDS * 8 * 1024)
        .min_retention(floor)
        .build();
    let ttl = Duration::from_secs(24 * 3600);
    fill(&s, "old", 120, ttl).await;
    assert_eq!(s.stats().evicted, 0);
    tokio::time::advance(floor + Duration::from_millis(1)).await;
    // Past the floor, the old records make room for new ones, until only young ones are left:
    // then a new claim fails closed, in words.
    let mut done = Vec::new();
    let refused = loop {
        let key = format!("new{}", done.len());
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        match claim_now(&s, k, "t", None, LEASE) {
            Ok(Claim::Acquired) => s.complete(k, "t", &[7; 100], ttl).await.unwrap(),
            Err(e) => break e,
            Ok(other) => panic!("{other:?}"),
        }
        done.push(key);
        assert!(done.len() < 10_000, "never refused: {:?}", s.stats());
    };
    let Error::Store(words) = refused else {
        panic!("{refused:?}")
    };
    assert!(words.contains("min_retention"), "{words}");
    let stats = s.stats();
    assert!(stats.evicted > 0, "{stats:?}");
    for key in &done {
        let k = StoreKey { scope: "s", key };
        assert!(
            s.completed(k).is_some(),
            "{key}: younger than the floor, kept"
        );
    }
    let old_kept = (0..120)
        .filter(|i| {
            let key = format!("old{i}");
            s.completed(StoreKey {
                scope: "s",
                key: &key,
            })
            .is_some()
        })
        .count();
    assert_eq!(old_kept as u64, 120 - stats.evicted, "{stats:?}");
    // A claim of a completed key still replays.
    let first = StoreKey {
        scope: "s",
        key: &done[0],
    };
    assert_eq!(claim(&s, first, "u"), Claim::Completed(vec![7; 100]));
}

#[tokio::test(start_paused = true)]
async fn expired_records_are_dropped_a_few_at_a_time() {
    let s = MemoryStore::new();
    fill(&s, "a", 2_000, Duration::from_secs(1)).await;
    // (A millisecond more: the 4,000 stamps of a paused instant run ahead of it.)
    tokio::time::advance(Duration::from_millis(1_001)).await;
    // Each claim of a new key looks at a few entries at the front of its shard's orders, and
    // drops the expired records there; its release looks at the ring of released keys.
    let mut claims = 0;
    while s.stats().expired < 2_000 {
        let key = format!("b{claims}");
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        let before = s.stats().expired;
        assert_eq!(claim(&s, k, "t"), Claim::Acquired);
        s.release(k, "t").await.unwrap();
        assert!(s.stats().expired - before <= UPKEEP as u64, "bounded work");
        claims += 1;
    }
    assert!(claims >= 2_000 / UPKEEP, "{claims}");
    let (completed, released, _, records) = entries(&s);
    assert_eq!(completed, 0);
    assert_eq!(
        records, claims,
        "only the released keys' histories are left"
    );
    assert!(released <= 2 * claims, "{released}");
}

#[tokio::test(start_paused = true)]
async fn abandoned_claims_are_counted_until_the_key_is_poisoned() {
    let s = MemoryStore::new();
    let acquired = |generation: u64, crashes| Claimed::Acquired {
        generation,
        crashes,
        attempts: generation as u32,
        steps: Some(Vec::new()),
    };
    assert_eq!(counted(&s, "a", 3), acquired(1, 0));
    tokio::time::advance(LEASE).await;
    assert_eq!(counted(&s, "b", 3), acquired(2, 1), "a takeover, counted");
    // A release is not a crash, and keeps the count and the generation.
    s.release(K, "b").await.unwrap();
    assert_eq!(counted(&s, "c", 3), acquired(3, 1));
    tokio::time::advance(LEASE).await;
    assert_eq!(counted(&s, "d", 3), acquired(4, 2));
    tokio::time::advance(LEASE).await;
    assert_eq!(
        counted(&s, "e", 3),
        Claimed::Poisoned {
            crashes: 3,
            attempts: 4,
            letter: Letter::Yours
        }
    );
    assert_eq!(
        counted(&s, "f", 3),
        Claimed::Poisoned {
            crashes: 3,
            attempts: 4,
            letter: Letter::Held
        },
        "refused; the claim that poisoned it holds the letter role"
    );
    assert_eq!(
        s.claim_plain(K, "g", None, LEASE).await,
        Err(Error::Poisoned { crashes: 3 })
    );
    assert_eq!(s.complete(K, "d", b"x", LEASE).await, Err(Error::LeaseLost));
}

#[tokio::test(start_paused = true)]
async fn a_crash_limit_of_zero_never_poisons_and_a_live_claim_is_not_a_crash() {
    let s = MemoryStore::new();
    for generation in 1..=5 {
        assert_eq!(
            counted(&s, &format!("t{generation}"), 0),
            Claimed::Acquired {
                generation,
                crashes: generation as u32 - 1,
                attempts: generation as u32,
                steps: Some(Vec::new()),
            }
        );
        assert!(matches!(
            counted(&s, "other", 0),
            Claimed::InProgress { .. }
        ));
        tokio::time::advance(LEASE).await;
    }
}

/// Claims `K` and lets the claim lapse, so that the next claim (`crashes(1)`) poisons it.
async fn poison(s: &MemoryStore, options: &ClaimOptions<'_>) {
    assert!(matches!(
        s.claim_counted(K, "a", options).unwrap(),
        Claimed::Acquired { .. }
    ));
    tokio::time::advance(LEASE).await;
    assert!(matches!(
        s.claim_counted(K, "b", options).unwrap(),
        Claimed::Poisoned {
            letter: Letter::Yours,
            ..
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_claim_refused_for_room_leaves_nothing_behind() {
    // Full of live claims at 512 records (32 a shard).
    let s = MemoryStore::builder().max_records(512).build();
    let mut held = 0;
    let refused = loop {
        let key = format!("held{held}");
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        match claim_now(&s, k, "t", None, LEASE) {
            Ok(Claim::Acquired) => held += 1,
            Err(e) => break (key, e),
            Ok(other) => panic!("{other:?}"),
        }
    };
    assert!(matches!(refused.1, Error::Store(_)), "{:?}", refused.1);
    let before = s.stats();
    assert_eq!(before.records, held);
    let k = StoreKey {
        scope: "s",
        key: &refused.0,
    };
    for _ in 0..3 {
        assert!(claim_now(&s, k, "t", None, LEASE).is_err());
        assert_eq!(s.stats(), before, "nothing kept, nothing counted");
        assert_eq!(s.completed(k), None);
    }
    // Once the leases lapse, the key is claimed afresh: its first generation.
    tokio::time::advance(LEASE).await;
    assert_eq!(
        s.claim_counted(k, "u", &ClaimOptions::new(LEASE)).unwrap(),
        Claimed::Acquired {
            generation: 1,
            crashes: 0,
            attempts: 1,
            steps: Some(Vec::new()),
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_poisoned_record_is_never_given_up_for_room_before_its_ttl() {
    // Full at 512 records with no floor: a new claim gives up the oldest completed one.
    let s = MemoryStore::builder()
        .max_records(512)
        .min_retention(Duration::ZERO)
        .build();
    let options = ClaimOptions::new(LEASE).crashes(1);
    poison(&s, &options).await;
    // Many more poisoned keys, older than any completed record: none is in the way.
    let poisoned: Vec<String> = (0..200).map(|i| format!("poisoned{i}")).collect();
    for key in &poisoned {
        let k = StoreKey { scope: "s", key };
        s.claim_counted(k, "a", &options).unwrap();
    }
    tokio::time::advance(LEASE).await;
    for key in &poisoned {
        let k = StoreKey { scope: "s", key };
        assert!(matches!(
            s.claim_counted(k, "b", &options).unwrap(),
            Claimed::Poisoned {
                letter: Letter::Yours,
                ..
            }
        ));
    }
    for i in 0..2_000 {
        let key = format!("job{i}");
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        assert_eq!(claim(&s, k, "t"), Claim::Acquired, "{key}");
        s.complete(k, "t", b"r", Duration::from_secs(3600))
            .await
            .unwrap();
    }
    assert!(s.stats().evicted >= 1_500, "{:?}", s.stats());
    // Still poisoned, not claimed (no letter was confirmed: the role is handed out again).
    assert!(matches!(
        s.claim_counted(K, "c", &options).unwrap(),
        Claimed::Poisoned { crashes: 1, .. }
    ));
    for key in &poisoned {
        let k = StoreKey { scope: "s", key };
        assert!(matches!(
            s.claim_counted(k, "c", &options).unwrap(),
            Claimed::Poisoned { crashes: 1, .. }
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn a_poisoned_key_is_refused_for_its_ttl() {
    let s = MemoryStore::new();
    let ttl = Duration::from_secs(3600);
    let options = ClaimOptions::new(LEASE).crashes(1).ttl(ttl);
    poison(&s, &options).await;
    tokio::time::advance(ttl - Duration::from_secs(1)).await;
    assert!(matches!(
        s.claim_counted(K, "c", &options).unwrap(),
        Claimed::Poisoned { .. }
    ));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(
        s.claim_counted(K, "d", &options).unwrap(),
        Claimed::Acquired { crashes: 0, .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_forgiven_key_is_kept_as_a_released_keys_history() {
    let s = MemoryStore::new();
    let ttl = Duration::from_secs(3600);
    let options = ClaimOptions::new(LEASE).crashes(1).ttl(ttl);
    poison(&s, &options).await;
    assert_eq!(entries(&s).1, 0, "a poisoned key is not a released one");
    assert_eq!(s.forgive(K).await, Ok(true));
    assert_eq!(
        entries(&s).1,
        1,
        "forgiven: a released key's history, first to go when room is short"
    );
    assert_eq!(s.forgive(K).await, Ok(false), "nothing left to forgive");
    assert_eq!(
        s.claim_counted(K, "c", &options).unwrap(),
        Claimed::Acquired {
            generation: 2,
            crashes: 0,
            attempts: 2,
            steps: Some(Vec::new()),
        }
    );
    // A lapsed claim: forgiven, so that its takeover counts no crash.
    tokio::time::advance(LEASE).await;
    assert_eq!(s.forgive(K).await, Ok(true));
    assert_eq!(s.complete(K, "c", b"x", ttl).await, Err(Error::LeaseLost));
    assert_eq!(
        s.claim_counted(K, "d", &options).unwrap(),
        Claimed::Acquired {
            generation: 3,
            crashes: 0,
            attempts: 3,
            steps: Some(Vec::new()),
        }
    );
    // A key whose history expired: nothing to forgive, and the key is free without it.
    tokio::time::advance(LEASE).await;
    assert!(matches!(
        s.claim_counted(K, "e", &options).unwrap(),
        Claimed::Poisoned {
            letter: Letter::Yours,
            ..
        }
    ));
    tokio::time::advance(ttl).await;
    assert_eq!(s.forgive(K).await, Ok(false));
    assert!(matches!(
        s.claim_counted(K, "f", &options).unwrap(),
        Claimed::Acquired { crashes: 0, .. }
    ));
    assert_eq!(s.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn abandoned_claims_expire_while_other_jobs_run() {
    let s = MemoryStore::new();
    // Claims taken and never completed nor released.
    let short = ClaimOptions::new(Duration::from_millis(1)).ttl(Duration::from_secs(1));
    for i in 0..100 {
        let key = format!("abandoned{i}");
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        assert!(matches!(
            s.claim_counted(k, "t", &short).unwrap(),
            Claimed::Acquired { .. }
        ));
    }
    fill(&s, "long", 5_000, Duration::from_secs(24 * 3600)).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let abandoned = |s: &MemoryStore| {
        s.inner.shards.iter().fold(0, |n, shard| {
            let shard = lock(shard);
            let mine = shard
                .records
                .iter()
                .filter(|r| r.data.starts_with(b"sabandoned"));
            n + mine.count()
        })
    };
    assert_eq!(abandoned(&s), 100);
    // Other jobs run, and each looks at the front of its shard's ring of claims.
    let mut claims = 0;
    while abandoned(&s) > 0 {
        let key = format!("new{claims}");
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        assert_eq!(claim(&s, k, "t"), Claim::Acquired);
        s.complete(k, "t", b"x", Duration::from_millis(1))
            .await
            .unwrap();
        claims += 1;
        assert!(claims < 1_000, "{:?}", s.stats());
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_released_and_claimed_again_leaves_few_stale_entries() {
    let s = MemoryStore::new();
    for i in 0..10_000 {
        assert_eq!(claim(&s, K, &format!("t{i}")), Claim::Acquired);
        s.release(K, &format!("t{i}")).await.unwrap();
    }
    let (completed, released, claims, records) = entries(&s);
    assert_eq!((completed, records), (0, 1));
    assert!(released + claims <= 4, "{released} + {claims} entries");
    assert_eq!(claim(&s, K, "last"), Claim::Acquired);
}

#[tokio::test(start_paused = true)]
async fn records_with_a_shorter_ttl_expire_on_time_behind_older_ones() {
    let s = MemoryStore::new();
    // The oldest records of every shard live a day; those after them a millisecond.
    fill(&s, "long", 256, Duration::from_secs(24 * 3600)).await;
    for round in 0..200 {
        fill(&s, &format!("short{round}."), 100, Duration::from_millis(1)).await;
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    let (completed, _, _, records) = entries(&s);
    assert!(records < 256 + 300, "{records} records");
    assert!(completed <= records + SHARDS, "{completed} entries");
    for i in 0..256 {
        let key = format!("long{i}");
        let k = StoreKey {
            scope: "s",
            key: &key,
        };
        assert_eq!(s.completed(k), Some(vec![7; 100]));
    }
}

#[tokio::test(start_paused = true)]
async fn a_ttl_past_the_orders_a_shard_keeps_is_never_replayed_after_it() {
    let s = MemoryStore::new();
    // More TTLs than a shard keeps orders for, each on every shard.
    for ttl in 1..=(2 * MAX_TTLS as u64) {
        for i in 0..64 {
            let key = format!("ttl{ttl}.{i}");
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            assert_eq!(claim(&s, k, "t"), Claim::Acquired);
            s.complete(k, "t", b"r", Duration::from_secs(ttl))
                .await
                .unwrap();
        }
    }
    for shard in s.inner.shards.iter() {
        assert!(lock(shard).completed.len() <= MAX_TTLS);
    }
    for ttl in 1..=(2 * MAX_TTLS as u64) {
        tokio::time::advance(Duration::from_secs(1)).await;
        for i in 0..64 {
            let key = format!("ttl{ttl}.{i}");
            let k = StoreKey {
                scope: "s",
                key: &key,
            };
            assert_eq!(s.completed(k), None, "{key}: expired");
            assert_eq!(claim(&s, k, "u"), Claim::Acquired, "{key}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn room_is_made_from_an_expired_record_behind_a_young_older_one() {
    // 2,200 bytes a shard. On one shard: "young", completed first with a long TTL and within the
    // floor, then six records whose TTL ends first (about 276 bytes each, as "young").
    let s = MemoryStore::builder()
        .max_bytes(SHARDS * 2_200)
        .min_retention(Duration::from_secs(3600))
        .build();
    let shard_of = |key: &str| hash_key(&s.inner.hasher, "s", key) % SHARDS as u64;
    let keys: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
    let mine: Vec<StoreKey<'_>> = (keys.iter().filter(|k| shard_of(k) == 0))
        .map(|key| StoreKey { scope: "s", key })
        .take(8)
        .collect();
    let [young, short @ .., new] = &mine[..] else {
        panic!("eight keys")
    };
    let (young, new) = (*young, *new);
    fill_one(&s, young, Duration::from_secs(24 * 3600)).await;
    for &key in short {
        fill_one(&s, key, Duration::from_secs(1)).await;
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    // The claim drops two of them on its way, and so does its completion; its 1,300-byte
    // result needs a fifth's room, which the oldest record, young, cannot give.
    assert_eq!(claim(&s, new, "t"), Claim::Acquired);
    s.complete(new, "t", &[1; 1_300], LEASE).await.unwrap();
    let stats = s.stats();
    assert_eq!((stats.expired, stats.evicted), (5, 0), "{stats:?}");
    assert!(stats.bytes <= 2_200, "{stats:?}");
    assert_eq!(s.completed(young), Some(vec![7; 100]));
}

async fn fill_one(s: &MemoryStore, key: StoreKey<'_>, ttl: Duration) {
    assert_eq!(claim(s, key, "t"), Claim::Acquired);
    s.complete(key, "t", &[7; 100], ttl).await.unwrap();
}

#[tokio::test]
async fn the_first_record_of_a_ttl_opens_its_order() {
    let s = MemoryStore::new();
    fill_one(&s, K, Duration::from_secs(60)).await;
    // Another key on K's shard.
    let shard_of = |key: &str| hash_key(&s.inner.hasher, "s", key) % SHARDS as u64;
    let keys: Vec<String> = (0..10_000).map(|i| format!("other{i}")).collect();
    let key = keys
        .iter()
        .find(|k| shard_of(k) == shard_of(K.key))
        .unwrap();
    let other = StoreKey { scope: "s", key };
    fill_one(&s, other, Duration::from_secs(1)).await;
    let orders: Vec<(u64, usize)> = (s.inner.shards.iter())
        .flat_map(|shard| {
            let shard = lock(shard);
            let orders = shard.completed.iter();
            orders.map(|o| (o.ttl, o.entries.len())).collect::<Vec<_>>()
        })
        .filter(|&(_, entries)| entries > 0)
        .collect();
    assert_eq!(orders, [(60_000_000_000, 1), (1_000_000_000, 1)]);
}

#[tokio::test(start_paused = true)]
async fn the_letter_role_is_handed_out_again_until_a_letter_is_confirmed() {
    let s = MemoryStore::new();
    let options = ClaimOptions::new(LEASE).crashes(1);
    poison(&s, &options).await; // Its last claim, "b", got the role, for its lease.
    let letter = |token| match s.claim_counted(K, token, &options).unwrap() {
        Claimed::Poisoned { letter, .. } => letter,
        other => panic!("{other:?}"),
    };
    assert_eq!(letter("c"), Letter::Held, "b's lease holds the role");
    tokio::time::advance(LEASE).await;
    assert_eq!(
        letter("d"),
        Letter::Yours,
        "b confirmed no letter: d gets the role"
    );
    assert_eq!(letter("e"), Letter::Held);
    s.lettered(K).await.unwrap();
    assert_eq!(letter("f"), Letter::Written);
    tokio::time::advance(LEASE).await;
    assert_eq!(letter("g"), Letter::Written, "for good");
    // Nothing for a key that is not poisoned.
    let other = StoreKey {
        scope: "s",
        key: "other",
    };
    assert_eq!(claim(&s, other, "t"), Claim::Acquired);
    s.lettered(other).await.unwrap();
    assert!(matches!(claim(&s, other, "u"), Claim::InProgress { .. }));
}
