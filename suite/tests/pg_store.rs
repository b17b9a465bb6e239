//! `PgStore` at the `Store` trait level, against a private `postgres` per test: claim, complete
//! and replay, release, renew, lease expiry, the token compare-and-set, fingerprints, the
//! migration, the purge, key hashing and scope isolation, large keys and results.
//!
//! These run on the real clock: the lease lives in the database, whose clock tokio cannot pause.
//! Where a lease must lapse it is short (300 ms), and the tests poll the database with a
//! deadline rather than sleep for a guessed time.

use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::pg_job;
use jobguard_testkit::postgres;

use jobguard::store::postgres::PgStore;
use jobguard::{ClaimOptions, Claimed, Error, Store, StoreKey};
use postgres::PgServer;
use sqlx::Row;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(300);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.postgres",
        key,
    }
}

async fn connect(server: &PgServer) -> PgStore {
    let store = PgStore::connect(&server.url()).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// Microseconds left until `column` (a timestamp expression of the row), or `None` when there
/// is no row.
async fn left_until(store: &PgStore, k: StoreKey<'_>, column: &str) -> Option<i64> {
    let (scope, key) = PgStore::row_key(k);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT floor(extract(epoch FROM {column} - now()) * 1000000)::bigint \
         FROM jobguard_keys WHERE scope = $1 AND key = $2"
    )))
    .bind(&*scope)
    .bind(&*key)
    .fetch_optional(store.pool())
    .await
    .expect("read the row")
    .map(|row| row.get(0))
}

/// Microseconds left on the row's expiry, or `None` when there is no row.
async fn left_us(store: &PgStore, k: StoreKey<'_>) -> Option<i64> {
    left_until(store, k, "expires_at").await
}

/// Microseconds left on the row's lease (a claim written before crash counting has none of its
/// own: its lease ends at its `expires_at`), or `None` when there is no row.
async fn lease_left_us(store: &PgStore, k: StoreKey<'_>) -> Option<i64> {
    left_until(store, k, "coalesce(lease_ends_at, expires_at)").await
}

async fn rows(store: &PgStore) -> i64 {
    sqlx::query("SELECT count(*) FROM jobguard_keys")
        .fetch_one(store.pool())
        .await
        .expect("count")
        .get(0)
}

#[tokio::test]
async fn a_claim_is_exclusive_and_a_completed_record_replays() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
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
    store
        .complete(k, "t1", br#"{"v":1,"ok":7}"#, DAY)
        .await
        .unwrap();
    assert_eq!(
        store.claim_plain(k, "t3", None, LONG).await,
        Ok(Claim::Completed(br#"{"v":1,"ok":7}"#.to_vec()))
    );
    let left = left_us(&store, k).await.unwrap();
    assert!(left > 86_000_000_000 && left <= 86_400_000_000, "{left}");
}

#[tokio::test]
async fn release_frees_the_key_only_for_its_holder() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    assert_eq!(
        store.claim_plain(k, "t1", None, LONG).await,
        Ok(Claim::Acquired)
    );
    for other in ["intruder", "t", "t1:", "t10", ""] {
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
    // The row stays, without its claim, to keep the key's generation and crash count.
    let left = left_us(&store, k)
        .await
        .expect("the row keeps the key's history");
    assert!(left > 86_000_000_000, "until the claim's TTL: {left} µs");
    assert_eq!(
        store.claim_plain(k, "t2", None, LONG).await,
        Ok(Claim::Acquired)
    );
    store.release(key("never-claimed"), "t").await.unwrap();
}

#[tokio::test]
async fn renew_extends_the_lease_only_for_its_holder() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    assert_eq!(
        store.claim_plain(k, "t1", None, SHORT).await,
        Ok(Claim::Acquired)
    );
    assert!(lease_left_us(&store, k).await.unwrap() <= 300_000);
    store.renew(k, "t1", LONG).await.unwrap();
    assert!(lease_left_us(&store, k).await.unwrap() > 59_000_000);
    assert_eq!(store.renew(k, "t2", SHORT).await, Err(Error::LeaseLost));
    assert!(
        lease_left_us(&store, k).await.unwrap() > 59_000_000,
        "a stranger's renew changes nothing"
    );
    assert_eq!(
        store.renew(key("absent"), "t1", LONG).await,
        Err(Error::LeaseLost)
    );
}

/// Claims `k` until it is acquired; panics after `within`. Returns when it was acquired.
async fn claim_when_free(store: &PgStore, k: StoreKey<'_>, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        match store.claim_plain(k, "successor", None, LONG).await {
            Ok(Claim::Acquired) => return Instant::now(),
            Ok(Claim::InProgress { retry_in }) => {
                assert!(Instant::now() < deadline, "still held after {within:?}");
                // Wait for as long as the database says the lease has left, a little at a time.
                tokio::time::sleep(retry_in.min(Duration::from_millis(20))).await;
            }
            // A completed record whose TTL has not run out yet.
            Ok(Claim::Completed(_)) => {
                assert!(Instant::now() < deadline, "still stored after {within:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("unexpected claim: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_lease_lapses_after_its_duration_and_not_before() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
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
    assert!(held_for >= SHORT - Duration::from_millis(1), "{held_for:?}");
    assert!(held_for < SHORT + Duration::from_secs(2), "{held_for:?}");
    // A completed record expires after its TTL the same way.
    store.complete(k, "successor", b"r", SHORT).await.unwrap();
    assert_eq!(
        store.claim_plain(k, "reader", None, LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    claim_when_free(&store, k, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_stale_token_can_neither_complete_release_nor_renew_its_successors_claim() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
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
    assert!(matches!(
        store.claim_plain(k, "third", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    assert!(lease_left_us(&store, k).await.unwrap() > 59_000_000);
    store.renew(k, "successor", LONG).await.unwrap();
    store
        .complete(k, "successor", b"result", DAY)
        .await
        .unwrap();
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
    // A claim whose lease lapsed, taken over by nobody, cannot be completed by its holder.
    let lapsed = key("lapsed");
    assert_eq!(
        store
            .claim_plain(lapsed, "slow", None, Duration::from_millis(1))
            .await,
        Ok(Claim::Acquired)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while lease_left_us(&store, lapsed).await.unwrap() > 0 {
        assert!(Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.complete(lapsed, "slow", b"late", DAY).await,
        Err(Error::LeaseLost)
    );
}

#[tokio::test]
async fn a_differing_fingerprint_is_key_reused_and_a_missing_one_never_mismatches() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("k");
    assert_eq!(
        store.claim_plain(k, "t1", Some("fp-a"), LONG).await,
        Ok(Claim::Acquired)
    );
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

#[tokio::test]
async fn racing_claims_of_one_key_acquire_it_exactly_once() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    for round in 0..20 {
        let name = format!("race-{round}");
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (store, name) = (store.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                store
                    .claim_plain(key(&name), &format!("t{t}"), None, LONG)
                    .await
                    .unwrap()
            }));
        }
        let mut acquired = 0;
        for task in tasks {
            match task.await.unwrap() {
                Claim::Acquired => acquired += 1,
                Claim::InProgress { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(acquired, 1, "round {round}");
    }
}

#[tokio::test]
async fn keys_scopes_and_results_of_any_size_and_bytes_are_stored_intact() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let big_key: String = (0..10_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut big_key_2 = big_key.clone();
    big_key_2.push('!');
    let pairs: Vec<(&str, String)> = vec![
        ("s", big_key.clone()),
        ("s", big_key_2),
        ("s", big_key[..200].into()),
        ("s", "nul\0byte".into()),
        ("s", "nul\0byte\0".into()),
        ("s", "\0".into()),
        ("s", "".into()),
        ("s", "#".into()),
        ("s", "#sha256:".into()),
        ("s", "café ☕".into()),
        ("it's \"quoted\"; DROP TABLE jobguard_keys; --", "k".into()),
        ("s'", "k".into()),
        ("s", "k".into()),
        ("s2", "k".into()),
        ("a\0b", "k".into()),
        ("a%00b", "k".into()),
    ];
    for (scope, k) in &pairs {
        let k = StoreKey { scope, key: k };
        assert_eq!(
            store.claim_plain(k, "t", None, LONG).await,
            Ok(Claim::Acquired),
            "{k:?}"
        );
    }
    assert_eq!(rows(&store).await, pairs.len() as i64, "one row per pair");
    // A result of 1 MB with every byte value, stored and read back byte for byte.
    let result: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 256) as u8).collect();
    for (i, (scope, k)) in pairs.iter().enumerate() {
        let k = StoreKey { scope, key: k };
        let mut record = result.clone();
        record.extend_from_slice(i.to_string().as_bytes());
        store.complete(k, "t", &record, DAY).await.unwrap();
    }
    for (i, (scope, k)) in pairs.iter().enumerate() {
        let k = StoreKey { scope, key: k };
        let Ok(Claim::Completed(got)) = store.claim_plain(k, "u", None, LONG).await else {
            panic!("{k:?} not completed");
        };
        assert_eq!(got.len(), result.len() + i.to_string().len());
        assert!(got.starts_with(&result) && got.ends_with(i.to_string().as_bytes()));
    }
    // A token or fingerprint with a NUL byte is refused in words, and nothing is written.
    let refused = store.claim_plain(key("fresh"), "t\0", None, LONG).await;
    assert!(
        matches!(&refused, Err(Error::Store(m)) if m.contains("0x00")),
        "{refused:?}"
    );
    let refused = store
        .claim_plain(key("fresh"), "t", Some("f\0"), LONG)
        .await;
    assert!(matches!(refused, Err(Error::Store(_))), "{refused:?}");
    assert_eq!(left_us(&store, key("fresh")).await, None);
}

#[tokio::test]
async fn migrate_is_idempotent_and_a_missing_table_says_to_run_it() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = PgStore::connect(&server.url()).await.unwrap();
    let missing = store.claim_plain(key("k"), "t", None, LONG).await;
    assert!(
        matches!(&missing, Err(Error::Store(m)) if m.contains("PgStore::migrate")),
        "{missing:?}"
    );
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    store.migrate().await.unwrap();
    assert_eq!(
        store.claim_plain(key("k"), "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    // The claim is one primary-key lookup, the purge one range scan of the expiry index.
    let plan = |sql: &'static str| {
        let pool = store.pool().clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SET LOCAL enable_seqscan = off")
                .execute(&mut *tx)
                .await
                .unwrap();
            let lines: Vec<String> = sqlx::query_scalar(sql).fetch_all(&mut *tx).await.unwrap();
            lines.join("\n")
        }
    };
    let claim = plan("EXPLAIN SELECT * FROM jobguard_keys WHERE scope = 's' AND key = 'k'").await;
    assert!(claim.contains("jobguard_keys_pkey"), "{claim}");
    let purge = plan(
        "EXPLAIN SELECT ctid FROM jobguard_keys WHERE token IS NULL AND expires_at <= now() \
         ORDER BY expires_at LIMIT 1000",
    )
    .await;
    assert!(purge.contains("jobguard_keys_completed_expiry"), "{purge}");
}

#[tokio::test]
async fn purge_deletes_expired_completed_rows_in_batches_and_nothing_else() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    // 2500 expired completed rows, more than two batches, written in one statement.
    sqlx::query(
        "INSERT INTO jobguard_keys (scope, key, token, result, expires_at) \
         SELECT 'old', i::text, NULL, '\\x00'::bytea, now() - interval '1 second' \
         FROM generate_series(1, 2500) i",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let live = key("live");
    store.claim_plain(live, "t", None, LONG).await.unwrap();
    store.complete(live, "t", b"r", DAY).await.unwrap();
    let held = key("held");
    store.claim_plain(held, "t", None, LONG).await.unwrap();
    let lapsed = key("lapsed-claim");
    store
        .claim_plain(lapsed, "t", None, Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(store.purge_expired().await, Ok(2500));
    assert_eq!(rows(&store).await, 3, "live results and claims stay");
    assert_eq!(store.purge_expired().await, Ok(0));
    assert_eq!(
        store.claim_plain(live, "u", None, LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
}

#[tokio::test]
async fn a_clone_shares_the_pool_and_an_unreachable_url_is_a_store_error() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let copy = store.clone();
    assert_eq!(
        store.claim_plain(key("k"), "t", None, LONG).await,
        Ok(Claim::Acquired)
    );
    assert!(matches!(
        copy.claim_plain(key("k"), "u", None, LONG).await,
        Ok(Claim::InProgress { .. })
    ));
    let port = server.port();
    drop((store, copy, server));
    let down = PgStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres")).await;
    assert!(matches!(down, Err(Error::Store(_))), "{down:?}");
    let bad = PgStore::connect("not a url").await;
    assert!(matches!(bad, Err(Error::Store(_))), "{bad:?}");
}

#[tokio::test]
async fn sqlx_errors_from_the_server_are_transient_or_permanent_by_their_code() {
    use jobguard::{Transient, Verdict};
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let pool = store.pool();
    let raise = |code: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::raw_sql(match code {
                "40001" => {
                    "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'serialization_failure'; END $$"
                }
                "40P01" => {
                    "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'deadlock_detected'; END $$"
                }
                "55P03" => {
                    "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'lock_not_available'; END $$"
                }
                _ => "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'check_violation'; END $$",
            })
            .execute(&pool)
            .await
            .unwrap_err()
        }
    };
    for code in ["40001", "40P01", "55P03"] {
        assert_eq!(raise(code).await.verdict(), Verdict::Retry, "{code}");
    }
    assert_eq!(raise("23514").await.verdict(), Verdict::Fail);
    sqlx::raw_sql("CREATE TABLE u (id int PRIMARY KEY CHECK (id > 0)); INSERT INTO u VALUES (1)")
        .execute(pool)
        .await
        .unwrap();
    for sql in [
        "INSERT INTO u VALUES (1)",
        "INSERT INTO u VALUES (-1)",
        "SELECT nope",
    ] {
        let e = sqlx::query(sql).execute(pool).await.unwrap_err();
        assert_eq!(e.verdict(), Verdict::Fail, "{sql}: {e}");
    }
    // A connection the server cut: transient.
    let mut conn = pool.acquire().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(pool)
        .await
        .unwrap();
    let cut = sqlx::query("SELECT 1")
        .execute(&mut *conn)
        .await
        .unwrap_err();
    assert_eq!(cut.verdict(), Verdict::Retry, "{cut:?}");
}

/// The table as versions before crash counting made it.
const FIRST_MIGRATION: &str = r#"
CREATE TABLE IF NOT EXISTS jobguard_keys (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    token       text,
    fingerprint text,
    result      bytea,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key),
    CONSTRAINT jobguard_keys_claimed_or_completed CHECK ((token IS NULL) <> (result IS NULL))
);
CREATE INDEX IF NOT EXISTS jobguard_keys_completed_expiry
    ON jobguard_keys (expires_at) WHERE token IS NULL;
"#;

#[tokio::test]
async fn migrate_upgrades_a_table_made_before_crash_counting_and_reads_its_rows() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = PgStore::connect(&server.url()).await.unwrap();
    sqlx::raw_sql(FIRST_MIGRATION)
        .execute(store.pool())
        .await
        .unwrap();
    let (scope, _) = PgStore::row_key(key("x"));
    sqlx::query(
        "INSERT INTO jobguard_keys (scope, key, token, fingerprint, result, expires_at) VALUES \
         ($1, 'done', NULL, 'fp', '\\x7b7d'::bytea, now() + interval '1 hour'), \
         ($1, 'held', 'old-token', NULL, NULL, now() + interval '1 minute'), \
         ($1, 'lapsed', 'dead-token', NULL, NULL, now() - interval '1 second')",
    )
    .bind(&*scope)
    .execute(store.pool())
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let constraints: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = 'jobguard_keys'::regclass AND contype = 'c'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(constraints, ["jobguard_keys_claim_or_result"]);

    let options = ClaimOptions::new(LONG).fingerprint(Some("fp"));
    assert_eq!(
        store.claim(key("done"), "t", options).await,
        Ok(Claimed::Completed(b"{}".to_vec()))
    );
    // An old claim's lease is its row's expiry: live until then, its holder's to complete.
    let Ok(Claimed::InProgress { retry_in }) = store.claim(key("held"), "t", options).await else {
        panic!("an old claim is in progress");
    };
    assert!(retry_in > Duration::from_secs(50), "{retry_in:?}");
    store
        .renew(key("held"), "old-token", LONG)
        .await
        .expect("the old holder renews");
    store
        .complete(key("held"), "old-token", b"r", DAY)
        .await
        .expect("the old holder completes");
    // A claim whose row expired is free: a new generation, its crash not counted.
    assert_eq!(
        store.claim(key("lapsed"), "t", options).await,
        Ok(Claimed::Acquired {
            generation: 1,
            crashes: 0,
            attempts: 1,
            steps: Some(Vec::new()),
        })
    );
}

/// The claim statement of the build before crash counting, as it ran then: it takes over a row
/// whose `expires_at` passed and knows nothing of `lease_ends_at` or `generation`.
const FIRST_CLAIM: &str = r#"
INSERT INTO jobguard_keys AS k (scope, key, token, fingerprint, result, expires_at)
VALUES ($1, $2, $3, NULL, NULL, now() + interval '1 minute')
ON CONFLICT (scope, key) DO UPDATE
    SET token = excluded.token, fingerprint = excluded.fingerprint,
        result = NULL, expires_at = excluded.expires_at
    WHERE k.expires_at <= now()
RETURNING 1
"#;

#[tokio::test]
async fn a_claim_taken_over_by_an_earlier_build_is_live_until_its_expiry() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = connect(&server).await;
    let k = key("rolling");
    let options = ClaimOptions::new(LONG);
    assert_eq!(
        store.claim(k, "new-token", options).await,
        Ok(Claimed::Acquired {
            generation: 1,
            crashes: 0,
            attempts: 1,
            steps: Some(Vec::new()),
        })
    );
    // The claim and its row lapse (moved into the past rather than waited for).
    pg_job::lapse(store.pool(), k).await;
    let (scope, stored) = PgStore::row_key(k);
    // Poisoned, too: the earlier build takes over any row that expired.
    sqlx::query(
        "UPDATE jobguard_keys SET poisoned = true, crashes = 3 WHERE scope = $1 AND key = $2",
    )
    .bind(&*scope)
    .bind(&*stored)
    .execute(store.pool())
    .await
    .unwrap();
    // A worker of the earlier build takes the row over: its claim is live for a minute.
    let taken = sqlx::query(FIRST_CLAIM)
        .bind(&*scope)
        .bind(&*stored)
        .bind("old-token")
        .fetch_optional(store.pool())
        .await
        .unwrap();
    assert!(taken.is_some(), "the earlier build takes the expired row");
    let lease = lease_left_us(&store, k).await.expect("a row");
    assert!(lease > 50_000_000, "its lease is its expiry: {lease} µs");
    // This build sees that claim as held, not as abandoned: no second holder, no crash.
    let Ok(Claimed::InProgress { retry_in }) = store.claim(k, "t", options).await else {
        panic!("the earlier build's claim is in progress");
    };
    assert!(retry_in > Duration::from_secs(50), "{retry_in:?}");
    store
        .complete(k, "old-token", b"r", DAY)
        .await
        .expect("the earlier build's holder completes");
    assert_eq!(
        store.claim(k, "t", options).await,
        Ok(Claimed::Completed(b"r".to_vec()))
    );
}
