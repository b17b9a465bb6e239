//! Postgres going away: stopped before or while a job runs, the job fails closed with
//! `Error::Store` and leaves no effect; restarted, the same store and pool work again.

use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::{pg_job::make_effects, postgres};

use jobguard::idempotency::Idempotent;
use jobguard::store::postgres::PgStore;
use jobguard::{Error, StoreKey};
use postgres::PgServer;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_fails_closed_and_the_same_store_works_once_it_is_back() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    let store = PgStore::connect(&server.url()).await.unwrap();
    store.migrate().await.unwrap();
    let ran = AtomicU32::new(0);
    let job = |key: &'static str| {
        let (store, ran) = (store.clone(), &ran);
        async move {
            Idempotent::new("tests.faults", key)
                .store(&store)
                .run(async {
                    ran.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, Error>(7)
                })
                .await
        }
    };
    assert_eq!(job("before").await, Ok(7));

    server.stop();
    let down = job("while-down").await;
    assert!(matches!(down, Err(Error::Store(_))), "{down:?}");
    assert_eq!(ran.load(Ordering::Relaxed), 1, "the body did not run");
    let claim = store
        .claim_plain(
            StoreKey {
                scope: "s",
                key: "k",
            },
            "t",
            None,
            Duration::from_secs(5),
        )
        .await;
    assert!(matches!(claim, Err(Error::Store(_))), "{claim:?}");

    server.restart();
    assert_eq!(job("while-down").await, Ok(7));
    assert_eq!(ran.load(Ordering::Relaxed), 2);
    assert_eq!(job("while-down").await, Ok(7), "replayed");
    assert_eq!(job("before").await, Ok(7), "kept across the restart");
    assert_eq!(ran.load(Ordering::Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_stopped_inside_the_transaction_leaves_no_effect_and_no_key() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    let store = PgStore::connect(&server.url()).await.unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    make_effects(&pool).await;

    let mut tx = pool.begin().await.unwrap();
    let cut: Result<i32, Error> = PgStore::in_transaction(&mut tx, "tests.faults", "k")
        .run(async |tx| {
            sqlx::query("INSERT INTO effects (key) VALUES ('k')")
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::Store(e.to_string()))?;
            // The database goes away after the effect's insert, before the result is written.
            tokio::task::block_in_place(|| server.stop());
            Ok(1)
        })
        .await;
    assert!(matches!(cut, Err(Error::Store(_))), "{cut:?}");
    assert!(tx.commit().await.is_err(), "nothing to commit to");

    server.restart();
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT count(*) FROM effects").await, 0);
    assert_eq!(count("SELECT count(*) FROM jobguard_keys").await, 0);
    let mut tx = pool.begin().await.unwrap();
    let again: i32 = PgStore::in_transaction(&mut tx, "tests.faults", "k")
        .run(async |tx| {
            sqlx::query("INSERT INTO effects (key) VALUES ('k')")
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::Store(e.to_string()))?;
            Ok::<_, Error>(2)
        })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again, 2);
    assert_eq!(count("SELECT count(*) FROM effects").await, 1);
    assert_eq!(
        store
            .claim_plain(
                StoreKey {
                    scope: "tests.faults",
                    key: "k"
                },
                "t",
                None,
                Duration::from_secs(5)
            )
            .await,
        Ok(Claim::Completed(br#"{"v":1,"ok":2}"#.to_vec()))
    );
}
