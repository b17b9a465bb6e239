//! The Postgres store (feature `postgres`): claims and results in one table, shared by every
//! worker that reaches the database, and the key claimed in the caller's own transaction.
//!
//! Two ways to use it:
//!
//! * **As a [`Store`]**, like [`RedisStore`](crate::RedisStore): `#[idempotent]` claims the key,
//!   runs the job, stores the result. The job's side effect and the result's write are separate,
//!   so the window described in [`idempotent`](crate::idempotent#the-window) remains.
//! * **In the caller's transaction**, with [`PgStore::in_transaction`]: the key row, the body's
//!   writes and the stored result share one transaction, which the caller commits. A crash before
//!   the commit leaves neither the effect nor the key: there is no window. This is the form to use
//!   when the side effect is a write to the same database.
//! * **In a transaction jobguard begins**, with [`PgStore::begin`]: the same, with the claim sent
//!   in the `BEGIN`'s round trip and the commit made by jobguard after the result. One round trip
//!   beyond the transaction the job would send without jobguard, where joining the caller's
//!   transaction costs two (see "Round trips" in [`InTransaction::run`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), jobguard::Error> {
//! use jobguard::PgStore;
//!
//! let store = PgStore::connect("postgres://app@127.0.0.1/app").await?;
//! store.migrate().await?; // or apply `PgStore::MIGRATION` with your own migration tool
//! let runtime = jobguard::Runtime::builder().store(store).build();
//! let _ = runtime.install(); // the first install wins; a second hands its runtime back
//! # Ok(()) }
//! ```
//!
//! # The table
//!
//! [`PgStore::MIGRATION`] creates `jobguard_keys`, one row per `(scope, key)`:
//!
//! | column | while claimed | once completed | released | poisoned |
//! |---|---|---|---|---|
//! | `scope`, `key` | the key, see below | the same | the same | the same |
//! | `token` | the claim's token | `NULL` | `NULL` | `NULL` |
//! | `fingerprint` | the claim's fingerprint, or `NULL` | kept | kept | kept |
//! | `result` | `NULL` | the stored result's bytes, opaque to the store | `NULL` | `NULL` |
//! | `expires_at` | when the row may go: the TTL (or the lease, if longer) from the claim | the end of the TTL | the claim's | the end of the TTL |
//! | `lease_ends_at` | the end of the lease | `NULL` | `NULL` | the end of the letter role's lease while `lettered` is `false` |
//! | `generation` | the claim's number among the key's claims, from 1 | kept | kept | kept |
//! | `crashes` | abandoned claims counted | kept | kept | kept |
//! | `poisoned` | `false` | `false` | `false` | `true` |
//! | `lettered` | `true` | `true` | `true` | `false` until the job's dead letter is confirmed ([`Store::lettered`]) |
//!
//! A claim's row outlives its lease (until `expires_at`), so that a claim whose lease lapsed is
//! found, taken over and counted by the next claim ([`Claimed`]); a released row keeps the key's
//! generation and crash count. A `CHECK` keeps `token` and `result` from being set together, so
//! no row is half claim and half result. The primary key `(scope, key)` makes a claim one index
//! lookup, and a partial index on `expires_at` of the rows without a claim makes
//! [`PgStore::purge_expired`] one range scan.
//!
//! The columns `lease_ends_at`, `generation`, `crashes` and `poisoned` and the `CHECK` in its
//! present form came with crash counting; [`PgStore::migrate`] adds them to a table made before
//! (`ADD COLUMN IF NOT EXISTS`). A claim row written before has no `lease_ends_at`: its lease
//! ends at its `expires_at`, as it did then.
//!
//! **Upgrading while workers of the earlier build still run.** An earlier build's claim
//! statement does not know `lease_ends_at`: taking over an expired row, it would leave the row's
//! old `lease_ends_at` in place, and a claim by this build would then read that live claim as
//! abandoned, take it over (two workers holding one key) and count a crash that did not happen.
//! The migration therefore adds a trigger, `jobguard_keys_unknown_lease`, that clears
//! `lease_ends_at` whenever a row changes hands without a new `generation` (only an earlier
//! build's claim does that; every claim of this build counts a generation), so such a claim's
//! lease ends at its `expires_at`, as it did then. It also clears `poisoned` and `crashes`:
//! the earlier build takes over only a row that expired, whose history this build would have
//! dropped too. The trigger's `WHEN` condition is checked
//! without calling the function, so this build's own statements pay that check (three
//! comparisons) a row.
//! The other way round is not covered: an earlier build reads this build's released row (no
//! token, no result) as a completed one without a result, and fails that call (`Error::Corrupt`). So run
//! [`migrate`](PgStore::migrate) first, then roll the workers over, and expect the earlier
//! build's calls of keys this build released to fail (not to run twice) until it is gone. For the
//! Redis store's records, see its module docs.
//!
//! **Durable steps** ([`Store::record_step`]) are rows of `jobguard_steps`, also created by the
//! migration: `(scope, key, step, occurrence)` as the primary key (the key's columns as in
//! `jobguard_keys`) and the step's `value`. A step is inserted from the claim's row, locked
//! `FOR SHARE`, while the token holds it, so a takeover and a late step of the worker it took
//! over from are ordered. The claim's statement returns the job's steps with an acquired claim
//! (one round trip), and drops those of a row that had expired; `complete`, `forgive`, `forget`
//! and [`PgStore::purge_expired`] drop a key's steps in the statement that changes its row.
//!
//! Postgres `text` cannot hold a NUL byte, and a B-tree entry is limited to about 2.7 kB, so
//! [`PgStore::row_key`] writes:
//!
//! * the scope as it is, except that `%` and NUL are percent-escaped (`%25`, `%00`); the scopes
//!   jobguard produces contain neither, so they appear verbatim;
//! * the key as it is when it is at most 200 bytes, holds no NUL and does not start with `#`;
//!   any other key is written `#sha256:<64 hex digits>` of its bytes.
//!
//! So no two distinct `(scope, key)` pairs share a row, short of a SHA-256 collision, and any key
//! of any length can be stored. Tokens and fingerprints are `text`: one holding a NUL byte is
//! refused by the server with [`Error::Store`], never stored altered.
//!
//! # Semantics as a [`Store`]
//!
//! Every operation is one statement on the pool, run on the database's clock.
//!
//! * [`claim`](Store::claim): one `INSERT ... ON CONFLICT DO UPDATE ... WHERE ...` that
//!   takes an absent, released or expired key (generation one more than the row's), or a claim
//!   whose lease lapsed (one more generation and one more crash, unless that crash reaches the
//!   crash limit: then the row is poisoned for the TTL), and in the same statement reads the row
//!   it found otherwise: a completed one gives its record, a live claim gives
//!   [`InProgress`](Claimed::InProgress) with the lease's remaining time, a poisoned one
//!   [`Poisoned`](Claimed::Poisoned) (a second statement then hands it the letter role if no
//!   letter is confirmed and the role's last lease ended: on that refused path only). A
//!   fingerprint mismatches only when both the stored one and
//!   the given one are present and differ, and it is checked first on a completed row or a live
//!   claim: a reused key is [`KeyReused`](Claimed::KeyReused). When a concurrent claim commits
//!   between the statement's snapshot and its insert, the statement finds nothing to report and
//!   runs again.
//! * [`lettered`](Store::lettered): one `UPDATE` that marks a poisoned row's letter confirmed.
//! * [`complete`](Store::complete), [`release`](Store::release), [`renew`](Store::renew): only
//!   while `token` holds a claim whose lease has not ended (compare-and-set on the token).
//!   Otherwise `complete` and `renew` fail with [`Error::LeaseLost`] and `release` does nothing.
//!   A release keeps the row, without its token, until the claim's `expires_at`.
//! * [`forgive`](Store::forgive): one `UPDATE`: a poisoned row, or a claim whose lease lapsed,
//!   becomes a released row (no token, `poisoned` false) with its generation and a crash count
//!   of 0, keeping its `expires_at`; a released row's count goes back to 0. A completed row, a
//!   live claim and an expired row are left alone.
//! * Expired rows are not deleted by the operations: a claim takes an expired row over. Call
//!   [`PgStore::purge_expired`] to delete rows past their TTL that hold no claim.
//! * A database that cannot be reached gives [`Error::Store`] within the pool's acquire timeout
//!   (2 s with [`PgStore::connect`]), and the job does not run: fail closed. The pool opens new
//!   connections when the server is back.

use super::{
    ClaimOptions, Claimed, KeyInfo, KeyState, Letter, StepKey, StepRecord, Store, StoreFuture,
    StoreKey,
};
use crate::Error;
use crate::store::record::{
    DEFAULT_LEASE, DEFAULT_TTL, decode, encode_replayable, key_reused, new_token, settled,
};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection, Postgres, Row};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

/// The longest key stored verbatim, in bytes; longer ones are hashed.
pub const MAX_VERBATIM_KEY: usize = 200;

/// How many rows one statement of [`PgStore::purge_expired`] deletes at most.
pub const PURGE_BATCH: i64 = 1000;

/// An idempotency [`Store`] on Postgres, through an sqlx pool.
///
/// `Clone` is cheap and shares the pool. See the [module docs](self) for the table, the key
/// scheme and the semantics, and [`PgStore::in_transaction`] for the key in the caller's
/// transaction.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// The SQL that creates the table and its index, for a migration tool of your own. It is
    /// idempotent (`IF NOT EXISTS`), and brings a table made by an earlier version up to date
    /// (the crash-counting columns, the `CHECK` that allows a row with neither a claim nor a
    /// result); [`migrate`](Self::migrate) runs it.
    pub const MIGRATION: &'static str = r#"
CREATE TABLE IF NOT EXISTS jobguard_keys (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    token       text,
    fingerprint text,
    result      bytea,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
ALTER TABLE jobguard_keys
    ADD COLUMN IF NOT EXISTS lease_ends_at timestamptz,
    ADD COLUMN IF NOT EXISTS generation    bigint  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS crashes       integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS poisoned      boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS lettered      boolean NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS attempts      integer NOT NULL DEFAULT 0;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'jobguard_keys_claim_or_result'
                     AND conrelid = 'jobguard_keys'::regclass) THEN
        ALTER TABLE jobguard_keys DROP CONSTRAINT IF EXISTS jobguard_keys_claimed_or_completed;
        ALTER TABLE jobguard_keys ADD CONSTRAINT jobguard_keys_claim_or_result
            CHECK (token IS NULL OR result IS NULL);
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS jobguard_keys_completed_expiry
    ON jobguard_keys (expires_at) WHERE token IS NULL;
CREATE OR REPLACE FUNCTION jobguard_keys_unknown_lease() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.lease_ends_at := NULL;
    NEW.crashes := 0;
    NEW.poisoned := false;
    RETURN NEW;
END
$$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'jobguard_keys_unknown_lease'
                     AND tgrelid = 'jobguard_keys'::regclass) THEN
        CREATE TRIGGER jobguard_keys_unknown_lease
            BEFORE UPDATE ON jobguard_keys FOR EACH ROW
            WHEN (NEW.token IS NOT NULL AND NEW.token IS DISTINCT FROM OLD.token
                  AND NEW.generation = OLD.generation)
            EXECUTE FUNCTION jobguard_keys_unknown_lease();
    END IF;
END
$$;
CREATE TABLE IF NOT EXISTS jobguard_steps (
    scope      text    NOT NULL,
    key        text    NOT NULL,
    step       text    NOT NULL,
    occurrence integer NOT NULL,
    value      bytea   NOT NULL,
    PRIMARY KEY (scope, key, step, occurrence)
);
CREATE TABLE IF NOT EXISTS jobguard_dead_letters (
    id         bigserial   PRIMARY KEY,
    job        text        NOT NULL,
    key        text,
    reason     text        NOT NULL,
    error      text        NOT NULL,
    record     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS jobguard_dead_letters_job ON jobguard_dead_letters (job, id);
CREATE INDEX IF NOT EXISTS jobguard_dead_letters_key ON jobguard_dead_letters (key, id)
    WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobguard_dead_letters_reason ON jobguard_dead_letters (reason, id);
"#;

    /// Connects a pool of up to 10 connections to `url`
    /// (`postgres://user:password@host:port/database`, `?sslmode=require` for TLS), waiting at
    /// most 2 s for a connection, so that a call made while the database is down fails quickly.
    ///
    /// A malformed URL or an unreachable database is [`Error::Store`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(2))
            .connect(url)
            .await
            .map_err(|e| store_error("cannot connect to Postgres", &e))?;
        Ok(PgStore { pool })
    }

    /// A store on a pool the caller built (and configured: size, timeouts, TLS).
    pub fn new(pool: PgPool) -> Self {
        PgStore { pool }
    }

    /// The pool, to run other statements on the same database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates the table and its index unless they exist ([`MIGRATION`](Self::MIGRATION)),
    /// under an advisory lock so that workers starting together do not race.
    pub async fn migrate(&self) -> Result<(), Error> {
        let fail = |e: sqlx::Error| store_error("migration failed", &e);
        let mut tx = self.pool.begin().await.map_err(fail)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('jobguard_keys migration'))")
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        sqlx::raw_sql(Self::MIGRATION)
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        tx.commit().await.map_err(fail)
    }

    /// Deletes the rows without a claim (completed, released, poisoned) whose TTL has passed, [`PURGE_BATCH`] rows per statement (each its
    /// own short transaction, skipping rows another session has locked), until none is left.
    /// Returns how many it deleted.
    ///
    /// A claim's row whose worker died and whose key is never claimed again stays, as it did
    /// before crash counting, until a claim of its key takes it over.
    ///
    /// Nothing calls it for you: an expired row is only dead weight (a claim takes it over), so
    /// call it from a periodic task of your own, about as often as keys expire in bulk, such as
    /// every few minutes to once an hour. Each batch is one range scan of the `expires_at` index.
    pub async fn purge_expired(&self) -> Result<u64, Error> {
        let mut total = 0;
        loop {
            let (deleted,): (i64,) = sqlx::query_as(PURGE)
                .bind(PURGE_BATCH)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| store_error("purge failed", &e))?;
            let deleted = u64::try_from(deleted).unwrap_or(0);
            total += deleted;
            if deleted < PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    /// The `(scope, key)` columns that hold `key`, with the escaping and hashing described in the
    /// [module docs](self#the-table).
    pub fn row_key(key: StoreKey<'_>) -> (Cow<'_, str>, Cow<'_, str>) {
        let scope = if key.scope.contains(['%', '\0']) {
            Cow::Owned(key.scope.replace('%', "%25").replace('\0', "%00"))
        } else {
            Cow::Borrowed(key.scope)
        };
        let bytes = key.key.as_bytes();
        let verbatim =
            bytes.len() <= MAX_VERBATIM_KEY && bytes.first() != Some(&b'#') && !bytes.contains(&0);
        let stored = if verbatim {
            Cow::Borrowed(key.key)
        } else {
            let mut out = String::with_capacity(72);
            out.push_str("#sha256:");
            for b in Sha256::digest(bytes) {
                let _ = write!(out, "{b:02x}");
            }
            Cow::Owned(out)
        };
        (scope, stored)
    }

    /// Claims `key` in the transaction that `conn` is in, for [`InTransaction::run`]: the key
    /// row, the body's writes and the stored result share that transaction, and the caller
    /// commits it.
    ///
    /// `conn` is a `&mut sqlx::Transaction<'_, Postgres>` or a `&mut PgConnection` inside a
    /// transaction begun through sqlx (`pool.begin()`, `conn.begin()`). A `&mut PgConnection`
    /// outside any transaction gets a transaction of its own, which jobguard begins with the
    /// claim and commits, as [`PgStore::begin`] does: one round trip beyond the body's
    /// statements instead of two (see [`InTransaction::run`]). The body gets the
    /// connection back as a `&mut PgConnection` (write `&mut *tx` for its statements), whichever
    /// of the two was given: a closure over `&mut Transaction<'t, _>` would tie the future to the
    /// transaction's lifetime in a way the compiler cannot prove `Send`, so such a future could
    /// not be spawned.
    ///
    /// ```no_run
    /// use jobguard::PgStore;
    ///
    /// /// The job's own error: the database's, or jobguard's (a key reused, the database gone).
    /// #[derive(Debug)]
    /// enum TransferError {
    ///     Db(sqlx::Error),
    ///     Guard(jobguard::Error),
    /// }
    /// impl From<sqlx::Error> for TransferError {
    ///     fn from(e: sqlx::Error) -> Self { TransferError::Db(e) }
    /// }
    /// impl From<jobguard::Error> for TransferError {
    ///     fn from(e: jobguard::Error) -> Self { TransferError::Guard(e) }
    /// }
    ///
    /// async fn transfer(pool: &sqlx::PgPool, id: &str) -> Result<i64, TransferError> {
    ///     let mut tx = pool.begin().await?;
    ///     let moved = PgStore::in_transaction(&mut tx, "ledger.transfer", id)
    ///         .run(async |tx| {
    ///             sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///                 .execute(&mut *tx)
    ///                 .await?;
    ///             sqlx::query("UPDATE accounts SET balance = balance + 10 WHERE id = 2")
    ///                 .execute(&mut *tx)
    ///                 .await?;
    ///             Ok::<_, TransferError>(10)
    ///         })
    ///         .await?;
    ///     tx.commit().await?; // the transfer, its key and its result, together
    ///     Ok(moved)
    /// }
    /// ```
    pub fn in_transaction<'c, C: TransactionConnection>(
        conn: &'c mut C,
        scope: &'c str,
        key: &'c str,
    ) -> InTransaction<'c> {
        InTransaction {
            conn: conn.connection(),
            scope: if scope.contains("::") {
                Cow::Owned(scope.replace("::", "."))
            } else {
                Cow::Borrowed(scope)
            },
            key,
            ttl: DEFAULT_TTL,
            fingerprint: None,
            default_scope: None,
        }
    }

    /// Begins a transaction on `conn` for one idempotent call, with the key's claim sent in the
    /// same round trip as the `BEGIN`, then runs [`Begin::run`]'s `work` in it, writes the
    /// result, and commits. The form to use when the job's transaction can start with the job:
    /// it costs one round trip beyond the transaction the job would send without jobguard (the
    /// result's write), where [`in_transaction`](Self::in_transaction), joining a transaction
    /// the caller began, costs two.
    ///
    /// `conn` must be outside any transaction (a connection from `pool.acquire()`); put every
    /// write that must commit with the job inside `work`.
    ///
    /// ```no_run
    /// use jobguard::PgStore;
    ///
    /// #[derive(Debug)]
    /// enum TransferError {
    ///     Db(sqlx::Error),
    ///     Guard(jobguard::Error),
    /// }
    /// impl From<sqlx::Error> for TransferError {
    ///     fn from(e: sqlx::Error) -> Self { TransferError::Db(e) }
    /// }
    /// impl From<jobguard::Error> for TransferError {
    ///     fn from(e: jobguard::Error) -> Self { TransferError::Guard(e) }
    /// }
    ///
    /// async fn transfer(pool: &sqlx::PgPool, id: &str) -> Result<i64, TransferError> {
    ///     let mut conn = pool.acquire().await?;
    ///     // BEGIN and the key's claim, the two updates, the result, COMMIT: four round trips.
    ///     PgStore::begin(&mut conn, "ledger.transfer", id)
    ///         .run(async |tx| {
    ///             sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///                 .execute(&mut *tx)
    ///                 .await?;
    ///             sqlx::query("UPDATE accounts SET balance = balance + 10 WHERE id = 2")
    ///                 .execute(&mut *tx)
    ///                 .await?;
    ///             Ok::<_, TransferError>(10)
    ///         })
    ///         .await
    /// }
    /// ```
    pub fn begin<'c>(conn: &'c mut PgConnection, scope: &'c str, key: &'c str) -> Begin<'c> {
        Begin(Self::in_transaction(conn, scope, key))
    }

    async fn claim_counted(
        &self,
        key: StoreKey<'_>,
        token: &str,
        options: ClaimOptions<'_>,
    ) -> Result<Claimed, Error> {
        let (scope, stored) = Self::row_key(key);
        let limit = i32::try_from(options.crashes).unwrap_or(i32::MAX);
        // A row read from a snapshot older than a concurrent claim's commit can be missing or
        // stale; the statement then runs again with a new snapshot.
        for _ in 0..8 {
            let row = sqlx::query(CLAIM.as_str())
                .bind(&*scope)
                .bind(&*stored)
                .bind(token)
                .bind(options.fingerprint)
                .bind(micros(options.lease))
                .bind(micros(options.ttl))
                .bind(limit)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| store_error("claim failed", &e))?;
            let Some(row) = row else { continue };
            let get = |i| row.try_get::<Option<i64>, _>(i);
            let fail = |e| store_error("claim", &e);
            let state: i32 = row.try_get(0).map_err(fail)?;
            let wait = get(1).map_err(fail)?;
            let generation = get(3).map_err(fail)?.unwrap_or(0);
            let crashes = get(4).map_err(fail)?.unwrap_or(0);
            let crashes = u32::try_from(crashes).unwrap_or(u32::MAX);
            let attempts = get(8).map_err(fail)?.unwrap_or(0);
            let attempts = u32::try_from(attempts).unwrap_or(u32::MAX);
            match (state, wait) {
                (0, _) => {
                    let names: Option<Vec<String>> = row.try_get(5).map_err(fail)?;
                    let numbers: Option<Vec<i32>> = row.try_get(6).map_err(fail)?;
                    let values: Option<Vec<Vec<u8>>> = row.try_get(7).map_err(fail)?;
                    let steps = (names.unwrap_or_default().into_iter())
                        .zip(numbers.unwrap_or_default())
                        .zip(values.unwrap_or_default())
                        .map(|((name, n), value)| StepRecord::new(name, occurrence(n), value))
                        .collect();
                    return Ok(Claimed::Acquired {
                        generation: u64::try_from(generation).unwrap_or(0),
                        crashes,
                        attempts,
                        steps: Some(steps),
                    });
                }
                (4, _) => {
                    let letter = Letter::Yours;
                    return Ok(Claimed::Poisoned {
                        crashes,
                        attempts,
                        letter,
                    });
                }
                (3, Some(w)) if w > 0 => return Ok(Claimed::KeyReused),
                (1, Some(w)) if w > 0 => {
                    let result: Option<Vec<u8>> = row.try_get(2).map_err(fail)?;
                    let completed = result.map(Claimed::Completed).ok_or_else(|| {
                        Error::Corrupt("a completed idempotency row without a result".into())
                    })?;
                    return Ok(completed);
                }
                (2, Some(w)) if w > 0 => {
                    let retry_in = Duration::from_micros(w as u64);
                    return Ok(Claimed::InProgress { retry_in });
                }
                (5, Some(w)) if w > 0 => {
                    // Poisoned before: the letter role, if no letter is confirmed and no other
                    // claimer holds it. One more statement, on this refused path only.
                    let (letter,): (i32,) = sqlx::query_as(HAND_LETTER)
                        .bind(&*scope)
                        .bind(&*stored)
                        .bind(micros(options.lease))
                        .fetch_one(&self.pool)
                        .await
                        .map_err(|e| store_error("claim failed", &e))?;
                    let letter = match letter {
                        1 => Letter::Yours,
                        2 => Letter::Held,
                        _ => Letter::Written,
                    };
                    return Ok(Claimed::Poisoned {
                        crashes,
                        attempts,
                        letter,
                    });
                }
                // Free, lapsed or expired in the snapshot, but not taken over: a concurrent
                // renewal or claim.
                _ => continue,
            }
        }
        Err(Error::Store(
            "claim failed: the key kept changing under concurrent claims".into(),
        ))
    }

    /// Runs a token-checked statement; `Ok(true)` when `token` held the claim.
    async fn if_held(
        &self,
        sql: &'static str,
        key: StoreKey<'_>,
        token: &str,
        extra: impl FnOnce(
            sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
        ) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
        what: &str,
    ) -> Result<bool, Error> {
        let (scope, stored) = Self::row_key(key);
        let query = sqlx::query(sql).bind(&*scope).bind(&*stored).bind(token);
        let done = extra(query)
            .execute(&self.pool)
            .await
            .map_err(|e| store_error(what, &e))?;
        Ok(done.rows_affected() == 1)
    }
}

/// A step's occurrence as the table keeps it (`integer`).
fn occurrence(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// A lease or TTL in microseconds for the statements: at least 1, and within what `interval`
/// and `timestamptz` hold (2^53 µs, about 285 years).
fn micros(d: Duration) -> i64 {
    (d.as_micros().min(1 << 53) as i64).max(1)
}

fn store_error(what: &str, e: &sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = e
        && db.code().as_deref() == Some("42P01")
    {
        return Error::Store(format!(
            "{what}: {e} (create the table with PgStore::migrate() or PgStore::MIGRATION)"
        ));
    }
    Error::Store(format!("{what}: {e}"))
}

// $1 scope, $2 key: the result of a completed row that has not expired (as a claim would
// replay it), and no row otherwise.
const LOOKUP: &str = "SELECT result FROM jobguard_keys \
     WHERE scope = $1 AND key = $2 AND token IS NULL AND result IS NOT NULL \
       AND expires_at > now()";

// The crash count of a row that a claim takes over: none left when the row expired, one more
// when it held a claim (whose lease lapsed: abandoned), the same when it was released.
const CRASHES_AFTER: &str = "(CASE WHEN k.expires_at <= now() THEN 0 \
     WHEN k.token IS NOT NULL THEN k.crashes + 1 ELSE k.crashes END)";

// A row a claim may take (`CLAIM`, `TAKE_OVER_IN`, and `READ_IN`'s answer): expired, released
// (no token, no result, not poisoned; left by the `Store` form), or a claim whose lease lapsed
// (its worker died).
const FREE: &str = "(k.expires_at <= now() \
     OR (k.token IS NULL AND k.result IS NULL AND NOT k.poisoned) \
     OR (k.token IS NOT NULL AND coalesce(k.lease_ends_at, k.expires_at) <= now()))";

// $1 scope, $2 key, $3 token, $4 fingerprint, $5 lease in µs, $6 TTL in µs, $7 crash limit (0:
// none). One row: the state (0 acquired, 1 completed, 2 claimed, 3 reused, 4 poisoned by this
// claim, 5 poisoned before, 6 free or lapsed but not taken: run again), the µs left on the
// lease (claimed) or the row (otherwise), the result when completed, the generation, the crash
// count, and the job's steps (names, occurrences and values, in three arrays of one order, or
// NULL for none). No row when the conflicting row is not in the statement's snapshot.
// The steps of a row that had expired (or of a key without a row: left by a purge that raced a
// step, or a table emptied by hand) are not its job's: they are dropped, as they are when the
// claim poisons the key. A step recorded by the previous holder in the instant its lease
// ended may commit after this statement's snapshot was taken; it is then not returned, and
// the step runs again (the holder had let its lease lapse).
static CLAIM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let poison = format!("($7::integer > 0 AND {CRASHES_AFTER} >= $7::integer)");
    format!(
        r#"
WITH taken AS (
    INSERT INTO jobguard_keys AS k (scope, key, token, fingerprint, result, expires_at,
                                    lease_ends_at, generation, crashes, poisoned, attempts)
    VALUES ($1, $2, $3, $4, NULL,
            now() + greatest($5::bigint, $6::bigint) * interval '1 microsecond',
            now() + $5::bigint * interval '1 microsecond', 1, 0, false, 1)
    ON CONFLICT (scope, key) DO UPDATE
        SET token = CASE WHEN {poison} THEN NULL ELSE excluded.token END,
            fingerprint = CASE WHEN {poison} THEN k.fingerprint ELSE excluded.fingerprint END,
            result = NULL,
            expires_at = CASE WHEN {poison} THEN now() + $6::bigint * interval '1 microsecond'
                              ELSE excluded.expires_at END,
            lease_ends_at = excluded.lease_ends_at,
            lettered = NOT {poison},
            generation = CASE WHEN {poison} THEN k.generation ELSE k.generation + 1 END,
            crashes = {CRASHES_AFTER},
            poisoned = {poison},
            attempts = CASE WHEN {poison} THEN k.attempts
                            WHEN k.expires_at <= now() THEN 1 ELSE k.attempts + 1 END
        WHERE {FREE}
    RETURNING k.poisoned, k.generation, k.crashes, k.attempts
), old AS (
    SELECT k.expires_at <= now() AS expired FROM jobguard_keys k
    WHERE k.scope = $1 AND k.key = $2
), dropped AS (
    DELETE FROM jobguard_steps s
    WHERE s.scope = $1 AND s.key = $2
      AND ((SELECT expired FROM old) IS NOT FALSE OR (SELECT poisoned FROM taken))
), steps AS (
    SELECT s.step, s.occurrence, s.value FROM jobguard_steps s
    WHERE s.scope = $1 AND s.key = $2 AND (SELECT expired FROM old) IS FALSE
)
SELECT CASE WHEN poisoned THEN 4 ELSE 0 END, NULL::bigint, NULL::bytea, generation,
       crashes::bigint,
       (SELECT array_agg(step ORDER BY step, occurrence) FROM steps),
       (SELECT array_agg(occurrence ORDER BY step, occurrence) FROM steps),
       (SELECT array_agg(value ORDER BY step, occurrence) FROM steps),
       attempts::bigint
FROM taken
UNION ALL
SELECT CASE WHEN k.expires_at <= now() THEN 6
            WHEN k.poisoned THEN 5
            WHEN k.token IS NOT NULL AND coalesce(k.lease_ends_at, k.expires_at) <= now() THEN 6
            WHEN k.token IS NULL AND k.result IS NULL THEN 6
            WHEN k.fingerprint IS NOT NULL AND $4::text IS NOT NULL AND k.fingerprint <> $4::text
                THEN 3
            WHEN k.token IS NULL THEN 1
            ELSE 2 END,
       floor(extract(epoch FROM CASE WHEN k.poisoned THEN k.expires_at
                                     ELSE coalesce(k.lease_ends_at, k.expires_at) END
                     - now()) * 1000000)::bigint,
       k.result, k.generation, k.crashes::bigint, NULL::text[], NULL::integer[], NULL::bytea[],
       k.attempts::bigint
FROM jobguard_keys k
WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT 1 FROM taken)
"#
    )
});

// $1 scope, $2 key, $3 token, $4 result, $5 ttl in µs. The job's steps go: one row when the
// token held the claim.
const COMPLETE: &str = r#"
WITH done AS (
    UPDATE jobguard_keys
    SET token = NULL, result = $4, lease_ends_at = NULL,
        expires_at = now() + $5::bigint * interval '1 microsecond'
    WHERE scope = $1 AND key = $2 AND token = $3 AND coalesce(lease_ends_at, expires_at) > now()
    RETURNING 1
), dropped AS (
    DELETE FROM jobguard_steps WHERE scope = $1 AND key = $2 AND EXISTS (SELECT 1 FROM done)
)
SELECT 1 FROM done
"#;

// $1 scope, $2 key, $3 token: one more attempt while the token holds the claim; the count.
const ATTEMPTED: &str = r#"
UPDATE jobguard_keys SET attempts = attempts + 1
WHERE scope = $1 AND key = $2 AND token = $3 AND coalesce(lease_ends_at, expires_at) > now()
RETURNING attempts
"#;

// $1 scope, $2 key, $3 token, $4 step, $5 occurrence, $6 value. While the token holds the
// claim, whose row it locks against a concurrent takeover: one row inserted or updated.
const RECORD_STEP: &str = r#"
INSERT INTO jobguard_steps AS s (scope, key, step, occurrence, value)
SELECT k.scope, k.key, $4, $5, $6 FROM jobguard_keys k
WHERE k.scope = $1 AND k.key = $2 AND k.token = $3
  AND coalesce(k.lease_ends_at, k.expires_at) > now()
FOR SHARE
ON CONFLICT (scope, key, step, occurrence) DO UPDATE SET value = excluded.value
"#;

// $1 scope, $2 key: the job's steps while its row is a claim or a released row, not expired.
const STEPS: &str = r#"
SELECT s.step, s.occurrence, s.value FROM jobguard_steps s
JOIN jobguard_keys k ON k.scope = s.scope AND k.key = s.key
WHERE s.scope = $1 AND s.key = $2
  AND k.expires_at > now() AND k.result IS NULL AND NOT k.poisoned
"#;

// $1 scope, $2 key, $3 token. The in-transaction form's release, inside its own transaction: the
// row it inserted goes.
const RELEASE: &str = "DELETE FROM jobguard_keys WHERE scope = $1 AND key = $2 AND token = $3";

// $1 scope, $2 key, $3 token. The Store's release: the row stays, with its generation and crash
// count, until the claim's `expires_at`.
const RELEASE_CLAIM: &str = r#"
UPDATE jobguard_keys SET token = NULL, lease_ends_at = NULL
WHERE scope = $1 AND key = $2 AND token = $3 AND coalesce(lease_ends_at, expires_at) > now()
"#;

// $1 scope, $2 key, $3 lease in µs. Hands a poisoned row's letter role to the claimer while no
// letter is confirmed and the last holder's lease (`lease_ends_at`) has ended. One row: 1 handed
// to this claimer, 2 held by another, 0 confirmed (or the row is no longer poisoned). The
// `was` CTE reads the row as it was before the `UPDATE`, in the statement's snapshot.
const HAND_LETTER: &str = r#"
WITH was AS (
    SELECT lettered FROM jobguard_keys WHERE scope = $1 AND key = $2 AND poisoned
), handed AS (
    UPDATE jobguard_keys SET lease_ends_at = now() + $3::bigint * interval '1 microsecond'
    WHERE scope = $1 AND key = $2 AND poisoned AND NOT lettered AND expires_at > now()
      AND (lease_ends_at IS NULL OR lease_ends_at <= now())
    RETURNING 1
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM handed) THEN 1
            WHEN (SELECT lettered FROM was) IS FALSE THEN 2
            ELSE 0 END
"#;

// $1 scope, $2 key. A poisoned row's letter is confirmed.
const LETTERED: &str = r#"
UPDATE jobguard_keys SET lettered = true, lease_ends_at = NULL
WHERE scope = $1 AND key = $2 AND poisoned AND NOT lettered
"#;

// $1 scope, $2 key. Forgives the key's crashes: a poisoned row, or a claim whose lease lapsed,
// becomes a released row without crashes (its generation, fingerprint and `expires_at` kept); a
// released row's count goes back to 0. A completed row, a live claim and an expired row (whose
// history the next claim drops anyway) are not touched. One row updated when something was
// cleared, and the job's steps go with it. A claim that races it either commits first (and the `WHERE` is checked again on
// the row it wrote) or waits for this one.
const FORGIVE: &str = r#"
WITH forgiven AS (
    UPDATE jobguard_keys
    SET token = NULL, lease_ends_at = NULL, poisoned = false, crashes = 0
    WHERE scope = $1 AND key = $2 AND expires_at > now() AND result IS NULL
      AND (token IS NULL OR coalesce(lease_ends_at, expires_at) <= now())
      AND (poisoned OR crashes > 0 OR token IS NOT NULL)
    RETURNING 1
), dropped AS (
    DELETE FROM jobguard_steps WHERE scope = $1 AND key = $2 AND EXISTS (SELECT 1 FROM forgiven)
)
SELECT 1 FROM forgiven
"#;

// $1 scope, $2 key: the row while it has not expired, with the microseconds left on a claim's
// lease (0 once it ended).
const INSPECT: &str = "SELECT token IS NOT NULL AS claimed, poisoned, result, generation, crashes, \
     greatest(0, floor(extract(epoch FROM (coalesce(lease_ends_at, expires_at) - now())) \
       * 1000000))::bigint AS lease_us \
     FROM jobguard_keys WHERE scope = $1 AND key = $2 AND expires_at > now()";

// $1 scope, $2 key: the row gone with its steps, and whether it had not expired.
const FORGET: &str = r#"
WITH gone AS (
    DELETE FROM jobguard_keys WHERE scope = $1 AND key = $2 RETURNING expires_at > now() AS live
), dropped AS (
    DELETE FROM jobguard_steps WHERE scope = $1 AND key = $2
)
SELECT live FROM gone
"#;

// $1 scope, $2 key, $3 token, $4 lease in µs. The row lives at least as long as the lease.
const RENEW: &str = r#"
UPDATE jobguard_keys
SET lease_ends_at = now() + $4::bigint * interval '1 microsecond',
    expires_at = greatest(expires_at, now() + $4::bigint * interval '1 microsecond')
WHERE scope = $1 AND key = $2 AND token = $3 AND coalesce(lease_ends_at, expires_at) > now()
"#;

// $1 batch size.
const PURGE: &str = r#"
WITH gone AS (
    DELETE FROM jobguard_keys
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM jobguard_keys
        WHERE token IS NULL AND expires_at <= now()
        ORDER BY expires_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ))
    AND token IS NULL AND expires_at <= now()
    RETURNING scope, key
), dropped AS (
    DELETE FROM jobguard_steps s USING gone g WHERE s.scope = g.scope AND s.key = g.key
)
SELECT count(*) FROM gone
"#;

impl Store for PgStore {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        // The claim's statement reads the job's steps and count of attempts: one round trip.
        Box::pin(self.claim_counted(key, token, options))
    }

    /// One `UPDATE` of the claim's row while `token` holds it.
    fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32> {
        Box::pin(async move {
            let (scope, stored) = Self::row_key(key);
            let row: Option<(i32,)> = sqlx::query_as(ATTEMPTED)
                .bind(&*scope)
                .bind(&*stored)
                .bind(token)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| store_error("attempted failed", &e))?;
            match row {
                Some((attempts,)) => Ok(u32::try_from(attempts).unwrap_or(0)),
                None => Err(Error::LeaseLost),
            }
        })
    }

    /// One `INSERT ... SELECT` from the claim's row, locked, while `token` holds it.
    fn record_step<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        step: StepKey<'a>,
        value: &'a [u8],
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let occurrence = i32::try_from(step.occurrence).map_err(|_| {
                Error::Config(format!("step occurrence {} out of range", step.occurrence))
            })?;
            let held = self
                .if_held(
                    RECORD_STEP,
                    key,
                    token,
                    |q| q.bind(step.name).bind(occurrence).bind(value),
                    "record step failed",
                )
                .await?;
            if held { Ok(()) } else { Err(Error::LeaseLost) }
        })
    }

    fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
        Box::pin(async move {
            let (scope, stored) = Self::row_key(key);
            let rows: Vec<(String, i32, Vec<u8>)> = sqlx::query_as(STEPS)
                .bind(&*scope)
                .bind(&*stored)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| store_error("steps failed", &e))?;
            Ok((rows.into_iter())
                .map(|(name, n, value)| StepRecord::new(name, occurrence(n), value))
                .collect())
        })
    }

    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let held = self
                .if_held(
                    COMPLETE,
                    key,
                    token,
                    |q| q.bind(record).bind(micros(ttl)),
                    "complete failed",
                )
                .await?;
            if held { Ok(()) } else { Err(Error::LeaseLost) }
        })
    }

    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.if_held(RELEASE_CLAIM, key, token, |q| q, "release failed")
                .await
                .map(drop)
        })
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let held = self
                .if_held(RENEW, key, token, |q| q.bind(micros(lease)), "renew failed")
                .await?;
            if held { Ok(()) } else { Err(Error::LeaseLost) }
        })
    }

    /// One `SELECT` of the row's result, if it is a completed one that has not expired.
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            let (scope, stored) = Self::row_key(key);
            let row: Option<(Vec<u8>,)> = sqlx::query_as(LOOKUP)
                .bind(&*scope)
                .bind(&*stored)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| store_error("lookup failed", &e))?;
            Ok(row.map(|(result,)| result))
        })
    }

    /// One `UPDATE` of the row: a poisoned row or a lapsed claim becomes a released row without
    /// crashes, a released row's count goes back to 0.
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (scope, stored) = Self::row_key(key);
            let done = sqlx::query(FORGIVE)
                .bind(&*scope)
                .bind(&*stored)
                .execute(&self.pool)
                .await
                .map_err(|e| store_error("forgive failed", &e))?;
            Ok(done.rows_affected() == 1)
        })
    }

    /// One `SELECT` of the row, on the database's clock.
    fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
        Box::pin(async move {
            let (scope, stored) = Self::row_key(key);
            let row = sqlx::query(INSPECT)
                .bind(&*scope)
                .bind(&*stored)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| store_error("inspect failed", &e))?;
            let Some(row) = row else {
                return Ok(KeyInfo::free());
            };
            let read = |e: sqlx::Error| Error::Corrupt(format!("jobguard_keys row: {e}"));
            let claimed: bool = row.try_get("claimed").map_err(read)?;
            let poisoned: bool = row.try_get("poisoned").map_err(read)?;
            let result: Option<Vec<u8>> = row.try_get("result").map_err(read)?;
            let generation: i64 = row.try_get("generation").map_err(read)?;
            let crashes: i32 = row.try_get("crashes").map_err(read)?;
            let lease_us: i64 = row.try_get("lease_us").map_err(read)?;
            let generation = u64::try_from(generation).ok().filter(|g| *g > 0);
            let crashes = u32::try_from(crashes).unwrap_or(0);
            Ok(if poisoned {
                KeyInfo::new(KeyState::Poisoned, generation, crashes)
            } else if claimed {
                let left = Duration::from_micros(u64::try_from(lease_us).unwrap_or(0));
                KeyInfo::new(KeyState::Claimed, generation, crashes).lease_left(left)
            } else if let Some(result) = result {
                KeyInfo::new(KeyState::Completed, generation, crashes).result(result)
            } else {
                KeyInfo::new(KeyState::Free, generation, crashes)
            })
        })
    }

    /// One `DELETE` of the row: `true` when it had not expired.
    fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (scope, stored) = Self::row_key(key);
            let live: Option<(bool,)> = sqlx::query_as(FORGET)
                .bind(&*scope)
                .bind(&*stored)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| store_error("forget failed", &e))?;
            Ok(live.is_some_and(|(live,)| live))
        })
    }

    /// One `UPDATE` of a poisoned row: its letter is confirmed.
    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let (scope, stored) = Self::row_key(key);
            sqlx::query(LETTERED)
                .bind(&*scope)
                .bind(&*stored)
                .execute(&self.pool)
                .await
                .map_err(|e| store_error("lettered failed", &e))?;
            Ok(())
        })
    }
}

/// A connection that [`PgStore::in_transaction`] can claim a key in: a `PgConnection` or an
/// `sqlx::Transaction<'_, Postgres>`. Either way the body is given the `&mut PgConnection`
/// underneath.
pub trait TransactionConnection: Send {
    /// The connection underneath.
    fn connection(&mut self) -> &mut PgConnection;
}

impl TransactionConnection for PgConnection {
    fn connection(&mut self) -> &mut PgConnection {
        self
    }
}

impl TransactionConnection for sqlx::Transaction<'_, Postgres> {
    fn connection(&mut self) -> &mut PgConnection {
        self
    }
}

/// One idempotent call in the caller's transaction: made by [`PgStore::in_transaction`], run by
/// [`run`](Self::run).
#[must_use]
pub struct InTransaction<'c> {
    conn: &'c mut PgConnection,
    scope: Cow<'c, str>,
    key: &'c str,
    ttl: Duration,
    fingerprint: Option<String>,
    default_scope: Option<&'static crate::store::DefaultScope>,
}

impl std::fmt::Debug for InTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InTransaction")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl InTransaction<'_> {
    /// How long the committed result is replayed (default 24 hours).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// A digest of the arguments: the same key with another fingerprint is
    /// [`Error::KeyReused`].
    pub fn fingerprint(mut self, fingerprint: String) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// The scope is `#[idempotent]`'s default for one function: checked, before anything is
    /// claimed, to be no other function's (see [`DefaultScope`](crate::store::DefaultScope)).
    #[doc(hidden)]
    pub fn default_scope(mut self, scope: &'static crate::store::DefaultScope) -> Self {
        self.default_scope = Some(scope);
        self
    }

    /// Claims the key in the transaction, then replays the committed result or runs `work` with
    /// the connection and writes its result in the same transaction.
    ///
    /// * The key row is inserted with `INSERT ... ON CONFLICT DO NOTHING`. A concurrent call
    ///   with the same key, in another transaction, waits on that row until this transaction
    ///   ends: after a commit it replays the committed result, after a rollback it runs.
    /// * Completed and committed before: the stored `Ok` value, and `work` is not run.
    /// * Held by a live claim of the [`Store`] form: [`Error::InProgress`]. A claim of that form
    ///   whose lease lapsed (its worker died) is taken over, as the `Store` form's next claim
    ///   takes it: one more generation, so the lapsed claim's token can neither complete nor
    ///   release the key, and one more crash counted.
    /// * `work` succeeds: its result is written to the key row and returned. Two statements in
    ///   all on this path: the insert and the result's update.
    /// * `work` fails: the key row is deleted if the transaction still takes statements, and the
    ///   error is returned. Roll the transaction back (drop it), as you would without jobguard:
    ///   the body's writes and the key go with it, and a redelivery runs the job again.
    /// * A statement of jobguard's fails (database unreachable, transaction aborted):
    ///   [`Error::Store`], and `work` does not run.
    ///
    /// The caller commits. Until then nothing is visible to other transactions, and a crash
    /// loses the effect and the key together.
    ///
    /// `conn` is inside a transaction begun through sqlx (`pool.begin()`, `conn.begin()`). A
    /// connection outside any transaction gets one of its own, as with [`PgStore::begin`]: the
    /// claim goes with its `BEGIN`, and jobguard commits it after the result.
    ///
    /// # Round trips
    ///
    /// In the caller's transaction the call sends two statements of its own beside the body's:
    /// the claim before the body (it is what makes a concurrent duplicate wait instead of
    /// running, and what keeps a completed key from running again) and the result's write after
    /// it (the result exists only then). sqlx sends no statement before the previous one's
    /// answer, and the caller sends the `BEGIN` and the `COMMIT`, so neither can travel with
    /// one of those: two round trips. [`PgStore::begin`], where jobguard sends the `BEGIN`,
    /// costs one.
    ///
    /// # Retries
    ///
    /// Once a statement fails inside a Postgres transaction, the transaction takes no more
    /// statements until it rolls back to a savepoint. To retry the body (a deadlock, `40P01`),
    /// run each attempt through [`savepoint`] inside `work`, or, with a policy that has a
    /// `timeout`, a `budget` or `on_ok`, through one [`Savepoint`] made for the call (see its
    /// example), which also rolls back an attempt that was cut:
    ///
    /// ```no_run
    /// # use jobguard::{PgStore, Policy};
    /// # use jobguard::store::postgres::savepoint;
    /// # #[derive(Debug)] struct MyError;
    /// # impl std::fmt::Display for MyError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("e") } }
    /// # impl From<jobguard::Error> for MyError { fn from(_: jobguard::Error) -> Self { MyError } }
    /// # impl From<sqlx::Error> for MyError { fn from(_: sqlx::Error) -> Self { MyError } }
    /// # impl jobguard::Transient for MyError { fn verdict(&self) -> jobguard::Verdict { jobguard::Verdict::Retry } }
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), MyError> {
    /// const POLICY: Policy = Policy::new().attempts(3);
    /// let mut tx = pool.begin().await?;
    /// PgStore::in_transaction(&mut tx, "ledger.transfer", "t-42")
    ///     .run(async |tx| {
    ///         POLICY
    ///             .run("ledger.transfer", async |_attempt| {
    ///                 savepoint(&mut *tx, async |tx| {
    ///                     sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///                         .execute(&mut *tx)
    ///                         .await?;
    ///                     Ok::<_, MyError>(())
    ///                 })
    ///                 .await
    ///             })
    ///             .await
    ///     })
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// A serialization failure (`40001`, under `REPEATABLE READ` or `SERIALIZABLE`) cannot be
    /// retried this way, since the transaction's snapshot stays the same: retry the whole
    /// transaction instead, around the code that begins it.
    pub async fn run<T, E, F>(self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
        T: crate::bounds::Replayable,
        E: crate::bounds::FromJobguard,
    {
        if let Some(scope) = self.default_scope {
            scope.check().map_err(E::from)?;
        }
        if !self.conn.is_in_transaction() {
            return Begin(self).run(work).await;
        }
        let InTransaction {
            conn,
            scope,
            key,
            ttl,
            fingerprint,
            ..
        } = self;
        let store_key = StoreKey { scope: &scope, key };
        let (scope, stored) = PgStore::row_key(store_key);
        let token = new_token();
        let at_key = keyed::<E>(store_key);
        match claim_in(&mut *conn, &scope, &stored, &token, fingerprint.as_deref())
            .await
            .map_err(at_key)?
        {
            Found::Acquired => {}
            Found::Completed(bytes) => return decode::<T>(&bytes).map_err(at_key),
            Found::Reused { completed } => return Err(E::from(key_reused(completed))),
            Found::Claimed => return Err(E::from(Error::InProgress)),
        }
        let failed = match work(&mut *conn).await {
            Ok(value) => {
                match store_result(
                    &mut *conn,
                    store_key,
                    (&scope, &stored),
                    &token,
                    &value,
                    ttl,
                )
                .await
                {
                    Ok(()) => return Ok(value),
                    // Not replayable: the claim goes as after a failed body, so a caller that
                    // commits anyway does not commit a held key.
                    Err(error @ Error::Unreplayable(_)) => E::from(error),
                    Err(error) => return Err(E::from(error)),
                }
            }
            Err(error) => error,
        };
        // An aborted transaction refuses this; it is rolled back whole then anyway.
        let _ = sqlx::query(RELEASE)
            .bind(&*scope)
            .bind(&*stored)
            .bind(&token)
            .execute(&mut *conn)
            .await;
        Err(failed)
    }
}

/// One idempotent call in a transaction of its own: made by [`PgStore::begin`], run by
/// [`run`](Self::run).
#[must_use]
#[derive(Debug)]
pub struct Begin<'c>(InTransaction<'c>);

impl Begin<'_> {
    /// How long the committed result is replayed (default 24 hours).
    pub fn ttl(self, ttl: Duration) -> Self {
        Begin(self.0.ttl(ttl))
    }

    /// A digest of the arguments: the same key with another fingerprint is
    /// [`Error::KeyReused`].
    pub fn fingerprint(self, fingerprint: String) -> Self {
        Begin(self.0.fingerprint(fingerprint))
    }

    /// Begins the transaction with the key's claim, replays the committed result or runs `work`
    /// in it, writes the result, and commits.
    ///
    /// * The `BEGIN` and the key row's `INSERT` go to the server as one message: the claim
    ///   costs no round trip of its own. A concurrent call with the same key waits on the row
    ///   until this transaction ends: after its commit it replays the committed result, after a
    ///   rollback it runs.
    /// * The key was taken already (completed, claimed by the [`Store`] form, or committed by a
    ///   concurrent call while this one waited): the `INSERT` fails on the key's primary key,
    ///   before `work` could run, and the call reads the row in a new transaction: the stored
    ///   `Ok` value (`work` does not run), [`Error::KeyReused`], [`Error::InProgress`], or an
    ///   expired claim, or one whose lease lapsed, taken over, and `work` runs.
    /// * `work` succeeds: its result is written to the key row (one statement) and the
    ///   transaction commits: the body's writes, the key and the result together. A failed
    ///   commit is [`Error::Store`], and nothing of the call stays.
    /// * `work` fails: the transaction is rolled back, the key with it, and the error returned.
    /// * A statement of jobguard's fails (database unreachable): [`Error::Store`], and `work`
    ///   does not run or its writes are rolled back.
    ///
    /// * The connection is in a transaction that sqlx did not begin (a `BEGIN` sent as SQL,
    ///   which `is_in_transaction()` does not count): the server's own state is checked in the
    ///   `BEGIN`'s message, the call is [`Error::Config`], `work` does not run, and that
    ///   transaction is rolled back instead of being committed by jobguard. Begin it through
    ///   sqlx and use [`PgStore::in_transaction`].
    ///
    /// If the future is dropped while `work` runs, sqlx rolls the transaction back before the
    /// connection's next use (a pool connection: when it returns to the pool).
    ///
    /// The transaction is begun with a plain `BEGIN`, at the session's default isolation level
    /// (`default_transaction_isolation`). To retry statements of `work`, wrap them in
    /// [`savepoint`] or a [`Savepoint`], as with [`InTransaction::run`].
    pub async fn run<T, E, F>(self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
        T: crate::bounds::Replayable,
        E: crate::bounds::FromJobguard,
    {
        let InTransaction {
            conn,
            scope,
            key,
            ttl,
            fingerprint,
            ..
        } = self.0;
        if conn.is_in_transaction() {
            return Err(E::from(Error::Config(
                "PgStore::begin needs a connection outside a transaction \
                 (inside the caller's transaction, use PgStore::in_transaction)"
                    .into(),
            )));
        }
        let store_key = StoreKey { scope: &scope, key };
        let (scope, stored) = PgStore::row_key(store_key);
        let token = new_token();
        let fingerprint = fingerprint.as_deref();
        let fail = |what: &str, e: sqlx::Error| E::from(store_error(what, &e));
        // The fast path: BEGIN and the claim in one message. The transaction does not leave
        // this function, so the slow path below can borrow the connection again.
        let claim = begin_claim_sql(&scope, &stored, &token, fingerprint, DEFAULT_LEASE);
        match conn.begin_with(sqlx::AssertSqlSafe(claim)).await {
            Ok(tx) => return finish(tx, store_key, (&scope, &stored), &token, ttl, work).await,
            // sqlx has queued the ROLLBACK; it goes out with the next statement.
            Err(e) if is_key_conflict(&e) => {}
            // sqlx has queued the ROLLBACK here too: the caller's transaction ends with it.
            Err(e) if is_nested_begin(&e) => return Err(E::from(nested_begin_error())),
            Err(e) => return Err(fail("claim failed", e)),
        }
        // The slow path: the key's row is committed. A completed row or a live claim is read
        // in one statement outside any transaction, after the failed BEGIN's ROLLBACK (three
        // round trips for a replay); an expired row, or one deleted since, is claimed in a
        // transaction.
        let at_key = keyed::<E>(store_key);
        match read_in(&mut *conn, &scope, &stored, fingerprint).await {
            Ok(Seen::Live(Found::Completed(bytes))) => return decode::<T>(&bytes).map_err(at_key),
            Ok(Seen::Live(Found::Reused { completed })) => {
                return Err(E::from(key_reused(completed)));
            }
            Ok(Seen::Live(Found::Claimed)) => return Err(E::from(Error::InProgress)),
            Ok(Seen::Live(Found::Acquired) | Seen::Free | Seen::Gone) => {}
            Err(e) => return Err(at_key(e)),
        }
        // The ROLLBACK sqlx queued ended the fast path's transaction; the check is repeated all
        // the same, so that this BEGIN cannot join a transaction sqlx does not know of either.
        let begin = sqlx::AssertSqlSafe(format!("BEGIN; {NOT_NESTED}"));
        let mut tx = match conn.begin_with(begin).await {
            Ok(tx) => tx,
            Err(e) if is_nested_begin(&e) => return Err(E::from(nested_begin_error())),
            Err(e) => return Err(fail("claim failed", e)),
        };
        let found = match claim_in(&mut tx, &scope, &stored, &token, fingerprint).await {
            Ok(Found::Acquired) => {
                return finish(tx, store_key, (&scope, &stored), &token, ttl, work).await;
            }
            Ok(Found::Completed(bytes)) => decode::<T>(&bytes).map_err(at_key),
            Ok(Found::Reused { completed }) => Err(E::from(key_reused(completed))),
            Ok(Found::Claimed) => Err(E::from(Error::InProgress)),
            Err(e) => Err(at_key(e)),
        };
        // Nothing was written: the rollback only ends the transaction.
        let _ = tx.rollback().await;
        found
    }
}

/// How the transactional forms return an error about `key`: settled when no redelivery can
/// change it ([`settled`]), a corrupt record naming the key ([`Error::at_key`]).
fn keyed<E: From<Error>>(key: StoreKey<'_>) -> impl Fn(Error) -> E + Copy + '_ {
    move |e| E::from(settled(e).at_key(key.scope, key.key))
}

/// Runs `work` in `tx`, the key claimed with `token`; writes the result and commits, or rolls
/// back when `work` or the result's write fails.
async fn finish<T, E, F>(
    mut tx: sqlx::Transaction<'_, Postgres>,
    key: StoreKey<'_>,
    cols: (&str, &str),
    token: &str,
    ttl: Duration,
    work: F,
) -> Result<T, E>
where
    F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    T: crate::bounds::Replayable,
    E: crate::bounds::FromJobguard,
{
    match work(&mut tx).await {
        Ok(value) => {
            if let Err(e) = store_result(&mut tx, key, cols, token, &value, ttl).await {
                let _ = tx.rollback().await;
                return Err(E::from(e));
            }
            tx.commit()
                .await
                .map_err(|e| E::from(store_error("commit failed", &e)))?;
            Ok(value)
        }
        Err(error) => {
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}

/// Sent after the fast path's `BEGIN`, in the same message: every statement of one simple-query
/// message has that message's `statement_timestamp()`, and a transaction begun by it has it as
/// its `now()`. A transaction begun by an earlier message (a `BEGIN` the caller sent as SQL,
/// which sqlx does not count, so `is_in_transaction()` is false) started before, and the `BEGIN`
/// here only warns: the block then fails, before the claim, so that jobguard does not commit the
/// caller's transaction.
const NOT_NESTED: &str = "DO $jobguard$ BEGIN IF now() <> statement_timestamp() THEN \
     RAISE EXCEPTION 'jobguard: the connection is already in a transaction' \
     USING ERRCODE = '25001'; END IF; END $jobguard$;";

/// Whether `e` is [`NOT_NESTED`]'s error: the connection was in a transaction sqlx did not begin.
fn is_nested_begin(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.code().as_deref() == Some("25001")
            && db.message().starts_with("jobguard: "))
}

/// The error [`Begin::run`] gives for a connection in a transaction that sqlx did not begin.
fn nested_begin_error() -> Error {
    Error::Config(
        "PgStore::begin (or #[idempotent(transaction = ..)] given a connection sqlx sees outside \
         a transaction) found the connection inside a transaction begun without sqlx (a BEGIN \
         sent as SQL), which it would have committed; that transaction is rolled back and the \
         job did not run. Begin the transaction through sqlx (pool.begin(), conn.begin()) and \
         pass it: PgStore::in_transaction(&mut tx, ..), or the function's `&mut tx`"
            .into(),
    )
}

/// Whether `e` is the claim's `INSERT` meeting the key's committed row.
fn is_key_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.code().as_deref() == Some("23505")
            && db.constraint() == Some("jobguard_keys_pkey"))
}

/// `BEGIN` and the claim's `INSERT`, for one simple-query message. A simple query takes no
/// bound parameters, so the values are literals: each text value as the hex of its UTF-8 bytes
/// (`convert_from(decode('…', 'hex'), 'UTF8')`), which no value can break out of, whatever the
/// server's string settings; the lease as an integer.
fn begin_claim_sql(
    scope: &str,
    key: &str,
    token: &str,
    fingerprint: Option<&str>,
    lease: Duration,
) -> String {
    fn text(out: &mut String, value: &str) {
        out.push_str("convert_from(decode('");
        for b in value.as_bytes() {
            let _ = write!(out, "{b:02x}");
        }
        out.push_str("', 'hex'), 'UTF8')");
    }
    let mut sql = String::with_capacity(
        200 + 2 * (scope.len() + key.len() + token.len() + fingerprint.map_or(0, str::len)),
    );
    sql.push_str("BEGIN; ");
    sql.push_str(NOT_NESTED);
    sql.push_str(
        " INSERT INTO jobguard_keys (scope, key, token, fingerprint, result, expires_at) \
         VALUES (",
    );
    text(&mut sql, scope);
    sql.push_str(", ");
    text(&mut sql, key);
    sql.push_str(", ");
    text(&mut sql, token);
    sql.push_str(", ");
    match fingerprint {
        Some(fp) => text(&mut sql, fp),
        None => sql.push_str("NULL"),
    }
    let _ = write!(
        sql,
        ", NULL, now() + {} * interval '1 microsecond')",
        micros(lease)
    );
    sql
}

/// Writes `value` as the result of the key row that `token` claimed in this transaction: the
/// one statement after the body, on both transactional paths.
async fn store_result<T: crate::bounds::Replayable>(
    conn: &mut PgConnection,
    key: StoreKey<'_>,
    (scope, stored): (&str, &str),
    token: &str,
    value: &T,
    ttl: Duration,
) -> Result<(), Error> {
    // A result that could not be replayed fails the call, and the caller rolls the body's
    // writes back.
    let record = encode_replayable(value).map_err(|why| {
        Error::Unreplayable(format!(
            "the result for {}:{} cannot be kept to replay ({why}), so it was not stored; roll \
             the transaction back",
            key.scope, key.key
        ))
    })?;
    sqlx::query(COMPLETE_IN)
        .bind(scope)
        .bind(stored)
        .bind(token)
        .bind(&record)
        .bind(micros(ttl))
        .execute(conn)
        .await
        .map_err(|e| store_error("storing the result failed", &e))?;
    Ok(())
}

/// What the key's row held when claimed in a transaction.
enum Found {
    Acquired,
    Completed(Vec<u8>),
    /// Another fingerprint holds the key: `completed`, or a live claim (which may yet be
    /// released, so a runner's delivery is not settled by it).
    Reused {
        completed: bool,
    },
    Claimed,
}

/// The key's row as a statement outside the claim's `INSERT` reads it.
enum Seen {
    /// No row: deleted since the insert met it.
    Gone,
    /// Free to take over: expired, released, or a claim whose lease lapsed.
    Free,
    /// Completed, held by a live claim, or holding another fingerprint.
    Live(Found),
}

async fn read_in(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
    fingerprint: Option<&str>,
) -> Result<Seen, Error> {
    let fail = |e: sqlx::Error| store_error("claim failed", &e);
    let Some(row) = sqlx::query(READ_IN.as_str())
        .bind(scope)
        .bind(key)
        .bind(fingerprint)
        .fetch_optional(&mut *conn)
        .await
        .map_err(fail)?
    else {
        return Ok(Seen::Gone);
    };
    let get = |i| row.try_get::<bool, _>(i).map_err(fail);
    let (free, reused, completed) = (get(0)?, get(1)?, get(2)?);
    if free {
        return Ok(Seen::Free);
    }
    if get(4)? {
        // Poisoned by the `Store` form's crash count: refused here too.
        let crashes: i32 = row.try_get(5).map_err(fail)?;
        return Err(Error::Poisoned {
            crashes: u32::try_from(crashes).unwrap_or(0),
        });
    }
    Ok(Seen::Live(if reused {
        Found::Reused { completed }
    } else if completed {
        let result: Option<Vec<u8>> = row.try_get(3).map_err(fail)?;
        Found::Completed(
            result.ok_or_else(|| {
                Error::Corrupt("a completed idempotency row without a result".into())
            })?,
        )
    } else {
        Found::Claimed
    }))
}

async fn claim_in(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
    token: &str,
    fingerprint: Option<&str>,
) -> Result<Found, Error> {
    let fail = |e: sqlx::Error| store_error("claim failed", &e);
    // The insert waits on a row another transaction inserted and has not committed; each
    // statement after it sees what that transaction committed. A row that vanished or changed
    // between two statements sends the loop round again.
    for _ in 0..8 {
        let inserted = sqlx::query(INSERT_IN)
            .bind(scope)
            .bind(key)
            .bind(token)
            .bind(fingerprint)
            .bind(micros(DEFAULT_LEASE))
            .fetch_optional(&mut *conn)
            .await
            .map_err(fail)?;
        if inserted.is_some() {
            return Ok(Found::Acquired);
        }
        match read_in(&mut *conn, scope, key, fingerprint).await? {
            Seen::Gone => continue,
            Seen::Live(found) => return Ok(found),
            Seen::Free => {}
        }
        let taken = sqlx::query(TAKE_OVER_IN.as_str())
            .bind(scope)
            .bind(key)
            .bind(token)
            .bind(fingerprint)
            .bind(micros(DEFAULT_LEASE))
            .fetch_optional(&mut *conn)
            .await
            .map_err(fail)?;
        if taken.is_some() {
            return Ok(Found::Acquired);
        }
    }
    Err(Error::Store(
        "claim failed: the key kept changing under concurrent claims".into(),
    ))
}

// $1 scope, $2 key, $3 token, $4 fingerprint, $5 lease in µs.
const INSERT_IN: &str = r#"
INSERT INTO jobguard_keys (scope, key, token, fingerprint, result, expires_at)
VALUES ($1, $2, $3, $4, NULL, now() + $5::bigint * interval '1 microsecond')
ON CONFLICT (scope, key) DO NOTHING
RETURNING 1
"#;

// $1 scope, $2 key, $3 fingerprint. Whether the row is free as `CLAIM` takes it (`FREE`), then
// what a live row says.
static READ_IN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        r#"
SELECT {FREE},
       k.fingerprint IS NOT NULL AND $3::text IS NOT NULL AND k.fingerprint <> $3::text,
       k.token IS NULL,
       k.result,
       k.poisoned,
       k.crashes
FROM jobguard_keys k WHERE k.scope = $1 AND k.key = $2
"#
    )
});

// $1 scope, $2 key, $3 token, $4 fingerprint, $5 lease in µs. Takes over an expired row, a
// released one, or a claim whose lease lapsed: one more generation, as `CLAIM`, so the lapsed
// claim's holder is fenced off (its token and generation are gone), and its crash counted as
// `CLAIM` counts it (`CRASHES_AFTER`; with no crash limit here, the row is not poisoned).
static TAKE_OVER_IN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        r#"
UPDATE jobguard_keys AS k
SET token = $3, fingerprint = $4, result = NULL, poisoned = false, lease_ends_at = NULL,
    generation = k.generation + 1,
    crashes = {CRASHES_AFTER},
    expires_at = now() + $5::bigint * interval '1 microsecond'
WHERE k.scope = $1 AND k.key = $2 AND {FREE}
RETURNING 1
"#
    )
});

// $1 scope, $2 key, $3 token, $4 result, $5 ttl in µs. The transaction's own row: no lease
// check, since no one else can see it before the commit.
const COMPLETE_IN: &str = r#"
UPDATE jobguard_keys
SET token = NULL, result = $4, lease_ends_at = NULL, expires_at = now() + $5::bigint * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND token = $3
"#;

/// One guarded call's savepoint, shared by all its attempts: what `#[idempotent(transaction =
/// tx)]` with `#[retry]` runs each attempt in, and what to use by hand around [`Policy::run`]
/// (or [`run_if_ok`](crate::Policy::run_if_ok)) when a transaction's statements are retried.
///
/// Its invariant: an attempt never runs on top of an earlier attempt's writes, and nothing
/// commits them, however the earlier attempt ended.
///
/// * The first [`attempt`](Self::attempt) sends `SAVEPOINT` under a name no other `Savepoint`
///   of the process has (so a guarded call nested in the work, on the same connection, has its
///   own). An attempt cut while that statement waits to be sent (sqlx first reads the answer of
///   a statement an earlier cut left running) or answered ran no work after it: the next attempt
///   sends `SAVEPOINT` again, and if the first had reached the server, the two savepoints of one
///   name have no write between them (`ROLLBACK TO` and `RELEASE` act on the newer).
/// * Each later attempt starts with `ROLLBACK TO SAVEPOINT`, unless the previous one failed and
///   was rolled back already. So an attempt that was **cut** (its future dropped while it ran: a
///   per-attempt `timeout`, a `budget`, a lost `select!`) has its writes rolled back before the
///   next one runs, as has one whose `Ok` value the policy retried (`on_ok`). The rollback waits
///   for a statement the cut attempt had sent: sqlx reads its answer first, and the server runs
///   it to its end. To have the server stop a long statement, set a `statement_timeout` for the
///   transaction (`SET LOCAL statement_timeout = '5s'`): it fails the statement with an error,
///   which the next attempt reads and sets aside (a `SELECT 1` before its rollback, whose error
///   is not kept) before it rolls back to the savepoint and runs. Keep the attempt's `timeout`
///   above the `statement_timeout`, or the next attempt spends its own time waiting.
/// * An attempt that fails is rolled back to the savepoint at once, so the transaction takes
///   statements again (after a deadlock, `40P01`, say).
/// * [`finish`](Self::finish), after the policy: a success releases the savepoint, the writes of
///   the attempt that gave it staying in the transaction; a failure whose last attempt was cut
///   is rolled back to the savepoint, so a caller that commits after the error commits none of
///   it.
///
/// A statement of its own that fails (the connection lost, the transaction aborted) is
/// [`Error::Store`] in the job's error type; so is `ROLLBACK TO` a savepoint that does not exist,
/// which leaves the transaction aborted: fail closed. Costs two round trips for a call whose
/// first attempt succeeds (`SAVEPOINT`, `RELEASE`), one more per failed or cut attempt.
///
/// ```no_run
/// # use jobguard::Policy;
/// # use jobguard::store::postgres::Savepoint;
/// # #[derive(Debug)] struct MyError;
/// # impl std::fmt::Display for MyError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("e") } }
/// # impl From<jobguard::Error> for MyError { fn from(_: jobguard::Error) -> Self { MyError } }
/// # impl From<sqlx::Error> for MyError { fn from(_: sqlx::Error) -> Self { MyError } }
/// # impl jobguard::Transient for MyError { fn verdict(&self) -> jobguard::Verdict { jobguard::Verdict::Retry } }
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), MyError> {
/// use std::time::Duration;
///
/// // An attempt cut at 2 s is rolled back before the next one runs.
/// const POLICY: Policy = Policy::new().attempts(3).timeout(Duration::from_secs(2));
/// let mut tx = pool.begin().await?;
/// // Let the server stop a statement the timeout cut, rather than run it to its end.
/// sqlx::raw_sql("SET LOCAL statement_timeout = '2s'").execute(&mut *tx).await?;
/// let mut savepoint = Savepoint::new();
/// let done = POLICY
///     .run("ledger.fee", async |_attempt| {
///         savepoint
///             .attempt(&mut *tx, async |tx| {
///                 sqlx::query("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
///                     .execute(&mut *tx)
///                     .await?;
///                 Ok::<_, MyError>(())
///             })
///             .await
///     })
///     .await;
/// savepoint.finish(&mut *tx, done).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// [`Policy::run`]: crate::Policy::run
#[derive(Debug)]
#[must_use = "a Savepoint's `finish` rolls back a cut last attempt's writes, or releases a successful one's"]
pub struct Savepoint {
    name: String,
    state: SavepointState,
}

/// Where a [`Savepoint`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SavepointState {
    /// No `SAVEPOINT` answered yet. One whose attempt was cut while it was under way may not
    /// have been sent (sqlx sends a statement only once the connection has read the answers
    /// still due, those of a statement an earlier cut left running); nothing ran after it (the
    /// work starts once it is answered), so the next attempt sends it again: a second savepoint
    /// of the name, with no write between the two, which `ROLLBACK TO` and `RELEASE` (acting on
    /// the newest) treat as one.
    Unsent,
    /// Sent, and writes may have followed it (an attempt ran, or is cut).
    Dirty,
    /// Rolled back to: the transaction stands where the first attempt started.
    Clean,
}

/// Numbers the savepoints of the process, so that no two share a name.
static SAVEPOINTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Default for Savepoint {
    fn default() -> Self {
        Self::new()
    }
}

impl Savepoint {
    /// A savepoint for one call, not sent yet: named `jobguard_attempt_<n>`, `n` new in the
    /// process.
    pub fn new() -> Self {
        let n = SAVEPOINTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Savepoint {
            name: format!("jobguard_attempt_{n}"),
            state: SavepointState::Unsent,
        }
    }

    /// Runs one attempt: makes the savepoint (the first attempt) or rolls back to it (a later
    /// one, after an attempt that was cut or succeeded), then runs `work`. A failed `work` is
    /// rolled back to the savepoint before its error is returned; a successful one leaves its
    /// writes until [`finish`](Self::finish) (or the next attempt, if the policy retries its
    /// value).
    ///
    /// `conn` is the connection of a transaction (the same one for every attempt). A statement
    /// of its own that fails is [`Error::Store`], and `work` does not run or its error is
    /// replaced.
    pub async fn attempt<T, E, F>(&mut self, conn: &mut PgConnection, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
        E: crate::bounds::FromJobguard,
    {
        let fail = |what: &str, e: sqlx::Error| E::from(store_error(what, &e));
        match self.state {
            // Still `Unsent` if this attempt is cut before the answer: the next one sends it
            // again.
            SavepointState::Unsent => {
                self.execute(conn, "SAVEPOINT")
                    .await
                    .map_err(|e| fail("savepoint failed", e))?;
            }
            SavepointState::Dirty => {
                // The answer of a statement the cut attempt left running (a `statement_timeout`
                // that ended it, say) is read first, and is not this rollback's error.
                drain(conn)
                    .await
                    .map_err(|e| fail("rolling back the earlier attempt failed", e))?;
                self.execute(conn, "ROLLBACK TO SAVEPOINT")
                    .await
                    .map_err(|e| fail("rolling back the earlier attempt failed", e))?;
            }
            SavepointState::Clean => {}
        }
        // The work may write after the savepoint from here on, however the attempt ends.
        self.state = SavepointState::Dirty;
        match work(&mut *conn).await {
            Ok(value) => Ok(value),
            Err(error) => {
                self.execute(conn, "ROLLBACK TO SAVEPOINT")
                    .await
                    .map_err(|e| fail("rolling back to the savepoint failed", e))?;
                self.state = SavepointState::Clean;
                Err(error)
            }
        }
    }

    /// Ends the call with the policy's `result`: an `Ok` releases the savepoint (the writes of
    /// the attempt that gave it stay in the transaction); an `Err` whose last attempt was cut
    /// rolls its writes back, and is returned as it is.
    ///
    /// A `RELEASE` that fails is [`Error::Store`]: the call then failed, and the transaction is to
    /// be rolled back. A rollback that fails leaves the error as it is: the transaction is then
    /// aborted, and cannot commit.
    pub async fn finish<T, E>(self, conn: &mut PgConnection, result: Result<T, E>) -> Result<T, E>
    where
        E: crate::bounds::FromJobguard,
    {
        match (&result, self.state) {
            // Unsent: the last attempt was cut before its work ran, so it wrote nothing.
            (_, SavepointState::Unsent) | (Err(_), SavepointState::Clean) => result,
            (Ok(_), _) => {
                self.execute(conn, "RELEASE SAVEPOINT")
                    .await
                    .map_err(|e| E::from(store_error("releasing the savepoint failed", &e)))?;
                result
            }
            (Err(_), SavepointState::Dirty) => {
                if drain(conn).await.is_ok() {
                    let _ = self.execute(conn, "ROLLBACK TO SAVEPOINT").await;
                }
                result
            }
        }
    }

    async fn execute(&self, conn: &mut PgConnection, verb: &str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{verb} {}", self.name)))
            .execute(conn)
            .await
            .map(drop)
    }
}

/// Waits for the answers a cut attempt left due on `conn`, with a `SELECT 1` whose database
/// error is not kept: sqlx reports such an answer's error (a statement that the cut attempt
/// left running and `statement_timeout` ended) as the next statement's, and, in a transaction
/// that error aborted, the `SELECT 1` fails too until the rollback to the savepoint. An error of
/// the connection itself is returned.
async fn drain(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    match sqlx::raw_sql("SELECT 1").execute(&mut *conn).await {
        Ok(_) | Err(sqlx::Error::Database(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs `work` in a savepoint of the transaction that `conn` is in: released when `work`
/// succeeds, rolled back when it fails, so the transaction takes statements again and a retry
/// starts from where the attempt started. Costs two round trips (`SAVEPOINT`, then `RELEASE` or
/// `ROLLBACK TO`).
///
/// It holds no state from one attempt to the next; around a policy with a `timeout`, a `budget`
/// or `on_ok`, prefer [`Savepoint`], made once for the call. This function is safe there too
/// in most cases: the savepoint is sqlx's own (`conn.begin()` inside a transaction, named after
/// its depth, so a guarded call nested in `work` has its own), and when the future is dropped
/// while `work` runs (an attempt **cut**), sqlx queues its `ROLLBACK TO SAVEPOINT`, sent before
/// the connection's next statement, after the answer of any statement the cut attempt had sent
/// (which the server runs to its end; see [`Savepoint`] for `statement_timeout`). So the next
/// attempt starts without the cut attempt's writes. Two limits:
///
/// * An attempt cut while sqlx waits for the `SAVEPOINT` itself makes sqlx roll back the whole
///   transaction: the next call is then [`Error::Config`] (the connection is in no transaction
///   sqlx knows of), nothing of the transaction commits, and the caller's `commit` sends
///   nothing. After an attempt (number 2 or more, from [`attempt()`](crate::attempt())) the
///   connection is first waited on with `SELECT 1`, so that the `SAVEPOINT`'s wait is one
///   round trip, not the end of a statement a cut attempt left running.
/// * An attempt that returns `Ok` releases its savepoint: a policy that retries an `Ok` value
///   (`on_ok`) keeps the writes of every such attempt. [`Savepoint`] does not.
///
/// A savepoint that cannot be made or ended is [`Error::Store`] in the job's error type. `conn`
/// must be in a transaction begun through sqlx (`pool.begin()`, `conn.begin()`, or the
/// connection [`InTransaction::run`] and [`Begin::run`] hand to their work); otherwise the call
/// is [`Error::Config`] and `work` does not run.
///
/// ```no_run
/// # use jobguard::Policy;
/// # use jobguard::store::postgres::savepoint;
/// # #[derive(Debug)] struct MyError;
/// # impl std::fmt::Display for MyError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("e") } }
/// # impl From<jobguard::Error> for MyError { fn from(_: jobguard::Error) -> Self { MyError } }
/// # impl From<sqlx::Error> for MyError { fn from(_: sqlx::Error) -> Self { MyError } }
/// # impl jobguard::Transient for MyError { fn verdict(&self) -> jobguard::Verdict { jobguard::Verdict::Retry } }
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), MyError> {
/// // A deadlock (40P01) is retried, each attempt from where the first one started.
/// const POLICY: Policy = Policy::new().attempts(3);
/// let mut tx = pool.begin().await?;
/// POLICY
///     .run("ledger.fee", async |_attempt| {
///         savepoint(&mut *tx, async |tx| {
///             sqlx::query("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
///                 .execute(&mut *tx)
///                 .await?;
///             Ok::<_, MyError>(())
///         })
///         .await
///     })
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn savepoint<T, E, F>(conn: &mut PgConnection, work: F) -> Result<T, E>
where
    F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    E: crate::bounds::FromJobguard,
{
    let fail = |what: &str, e: sqlx::Error| E::from(store_error(what, &e));
    if !conn.is_in_transaction() {
        // `begin` would open a transaction (and `commit` commit it) instead of a savepoint.
        return Err(E::from(Error::Config(
            "jobguard::store::postgres::savepoint needs a connection inside a transaction begun \
             through sqlx (pool.begin(), conn.begin()), and this one is in none that sqlx knows \
             of: a BEGIN sent as SQL, or a transaction sqlx rolled back whole because an \
             attempt was cut while its SAVEPOINT was under way (use Savepoint around a policy \
             with a timeout)"
                .into(),
        )));
    }
    if crate::attempt::attempt().is_some_and(|a| a.number > 1) {
        // Whatever an earlier attempt left running ends here, not in the SAVEPOINT's wait.
        drain(conn).await.map_err(|e| fail("savepoint failed", e))?;
    }
    // Dropped while `work` runs, `attempt` queues its `ROLLBACK TO SAVEPOINT` on `conn`.
    let mut attempt = conn
        .begin()
        .await
        .map_err(|e| fail("savepoint failed", e))?;
    match work(&mut attempt).await {
        Ok(value) => {
            attempt
                .commit()
                .await
                .map_err(|e| fail("releasing the savepoint failed", e))?;
            Ok(value)
        }
        Err(error) => {
            attempt
                .rollback()
                .await
                .map_err(|e| fail("rolling back to the savepoint failed", e))?;
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rk<'a>(scope: &'a str, key: &'a str) -> (String, String) {
        let (s, k) = PgStore::row_key(StoreKey { scope, key });
        (s.into_owned(), k.into_owned())
    }

    #[test]
    fn short_keys_without_nul_are_verbatim() {
        assert_eq!(rk("payments.charge", "idem-1").1, "idem-1");
        assert_eq!(rk("s", "has space, café").1, "has space, café");
        assert_eq!(rk("s", &"k".repeat(200)).1, "k".repeat(200));
        assert_eq!(rk("it's \"quoted\"", "k").0, "it's \"quoted\"");
    }

    #[test]
    fn long_nul_and_hash_keys_are_hashed() {
        for key in ["k".repeat(201), "nul\0".into(), "#x".into()] {
            let stored = rk("s", &key).1;
            assert!(stored.starts_with("#sha256:"), "{key:?}");
            assert_eq!(stored.len(), 8 + 64);
        }
        assert_ne!(rk("s", "a\0").1, rk("s", "a\0\0").1);
    }

    #[test]
    fn scopes_escape_percent_and_nul() {
        assert_eq!(rk("a\0b", "k").0, "a%00b");
        assert_eq!(rk("a%00b", "k").0, "a%2500b");
        assert_ne!(rk("a\0b", "k"), rk("a%00b", "k"));
    }

    #[test]
    fn the_begin_claim_holds_values_as_hex_only() {
        let sql = begin_claim_sql(
            "s'cope",
            "k\\'); DROP TABLE x; --",
            "t",
            Some("f"),
            Duration::from_secs(1),
        );
        let values = sql.split_once("VALUES (").unwrap().1;
        assert!(!values.contains("DROP") && !values.contains("s'"), "{sql}");
        assert!(sql.starts_with("BEGIN; DO $jobguard$ BEGIN IF now() <> statement_timestamp()"));
        assert!(sql.contains("END $jobguard$; INSERT INTO jobguard_keys"));
        assert!(values.contains("convert_from(decode('7327636f7065', 'hex'), 'UTF8')"));
        assert!(values.ends_with("NULL, now() + 1000000 * interval '1 microsecond')"));
        assert!(begin_claim_sql("s", "k", "t", None, Duration::ZERO).contains(", NULL, NULL, "));
    }

    #[test]
    fn micros_is_clamped() {
        assert_eq!(micros(Duration::ZERO), 1);
        assert_eq!(micros(Duration::from_millis(300)), 300_000);
        assert_eq!(micros(Duration::MAX), 1 << 53);
    }
}
