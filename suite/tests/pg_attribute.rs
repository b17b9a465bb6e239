//! `#[idempotent(key = ..., transaction = tx)]` against a private `postgres`: the key in the
//! caller's transaction through the attribute, for both parameter types, and with `#[retry]`
//! each attempt in a savepoint that a failed one rolls back.

use jobguard_testkit::pg_job::{JobError, effects, make_effects};
use jobguard_testkit::postgres;

use jobguard::PgStore;
use postgres::PgServer;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use std::sync::atomic::{AtomicU32, Ordering};

#[jobguard::idempotent(key = order, transaction = tx)]
async fn on_connection(tx: &mut PgConnection, order: &str) -> Result<i64, JobError> {
    let id: i64 = sqlx::query_scalar("INSERT INTO effects (key) VALUES ($1) RETURNING id")
        .bind(order)
        .fetch_one(&mut *tx)
        .await?;
    Ok(id)
}

#[jobguard::idempotent(key = order, transaction = tx, scope = "tests.attribute")]
async fn on_transaction(tx: &mut Transaction<'_, Postgres>, order: &str) -> Result<i64, JobError> {
    // Inside the body, `tx` is the transaction's `&mut PgConnection`.
    let id: i64 = sqlx::query_scalar("INSERT INTO effects (key) VALUES ($1) RETURNING id")
        .bind(order)
        .fetch_one(&mut *tx)
        .await?;
    Ok(id)
}

static ATTEMPTS: AtomicU32 = AtomicU32::new(0);

#[jobguard::idempotent(key = order, transaction = tx)]
#[jobguard::retry(attempts = 3, base = "1ms", cap = "2ms")]
async fn flaky_once(tx: &mut PgConnection, order: &str) -> Result<i64, JobError> {
    let id: i64 = sqlx::query_scalar("INSERT INTO effects (key) VALUES ($1) RETURNING id")
        .bind(order)
        .fetch_one(&mut *tx)
        .await?;
    if ATTEMPTS.fetch_add(1, Ordering::Relaxed) == 0 {
        return Err(JobError::Flaky);
    }
    Ok(id)
}

static RATIOS: AtomicU32 = AtomicU32::new(0);

/// `NaN` the first time (JSON keeps it as `null`, which does not read back as an `f64`).
#[jobguard::idempotent(key = order, transaction = tx)]
async fn ratio(tx: &mut PgConnection, order: &str) -> Result<f64, JobError> {
    sqlx::query("INSERT INTO effects (key) VALUES ($1)")
        .bind(order)
        .execute(&mut *tx)
        .await?;
    Ok(if RATIOS.fetch_add(1, Ordering::Relaxed) == 0 {
        f64::NAN
    } else {
        0.5
    })
}

async fn setup(server: &PgServer) -> PgPool {
    let store = PgStore::connect(&server.url()).await.unwrap();
    store.migrate().await.unwrap();
    make_effects(store.pool()).await;
    store.pool().clone()
}

#[tokio::test]
async fn both_parameter_types_replay_after_the_commit() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = setup(&server).await;
    let mut results = Vec::new();
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        results.push(on_connection(&mut tx, "a").await.unwrap());
        results.push(on_transaction(&mut tx, "b").await.unwrap());
        tx.commit().await.unwrap();
    }
    assert_eq!(results[0], results[2]);
    assert_eq!(results[1], results[3]);
    assert_eq!(
        (effects(&pool, "a").await, effects(&pool, "b").await),
        (1, 1)
    );
    // Rolled back: a later delivery runs.
    let mut tx = pool.begin().await.unwrap();
    on_connection(&mut tx, "c").await.unwrap();
    drop(tx);
    assert_eq!(effects(&pool, "c").await, 0);
}

#[tokio::test]
async fn with_retry_a_failed_attempt_is_rolled_back_to_its_savepoint() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = setup(&server).await;
    let mut tx = pool.begin().await.unwrap();
    let id = flaky_once(&mut tx, "r").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ATTEMPTS.load(Ordering::Relaxed), 2);
    assert_eq!(
        effects(&pool, "r").await,
        1,
        "the first attempt's row was rolled back"
    );
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(flaky_once(&mut tx, "r").await.unwrap(), id, "replayed");
    assert_eq!(ATTEMPTS.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn a_result_that_cannot_be_replayed_fails_the_call_and_leaves_no_claim() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = setup(&server).await;
    let mut tx = pool.begin().await.unwrap();
    match ratio(&mut tx, "n").await {
        Err(JobError::Guard(jobguard::Error::Unreplayable(why))) => {
            assert!(why.contains("roll the transaction back"), "{why}")
        }
        other => panic!("expected Unreplayable, got {other:?}"),
    }
    // A caller that commits anyway commits the body's row, but no claim on the key: the next
    // delivery runs at once (not `InProgress`), and its result is kept.
    tx.commit().await.unwrap();
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        assert_eq!(ratio(&mut tx, "n").await.unwrap(), 0.5);
        tx.commit().await.unwrap();
    }
    assert_eq!(
        RATIOS.load(Ordering::Relaxed),
        2,
        "the second commit replayed"
    );
    assert_eq!(effects(&pool, "n").await, 2);
}

/// Compiles only if each job, awaited inside a transaction, can be spawned on a multi-threaded
/// runtime (`Send + 'static`).
fn spawnable(pool: PgPool) {
    fn spawn<F: std::future::Future + Send + 'static>(_: F) {}
    let p = pool.clone();
    spawn(async move {
        let mut tx = p.begin().await?;
        on_connection(&mut tx, "k").await?;
        on_transaction(&mut tx, "k").await?;
        flaky_once(&mut tx, "k").await?;
        tx.commit().await?;
        Ok::<_, JobError>(())
    });
    let mut conn = None::<PgConnection>;
    spawn(async move {
        if let Some(conn) = conn.as_mut() {
            on_connection(conn, "k").await?;
        }
        Ok::<_, JobError>(())
    });
}

#[test]
fn the_futures_are_send() {
    let _ = spawnable;
}
