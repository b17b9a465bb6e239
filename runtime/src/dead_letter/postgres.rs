//! Dead letters in a Postgres table (feature `postgres`): they outlive the process, sit beside
//! the jobs' own data, and an operator lists, filters, inspects, removes and redrives them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), jobguard::Error> {
//! use jobguard::dead_letter::postgres::PgDeadLetters;
//!
//! let letters = PgDeadLetters::connect("postgres://jobs@127.0.0.1/jobs").await?;
//! letters.migrate().await?; // or apply `PgStore::MIGRATION` with your own migration tool
//! let runtime = jobguard::Runtime::builder().dead_letters(letters.clone()).build();
//! # drop(runtime);
//! for (id, letter) in letters.list().await? {
//!     match letter {
//!         Ok(letter) => println!("{id}: {} gave up ({}): {}", letter.job, letter.reason, letter.error),
//!         Err(why) => println!("{id}: {why}"),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # The table
//!
//! [`PgStore::MIGRATION`](crate::PgStore::MIGRATION) creates `jobguard_dead_letters`, one row a
//! letter:
//!
//! | column | holds |
//! |---|---|
//! | `id` | `bigserial`: the letter's id, in the order letters came |
//! | `job`, `key`, `reason`, `error` | copies of the letter's fields, for the filters (a NUL byte, which `text` cannot hold, written U+FFFD) |
//! | `record` | the letter's record ([`encode`]), what [`get`](PgDeadLetters::get) reads back |
//! | `created_at` | when the row was written |
//!
//! Indexes on `(job, id)`, `(key, id)` and `(reason, id)` make a page filtered by one of them
//! an index scan from its cursor; the error-text filter (`strpos(lower(error), lower(text))`)
//! reads the rows the other filters leave. A row whose `record` does not decode is *corrupt*:
//! listed in its place as [`Error::Corrupt`], never skipped, and removable by its id.

use super::{
    Browse, BrowseFuture, DeadLetter, DeadLetterSink, Filter, Page, RedriveError, SinkFuture,
    browse::number_id, decode, encode,
};
use crate::Error;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, QueryBuilder};
use std::future::Future;
use std::time::Duration;

/// Rows read per query by [`list`](PgDeadLetters::list).
const PAGE: i64 = 500;

/// Dead letters in the table `jobguard_dead_letters`. `Clone` shares the pool.
#[derive(Clone, Debug)]
pub struct PgDeadLetters {
    pool: PgPool,
}

impl PgDeadLetters {
    /// Connects a pool of up to 10 connections to `url`, as
    /// [`PgStore::connect`](crate::PgStore::connect) does. A malformed URL or an unreachable
    /// database is [`Error::Store`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(2))
            .connect(url)
            .await
            .map_err(|e| store_error("cannot connect to Postgres", &e))?;
        Ok(PgDeadLetters { pool })
    }

    /// Letters on a pool the caller built (a [`PgStore`](crate::PgStore)'s `pool()` shares one).
    pub fn new(pool: PgPool) -> Self {
        PgDeadLetters { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates the table and its indexes unless they exist: the store's migration
    /// ([`PgStore::migrate`](crate::PgStore::migrate)), which holds both tables.
    pub async fn migrate(&self) -> Result<(), Error> {
        crate::PgStore::new(self.pool.clone()).migrate().await
    }

    /// Appends one letter and returns its id.
    pub async fn add(&self, letter: &DeadLetter) -> Result<String, Error> {
        let clean = |s: &str| s.replace('\0', "\u{FFFD}");
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO jobguard_dead_letters (job, key, reason, error, record) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(clean(&letter.job))
        .bind(letter.key.as_deref().map(clean))
        .bind(letter.reason.as_str())
        .bind(clean(&letter.error))
        .bind(encode(letter))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| store_error("dead letter not written", &e))?;
        Ok(id.to_string())
    }

    /// Every row, oldest first: its id, and its letter or, for a corrupt row,
    /// [`Error::Corrupt`] naming its id and why. `Err` as a whole only when the table cannot be
    /// read ([`Error::Store`]).
    pub async fn list(&self) -> Result<Vec<(String, Result<DeadLetter, Error>)>, Error> {
        let mut letters = Vec::new();
        let mut after = 0i64;
        loop {
            let rows: Vec<(i64, String)> = sqlx::query_as(
                "SELECT id, record FROM jobguard_dead_letters WHERE id > $1 ORDER BY id LIMIT $2",
            )
            .bind(after)
            .bind(PAGE)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| store_error("dead letters not read", &e))?;
            let full = rows.len() as i64 == PAGE;
            for (id, record) in rows {
                after = id;
                letters.push((id.to_string(), decode_row(id, &record)));
            }
            if !full {
                return Ok(letters);
            }
        }
    }

    /// How many rows the table holds, corrupt ones included.
    pub async fn len(&self) -> Result<usize, Error> {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM jobguard_dead_letters")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| store_error("dead letters not counted", &e))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// `true` when the table holds no letter.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The letter `id`, or `None` when there is none (or `id` is not a row number). A corrupt
    /// row is [`Error::Corrupt`].
    pub async fn get(&self, id: &str) -> Result<Option<DeadLetter>, Error> {
        match self.entry(id).await? {
            Some(letter) => letter.map(Some),
            None => Ok(None),
        }
    }

    /// Removes the row `id`, letter or not: `true` when there was one.
    pub async fn remove(&self, id: &str) -> Result<bool, Error> {
        let Some(id) = number_id(id) else {
            return Ok(false);
        };
        let done = sqlx::query("DELETE FROM jobguard_dead_letters WHERE id = $1")
            .bind(id as i64)
            .execute(&self.pool)
            .await
            .map_err(|e| store_error("dead letter not removed", &e))?;
        Ok(done.rows_affected() == 1)
    }

    /// Runs `job` on the letter `id` and removes the letter only when `job` succeeds, as
    /// [`RedisDeadLetters::redrive`](super::redis::RedisDeadLetters::redrive) does (feature
    /// `redis`): `Ok(false)` when there is no letter `id`; the letter's job giving up again
    /// inside `job` writes no second letter; a `crashed` letter's key is forgiven once.
    ///
    /// ```no_run
    /// # async fn demo(letters: jobguard::dead_letter::postgres::PgDeadLetters) {
    /// let redriven = letters
    ///     .redrive("42", |letter| async move {
    ///         println!("running {} again", letter.job);
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await;
    /// # drop(redriven);
    /// # }
    /// ```
    pub async fn redrive<F, Fut, T, E>(&self, id: &str, job: F) -> Result<bool, RedriveError<E>>
    where
        F: FnOnce(DeadLetter) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let Some(letter) = self.get(id).await.map_err(RedriveError::Store)? else {
            return Ok(false);
        };
        let (job_name, key, reason) = (letter.job.clone(), letter.key.clone(), letter.reason);
        super::redriving(job_name, key, reason, job(letter))
            .await
            .map_err(RedriveError::Job)?;
        self.remove(id).await.map_err(RedriveError::Store)?;
        Ok(true)
    }

    async fn entry(&self, id: &str) -> Result<Option<Result<DeadLetter, Error>>, Error> {
        let Some(id) = number_id(id) else {
            return Ok(None);
        };
        let row: Option<(String,)> =
            sqlx::query_as("SELECT record FROM jobguard_dead_letters WHERE id = $1")
                .bind(id as i64)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| store_error("dead letter not read", &e))?;
        Ok(row.map(|(record,)| decode_row(id as i64, &record)))
    }
}

/// `WHERE` conditions for `filter` and a cursor, on the builder.
fn conditions(q: &mut QueryBuilder<Postgres>, filter: &Filter, before: Option<i64>) {
    q.push(" WHERE true");
    if let Some(before) = before {
        q.push(" AND id < ").push_bind(before);
    }
    if let Some(job) = &filter.job {
        q.push(" AND job = ").push_bind(job.clone());
    }
    if let Some(reason) = filter.reason {
        q.push(" AND reason = ").push_bind(reason.as_str());
    }
    if let Some(key) = &filter.key {
        q.push(" AND key = ").push_bind(key.clone());
    }
    if let Some(text) = &filter.text {
        q.push(" AND strpos(lower(error), lower(")
            .push_bind(text.replace('\0', "\u{FFFD}"))
            .push(")) > 0");
    }
}

/// One query for a page (`ORDER BY id DESC LIMIT limit + 1`, an index scan from the cursor),
/// one `count(*)` for a count.
impl Browse for PgDeadLetters {
    fn page<'a>(
        &'a self,
        filter: &'a Filter,
        before: Option<&'a str>,
        limit: usize,
    ) -> BrowseFuture<'a, Page> {
        Box::pin(async move {
            let before = before.and_then(number_id).map(|n| n as i64);
            let mut q =
                QueryBuilder::<Postgres>::new("SELECT id, record FROM jobguard_dead_letters");
            conditions(&mut q, filter, before);
            q.push(" ORDER BY id DESC LIMIT ")
                .push_bind(i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1);
            let rows: Vec<(i64, String)> = q
                .build_query_as()
                .fetch_all(&self.pool)
                .await
                .map_err(|e| store_error("dead letters not read", &e))?;
            let more = rows.len() > limit;
            let mut entries: Vec<_> = rows
                .into_iter()
                .take(limit)
                .map(|(id, record)| (id.to_string(), decode_row(id, &record)))
                .collect();
            entries.shrink_to_fit();
            let next = more
                .then(|| entries.last().map(|(id, _)| id.clone()))
                .flatten();
            Ok(Page { entries, next })
        })
    }

    fn count<'a>(&'a self, filter: &'a Filter) -> BrowseFuture<'a, u64> {
        Box::pin(async move {
            let mut q = QueryBuilder::<Postgres>::new("SELECT count(*) FROM jobguard_dead_letters");
            conditions(&mut q, filter, None);
            let (n,): (i64,) = q
                .build_query_as()
                .fetch_one(&self.pool)
                .await
                .map_err(|e| store_error("dead letters not counted", &e))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, Option<Result<DeadLetter, Error>>> {
        Box::pin(self.entry(id))
    }

    fn remove<'a>(&'a self, id: &'a str) -> BrowseFuture<'a, bool> {
        Box::pin(PgDeadLetters::remove(self, id))
    }

    fn is_id(&self, id: &str) -> bool {
        number_id(id).is_some()
    }
}

impl DeadLetterSink for PgDeadLetters {
    fn send(&self, letter: DeadLetter) -> SinkFuture<'_> {
        Box::pin(async move { self.add(&letter).await.map(drop) })
    }
}

fn decode_row(id: i64, record: &str) -> Result<DeadLetter, Error> {
    decode(record.as_bytes()).map_err(|e| match e {
        Error::Corrupt(why) => {
            Error::Corrupt(format!("dead letter {id} in jobguard_dead_letters: {why}"))
        }
        other => other,
    })
}

fn store_error(what: &str, e: &sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = e
        && db.code().as_deref() == Some("42P01")
    {
        return Error::Store(format!(
            "{what}: {e} (create the table with PgDeadLetters::migrate() or PgStore::MIGRATION)"
        ));
    }
    Error::Store(format!("{what}: {e}"))
}
