//! The three-step checkout on `PgStore`, against a private `postgres`: the receipt fails twice
//! under `#[retry]` around the job and each effect happens once; a worker process killed with
//! `SIGKILL` after the reservation leaves its steps in `jobguard_steps`, and the next run, in
//! this process, resumes at the receipt; a completed job's steps are gone.

use jobguard::{PgStore, Runtime, Transient};
use jobguard_testkit::postgres::PgServer;
use jobguard_testkit::redis::rerun_test;
use sqlx::PgPool;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Set to a Postgres URL, it makes the `worker` test run the job and stop after the reservation.
const WORKER_ENV: &str = "JOBGUARD_STEPS_PG_WORKER";

#[derive(Debug, Transient)]
enum ShopError {
    #[transient]
    MailDown,
    #[transient(from)]
    Db(sqlx::Error),
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<sqlx::Error> for ShopError {
    fn from(e: sqlx::Error) -> Self {
        ShopError::Db(e)
    }
}

impl From<jobguard::Error> for ShopError {
    fn from(e: jobguard::Error) -> Self {
        ShopError::Jobguard(e)
    }
}

/// The mail server is down for this many more sends.
static MAIL_OUTAGES: AtomicU32 = AtomicU32::new(0);

async fn effect(pool: &PgPool, order: &str, what: &str) -> Result<i64, ShopError> {
    let n = sqlx::query_scalar(
        "INSERT INTO shop_effects (order_id, effect) VALUES ($1, $2) RETURNING \
         (SELECT count(*) + 1 FROM shop_effects WHERE order_id = $1 AND effect = $2)",
    )
    .bind(order)
    .bind(what)
    .fetch_one(pool)
    .await?;
    Ok(n)
}

async fn count(pool: &PgPool, order: &str, what: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM shop_effects WHERE order_id = $1 AND effect = $2")
        .bind(order)
        .bind(what)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn steps_kept(pool: &PgPool, order: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT step FROM jobguard_steps WHERE key = $1 ORDER BY step")
        .bind(order)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[jobguard::step(name = "capture.v1")]
async fn capture(pool: &PgPool, order: &str) -> Result<i64, ShopError> {
    effect(pool, order, "capture").await
}

#[jobguard::step(name = "reserve.v1")]
async fn reserve(pool: &PgPool, order: &str) -> Result<i64, ShopError> {
    effect(pool, order, "reserve").await
}

#[jobguard::step(name = "receipt.v1")]
async fn receipt(pool: &PgPool, order: &str, payment: i64) -> Result<String, ShopError> {
    let down = MAIL_OUTAGES.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    if down.is_ok() {
        return Err(ShopError::MailDown);
    }
    effect(pool, order, "receipt").await?;
    Ok(format!("receipt for {order}, payment {payment}"))
}

#[jobguard::idempotent(key = order, scope = "pg.checkout", lease = "1s")]
#[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms", jitter = none)]
async fn checkout(
    pool: &PgPool,
    order: &str,
    stop_after_reserve: bool,
) -> Result<String, ShopError> {
    let payment = capture(pool, order).await?;
    reserve(pool, order).await?;
    if stop_after_reserve {
        // Tell the test, then wait to be killed.
        effect(pool, order, "stopped").await?;
        std::future::pending::<()>().await;
    }
    receipt(pool, order, payment).await
}

async fn store(url: &str) -> PgStore {
    let store = PgStore::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS shop_effects (order_id text, effect text)")
        .execute(store.pool())
        .await
        .unwrap();
    store
}

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = store(&url).await;
        let pool = store.pool().clone();
        let runtime = Runtime::builder().store(store).build();
        let _ = runtime.scope(checkout(&pool, "order-killed", true)).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_step_checkout_on_postgres() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let url = server.url();
    let store = store(&url).await;
    let pool = store.pool().clone();
    let runtime = Runtime::builder().store(store).build();

    // The receipt fails twice; the retries replay the capture and the reservation.
    MAIL_OUTAGES.store(2, Ordering::SeqCst);
    let sent = runtime
        .scope(checkout(&pool, "order-1", false))
        .await
        .unwrap();
    assert_eq!(sent, "receipt for order-1, payment 1");
    for what in ["capture", "reserve", "receipt"] {
        assert_eq!(count(&pool, "order-1", what).await, 1, "{what}");
    }
    assert!(
        steps_kept(&pool, "order-1").await.is_empty(),
        "completed: its steps are gone"
    );

    // A worker process killed after the reservation: its steps stay in the table.
    let mut child = rerun_test("worker")
        .env(WORKER_ENV, &url)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&pool, "order-killed", "stopped").await == 0 {
        assert!(
            Instant::now() < deadline,
            "the worker never reached its stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        steps_kept(&pool, "order-killed").await,
        ["capture.v1", "reserve.v1"]
    );

    // The next run waits out the dead worker's lease, then resumes at the receipt.
    let deadline = Instant::now() + Duration::from_secs(30);
    let sent = loop {
        match runtime.scope(checkout(&pool, "order-killed", false)).await {
            Err(ShopError::Jobguard(jobguard::Error::InProgress)) => {
                assert!(
                    Instant::now() < deadline,
                    "the dead worker's lease never lapsed"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            done => break done.unwrap(),
        }
    };
    assert_eq!(sent, "receipt for order-killed, payment 1");
    for what in ["capture", "reserve", "receipt"] {
        assert_eq!(count(&pool, "order-killed", what).await, 1, "{what}");
    }
    assert!(steps_kept(&pool, "order-killed").await.is_empty());
}
