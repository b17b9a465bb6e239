//! What the Postgres tests' jobs share: an error that is the database's or jobguard's (or a
//! made-up transient one), classified as jobguard classifies each, a pool with a patient
//! acquire timeout for tests that race many deliveries, and the count and the ids of a job's
//! effect rows.

use jobguard::{PgStore, StoreKey, Transient, Verdict};
use sqlx::postgres::{PgPool, PgPoolOptions};
use std::time::Duration;

/// A job's error: the database's, jobguard's, or a failure a test makes up to be retried.
#[derive(Debug)]
pub enum JobError {
    /// The database's error, retried as `impl Transient for sqlx::Error` says.
    Db(sqlx::Error),
    /// jobguard's own error, retried as `impl Transient for jobguard::Error` says.
    Guard(jobguard::Error),
    /// A failure made up by a test, always retried.
    Flaky,
}

impl From<sqlx::Error> for JobError {
    fn from(e: sqlx::Error) -> Self {
        JobError::Db(e)
    }
}

impl From<jobguard::Error> for JobError {
    fn from(e: jobguard::Error) -> Self {
        JobError::Guard(e)
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Db(e) => write!(f, "database: {e}"),
            JobError::Guard(e) => write!(f, "jobguard: {e}"),
            JobError::Flaky => f.write_str("flaky"),
        }
    }
}

impl Transient for JobError {
    fn verdict(&self) -> Verdict {
        match self {
            JobError::Db(e) => e.verdict(),
            JobError::Guard(e) => e.verdict(),
            JobError::Flaky => Verdict::Retry,
        }
    }
}

/// A pool of up to `size` connections to `url` that waits up to a minute for a connection, so
/// that tests racing more deliveries than connections queue instead of failing.
pub async fn pool(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await
        .expect("connect")
}

/// Moves the lease and the expiry of `key`'s row into the past, as if its worker had died long
/// ago: the tests run on the database's clock, which they cannot advance.
pub async fn lapse(pool: &PgPool, key: StoreKey<'_>) {
    let (scope, stored) = PgStore::row_key(key);
    sqlx::query(
        "UPDATE jobguard_keys SET lease_ends_at = now() - interval '2 seconds', \
         expires_at = now() - interval '1 second' WHERE scope = $1 AND key = $2",
    )
    .bind(&*scope)
    .bind(&*stored)
    .execute(pool)
    .await
    .expect("move the row into the past");
}

/// Makes the tests' `effects` table on `pool`: an `id bigserial` and the `key` a job's effect
/// was written for.
pub async fn make_effects(pool: &PgPool) {
    sqlx::raw_sql("CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL)")
        .execute(pool)
        .await
        .expect("make the effects table");
}

/// The rows of the tests' `effects` table written for `key`: how many times a job's effect
/// landed (the table [`make_effects`] makes).
pub async fn effects(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("count the effects")
}

/// The ids of the tests' `effects` rows written for `key`, in id order: which attempt's effect
/// landed (for a table whose `id` column is a `bigserial`).
pub async fn effect_ids(pool: &PgPool, key: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM effects WHERE key = $1 ORDER BY id")
        .bind(key)
        .fetch_all(pool)
        .await
        .expect("read the effects' ids")
}
