//! A retried attempt cut by `#[retry(timeout = ...)]` (its future dropped mid-body) in a Postgres
//! transaction, against a private `postgres`: the cut attempt's writes are rolled back before the
//! next attempt, so the commit holds one attempt's writes, with the caller's transaction, with a
//! transaction jobguard begins, through `Policy::run` and `savepoint` by hand (the attempt cut
//! during a statement as well as between two), and with a guarded call nested in the cut one.

use jobguard_testkit::pg_job::{JobError, effect_ids, effects, make_effects, pool};
use jobguard_testkit::postgres;

use jobguard::store::postgres::{Savepoint, savepoint};
use jobguard::{PgStore, Policy};
use postgres::PgServer;
use sqlx::{PgConnection, PgPool};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Longer than any attempt's timeout here: an attempt that waits for it is cut.
const HANG: Duration = Duration::from_secs(30);

/// A policy of `attempts` attempts 1 ms apart, each cut after `timeout_ms`.
const fn cutting(attempts: u32, timeout_ms: u64) -> Policy {
    Policy::new()
        .attempts(attempts)
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(1))
        .timeout(Duration::from_millis(timeout_ms))
}

/// A private `postgres` (none if it cannot start: the test passes without it) and a pool on it
/// with jobguard's tables and an `effects` table. Keep the server while the pool is used.
async fn setup() -> Option<(PgServer, PgPool)> {
    let server = PgServer::start()?;
    let pool = pool(&server.url(), 4).await;
    PgStore::new(pool.clone()).migrate().await.unwrap();
    make_effects(&pool).await;
    Some((server, pool))
}

/// Runs `f` in a transaction begun on `pool`, then commits it (`f` panics on its own failure,
/// before the commit).
async fn committed<T>(pool: &PgPool, f: impl AsyncFnOnce(&mut PgConnection) -> T) -> T {
    let mut tx = pool.begin().await.unwrap();
    let out = f(&mut tx).await;
    tx.commit().await.unwrap();
    out
}

async fn effect(conn: &mut PgConnection, key: &str) -> Result<i64, JobError> {
    Ok(
        sqlx::query_scalar("INSERT INTO effects (key) VALUES ($1) RETURNING id")
            .bind(key)
            .fetch_one(conn)
            .await?,
    )
}

/// The first attempt writes its effect, then hangs past the timeout and is cut.
async fn hang_first(calls: &AtomicU32) {
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        tokio::time::sleep(HANG).await;
    }
}

/// Writes `key`'s effect, then hangs past any timeout: every attempt is cut.
async fn write_then_hang(tx: &mut PgConnection, key: &str) -> Result<(), JobError> {
    effect(&mut *tx, key).await?;
    tokio::time::sleep(HANG).await;
    Ok(())
}

/// Writes `key`'s effect; the first attempt (by `calls`) then stalls past the timeout, inside a
/// statement the server runs (`in_statement`: the next attempt's first statement waits for its
/// end, about half a second) or between statements.
async fn write_then_stall(
    tx: &mut PgConnection,
    key: &str,
    calls: &AtomicU32,
    in_statement: bool,
) -> Result<(), JobError> {
    effect(&mut *tx, key).await?;
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        if in_statement {
            sqlx::query("SELECT pg_sleep(0.5)")
                .execute(&mut *tx)
                .await?;
        } else {
            tokio::time::sleep(HANG).await;
        }
    }
    Ok(())
}

/// The call ran two attempts (by `calls`), the first cut, and `key`'s effect committed once.
async fn assert_cut_once(pool: &PgPool, calls: &AtomicU32, key: &str) {
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "{key}: the first attempt was cut"
    );
    assert_eq!(effects(pool, key).await, 1, "{key}: the cut attempt's row");
}

/// The call failed with the attempts' timeout.
#[track_caller]
fn assert_timed_out<T: Debug>(out: &Result<T, JobError>) {
    assert!(
        matches!(out, Err(JobError::Guard(jobguard::Error::Timeout))),
        "{out:?}"
    );
}

/// The call was refused as misused (`Error::Config`).
#[track_caller]
fn assert_refused<T: Debug>(out: &Result<T, JobError>) {
    assert!(
        matches!(out, Err(JobError::Guard(jobguard::Error::Config(_)))),
        "{out:?}"
    );
}

static CALLER_TX: AtomicU32 = AtomicU32::new(0);

#[jobguard::idempotent(key = key, transaction = tx, scope = "t.timeout.caller")]
#[jobguard::retry(attempts = 3, base = "1ms", cap = "1ms", jitter = none, timeout = "200ms")]
async fn in_caller_tx(tx: &mut PgConnection, key: &str) -> Result<i64, JobError> {
    let id = effect(&mut *tx, key).await?;
    hang_first(&CALLER_TX).await;
    Ok(id)
}

static OWN_TX: AtomicU32 = AtomicU32::new(0);

#[jobguard::idempotent(key = key, transaction = tx, scope = "t.timeout.own")]
#[jobguard::retry(attempts = 3, base = "1ms", cap = "1ms", jitter = none, timeout = "200ms")]
async fn in_own_tx(tx: &mut PgConnection, key: &str) -> Result<i64, JobError> {
    let id = effect(&mut *tx, key).await?;
    hang_first(&OWN_TX).await;
    Ok(id)
}

#[tokio::test]
async fn a_cut_attempt_in_the_callers_transaction_leaves_no_effect() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    let id = committed(&pool, async |tx| in_caller_tx(tx, "caller").await.unwrap()).await;
    assert_cut_once(&pool, &CALLER_TX, "caller").await;
    assert_eq!(
        effect_ids(&pool, "caller").await,
        [id],
        "the second attempt's row is the one committed"
    );
}

#[tokio::test]
async fn a_cut_attempt_in_a_transaction_jobguard_begins_leaves_no_effect() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    let mut conn = pool.acquire().await.unwrap();
    in_own_tx(&mut conn, "own").await.unwrap();
    assert_cut_once(&pool, &OWN_TX, "own").await;
}

/// `Policy::run` with `savepoint` by hand: the first attempt is cut between its statements (by
/// the timeout while it waits) or inside one (`pg_sleep` running on the server).
#[tokio::test]
async fn the_manual_pattern_rolls_a_cut_attempt_back_between_or_during_statements() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    const POLICY: Policy = cutting(3, 200);
    for (key, in_statement) in [("between", false), ("during", true)] {
        let calls = AtomicU32::new(0);
        committed(&pool, async |tx| {
            PgStore::in_transaction(tx, "t.timeout.manual", key)
                .run(async |tx| {
                    POLICY
                        .run("t.timeout.manual", async |_attempt| {
                            savepoint(&mut *tx, async |tx| {
                                write_then_stall(tx, key, &calls, in_statement).await
                            })
                            .await
                        })
                        .await
                })
                .await
                .unwrap()
        })
        .await;
        assert_cut_once(&pool, &calls, key).await;
    }
}

/// Every attempt is cut: the call fails with the timeout, and a caller that commits anyway
/// commits none of the attempts' writes.
#[tokio::test]
async fn when_every_attempt_is_cut_no_attempts_writes_remain_even_if_the_caller_commits() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    const POLICY: Policy = cutting(2, 100);
    committed(&pool, async |tx| {
        let out = POLICY
            .run("t.timeout.all", async |_attempt| {
                savepoint(&mut *tx, async |tx| write_then_hang(tx, "all").await).await
            })
            .await;
        assert_timed_out(&out);
    })
    .await;
    assert_eq!(effects(&pool, "all").await, 0);
    // The same with a `Savepoint` for the call: `finish` rolls the last cut attempt back.
    committed(&pool, async |tx| {
        let mut attempts = Savepoint::new();
        let out = POLICY
            .run("t.timeout.all", async |_attempt| {
                attempts
                    .attempt(&mut *tx, async |tx| {
                        write_then_hang(tx, "all.savepoint").await
                    })
                    .await
            })
            .await;
        assert_timed_out(&attempts.finish(&mut *tx, out).await);
    })
    .await;
    assert_eq!(effects(&pool, "all.savepoint").await, 0);
}

static OUTER: AtomicU32 = AtomicU32::new(0);
static INNER: AtomicU32 = AtomicU32::new(0);

#[jobguard::idempotent(key = key, transaction = tx, scope = "t.timeout.inner")]
#[jobguard::retry(attempts = 2, base = "1ms", cap = "1ms", jitter = none)]
async fn inner(tx: &mut PgConnection, key: &str) -> Result<i64, JobError> {
    INNER.fetch_add(1, Ordering::SeqCst);
    effect(&mut *tx, key).await
}

/// A guarded call nested in the outer one's attempt, on the same connection: its savepoint is
/// its own, and the outer attempt's cut rolls back the inner call's effect and key with it.
#[jobguard::idempotent(key = key, transaction = tx, scope = "t.timeout.outer")]
#[jobguard::retry(attempts = 3, base = "1ms", cap = "1ms", jitter = none, timeout = "200ms")]
async fn outer(tx: &mut PgConnection, key: &str) -> Result<i64, JobError> {
    let inner_id = inner(&mut *tx, &format!("{key}.inner")).await?;
    effect(&mut *tx, key).await?;
    hang_first(&OUTER).await;
    Ok(inner_id)
}

#[tokio::test]
async fn a_nested_guarded_call_in_a_cut_attempt_is_rolled_back_with_it() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    let inner_id = committed(&pool, async |tx| outer(tx, "nest").await.unwrap()).await;
    assert_eq!(
        OUTER.load(Ordering::SeqCst),
        2,
        "the first outer attempt was cut"
    );
    assert_eq!(
        INNER.load(Ordering::SeqCst),
        2,
        "the inner call ran again: its key went with the cut attempt"
    );
    assert_eq!(effects(&pool, "nest").await, 1);
    assert_eq!(effect_ids(&pool, "nest.inner").await, [inner_id]);
    // Committed once each: a second call replays both.
    let again = committed(&pool, async |tx| outer(tx, "nest").await.unwrap()).await;
    assert_eq!(again, inner_id);
    assert_eq!(OUTER.load(Ordering::SeqCst), 2);
    assert_eq!(effects(&pool, "nest").await, 1);
}

/// `savepoint` on a connection outside a transaction would begin one (and commit it): refused,
/// and the work does not run.
#[tokio::test]
async fn savepoint_outside_a_transaction_is_refused() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    let mut conn = pool.acquire().await.unwrap();
    assert_refused(&savepoint(&mut conn, async |tx| effect(tx, "outside").await).await);
    assert_eq!(effects(&pool, "outside").await, 0);
}

/// `Policy::run` with a `Savepoint` made for the call: the first attempt cut between its
/// statements or inside one, every later attempt rolled back to the one savepoint.
#[tokio::test]
async fn a_savepoint_for_the_call_rolls_a_cut_attempt_back_between_or_during_statements() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    const POLICY: Policy = cutting(3, 200);
    for (key, in_statement) in [("sp.between", false), ("sp.during", true)] {
        let calls = AtomicU32::new(0);
        committed(&pool, async |tx| {
            let mut attempts = Savepoint::new();
            let done = POLICY
                .run("t.timeout.savepoint", async |_attempt| {
                    attempts
                        .attempt(&mut *tx, async |tx| {
                            write_then_stall(tx, key, &calls, in_statement).await
                        })
                        .await
                })
                .await;
            attempts.finish(&mut *tx, done).await.unwrap();
        })
        .await;
        assert_cut_once(&pool, &calls, key).await;
    }
}

static OK_SEEN: AtomicU32 = AtomicU32::new(0);

/// The first `Ok` is retried.
fn first_ok(_: &i64) -> bool {
    OK_SEEN.fetch_add(1, Ordering::SeqCst) == 0
}

#[jobguard::idempotent(key = key, transaction = tx, scope = "t.timeout.on_ok")]
#[jobguard::retry(attempts = 3, base = "1ms", cap = "1ms", jitter = none, on_ok = first_ok)]
async fn retried_ok(tx: &mut PgConnection, key: &str) -> Result<i64, JobError> {
    effect(&mut *tx, key).await
}

#[tokio::test]
async fn an_attempt_whose_ok_is_retried_is_rolled_back_too() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    let id = committed(&pool, async |tx| retried_ok(tx, "on_ok").await.unwrap()).await;
    assert_eq!(
        OK_SEEN.load(Ordering::SeqCst),
        2,
        "the first Ok was retried"
    );
    assert_eq!(
        effect_ids(&pool, "on_ok").await,
        [id],
        "only the returned attempt's row"
    );
}

/// Writes `{key}.before`'s effect in `tx`, then leaves a statement running, as a cut attempt
/// would: a statement whose end the next statement waits for.
async fn write_then_leave_a_statement_running(tx: &mut PgConnection, key: &str) {
    effect(&mut *tx, &format!("{key}.before")).await.unwrap();
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        sqlx::query("SELECT pg_sleep(0.5)").execute(&mut *tx),
    )
    .await;
    assert!(cut.is_err(), "the statement was cut");
}

/// The committed effects of `{key}.before` and of `key`.
async fn before_and_after(pool: &PgPool, key: &str) -> (i64, i64) {
    (
        effects(pool, &format!("{key}.before")).await,
        effects(pool, key).await,
    )
}

/// An attempt cut while its own `SAVEPOINT` waits (here behind a statement left running, so
/// the `SAVEPOINT` is never sent), twice: with a `Savepoint`, the next attempt sends it again,
/// and the call succeeds with one effect; `savepoint`, on
/// sqlx's savepoint transaction, has sqlx roll the whole transaction back, and then fails
/// closed: the next call is `Error::Config`, and nothing of the transaction commits.
#[tokio::test]
async fn an_attempt_cut_while_its_savepoint_is_made_fails_closed() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    let cut = Duration::from_millis(100);

    committed(&pool, async |tx| {
        write_then_leave_a_statement_running(tx, "made").await;
        let mut attempts = Savepoint::new();
        // Cut twice; the second time the statement still runs, and that SAVEPOINT is not sent
        // either.
        for nth in ["first", "second"] {
            let out = tokio::time::timeout(
                cut,
                attempts.attempt(&mut *tx, async |tx| effect(tx, "made").await),
            )
            .await;
            assert!(out.is_err(), "the {nth} attempt was cut");
        }
        let third = attempts
            .attempt(&mut *tx, async |tx| effect(tx, "made").await)
            .await;
        let third = attempts.finish(&mut *tx, third).await;
        assert!(third.is_ok(), "{third:?}");
    })
    .await;
    assert_eq!(before_and_after(&pool, "made").await, (1, 1));

    committed(&pool, async |tx| {
        write_then_leave_a_statement_running(tx, "fn").await;
        let first =
            tokio::time::timeout(cut, savepoint(&mut *tx, async |tx| effect(tx, "fn").await)).await;
        assert!(first.is_err(), "the first attempt was cut");
        assert_refused(&savepoint(&mut *tx, async |tx| effect(tx, "fn").await).await);
    })
    .await;
    assert_eq!(
        before_and_after(&pool, "fn").await,
        (0, 0),
        "nothing of the transaction committed"
    );
}

static STATEMENT_TIMEOUT: AtomicU32 = AtomicU32::new(0);

/// The first attempt's statement outlives the attempt: cut at 250 ms, the server ends it at
/// 300 ms (`statement_timeout`), and its error is the answer the next attempt reads first.
#[jobguard::idempotent(key = key, transaction = tx, scope = "t.timeout.statement")]
#[jobguard::retry(attempts = 2, base = "1ms", cap = "1ms", jitter = none, timeout = "250ms")]
async fn outlives_its_attempt(tx: &mut PgConnection, key: &str) -> Result<i64, JobError> {
    let id = effect(&mut *tx, key).await?;
    if STATEMENT_TIMEOUT.fetch_add(1, Ordering::SeqCst) == 0 {
        sqlx::query("SELECT pg_sleep(5)").execute(&mut *tx).await?;
    }
    Ok(id)
}

#[tokio::test]
async fn a_statement_timeout_that_ends_a_cut_attempt_s_statement_does_not_fail_the_next() {
    let Some((_server, pool)) = setup().await else {
        return;
    };
    let id = committed(&pool, async |tx| {
        sqlx::query("SET LOCAL statement_timeout = '300ms'")
            .execute(&mut *tx)
            .await
            .unwrap();
        outlives_its_attempt(tx, "statement")
            .await
            .expect("the second attempt runs: the first's statement error is not its own")
    })
    .await;
    assert_cut_once(&pool, &STATEMENT_TIMEOUT, "statement").await;
    assert_eq!(effect_ids(&pool, "statement").await, [id]);
}
