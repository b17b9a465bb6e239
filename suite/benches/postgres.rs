//! `PgStore` against a private `postgres`, each figure beside its peer in the same run, on the
//! same server and the same pool:
//!
//! * claim + complete (one idempotent job's store traffic, two statements) with 1 and 16
//!   concurrent tasks, beside the bare pair a hand-written idempotency check costs: an
//!   `INSERT ... ON CONFLICT DO NOTHING` and an `UPDATE` of the same row, on the same table;
//! * a job in the caller's transaction (`PgStore::in_transaction`: begin, the key, one effect
//!   row, the result, commit) and a job in a transaction jobguard begins (`PgStore::begin`:
//!   begin with the key in the same message, one effect row, the result, commit), each beside
//!   the same transaction without jobguard (begin, the effect row, commit).
//!
//! ```text
//! cargo bench -p jobguard-suite --bench postgres
//! ```
//!
//! A timed harness: the contenders run in interleaved rounds (`ROUNDS`), each round a fixed
//! number of jobs spread over the tasks, and the table gives each contender's median round in
//! jobs per second, and the ratio to its peer. `JOBGUARD_BENCH_QUICK=1` runs a tenth of the jobs.

use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::postgres;

use jobguard::store::postgres::PgStore;
use jobguard::{Store, StoreKey};
use postgres::PgServer;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(3600);
/// What `#[idempotent]` stores for a small `Ok` value.
const RECORD: &[u8] = br#"{"v":1,"ok":{"order_id":"order-123456","attempts_used":1}}"#;
const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const ROUNDS: usize = 5;

static NEXT: AtomicU64 = AtomicU64::new(0);

fn next_key() -> String {
    format!("job-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn store_job(store: PgStore) {
    let key = next_key();
    let key = StoreKey {
        scope: "bench.store",
        key: &key,
    };
    assert_eq!(
        store.claim_plain(key, TOKEN, None, LEASE).await,
        Ok(Claim::Acquired)
    );
    store.complete(key, TOKEN, RECORD, TTL).await.unwrap();
}

async fn bare_job(pool: PgPool) {
    let key = next_key();
    let inserted = sqlx::query(
        "INSERT INTO jobguard_keys (scope, key, token, fingerprint, result, expires_at) \
         VALUES ('bench.bare', $1, $2, NULL, NULL, now() + interval '30 seconds') \
         ON CONFLICT (scope, key) DO NOTHING",
    )
    .bind(&key)
    .bind(TOKEN)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(inserted.rows_affected(), 1);
    sqlx::query(
        "UPDATE jobguard_keys SET token = NULL, result = $3, expires_at = now() + interval '1 hour' \
         WHERE scope = 'bench.bare' AND key = $1 AND token = $2",
    )
    .bind(&key)
    .bind(TOKEN)
    .bind(RECORD)
    .execute(&pool)
    .await
    .unwrap();
}

async fn effect(conn: &mut sqlx::PgConnection, key: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO bench_effects (key) VALUES ($1) RETURNING id")
        .bind(key)
        .fetch_one(conn)
        .await
}

async fn in_transaction_job(pool: PgPool) {
    let key = next_key();
    let mut tx = pool.begin().await.unwrap();
    let _: i64 = PgStore::in_transaction(&mut tx, "bench.tx", &key)
        .run(async |tx| {
            effect(tx, &key)
                .await
                .map_err(|e| jobguard::Error::Store(e.to_string()))
        })
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn begin_job(pool: PgPool) {
    let key = next_key();
    let mut conn = pool.acquire().await.unwrap();
    let _: i64 = PgStore::begin(&mut conn, "bench.begin", &key)
        .run(async |tx| {
            effect(tx, &key)
                .await
                .map_err(|e| jobguard::Error::Store(e.to_string()))
        })
        .await
        .unwrap();
}

async fn plain_transaction_job(pool: PgPool) {
    let key = next_key();
    let mut tx = pool.begin().await.unwrap();
    effect(&mut tx, &key).await.unwrap();
    tx.commit().await.unwrap();
}

/// Runs `jobs` jobs from `tasks` tasks; the wall time.
async fn round<F, Fut>(tasks: usize, jobs: usize, job: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let job = job.clone();
            let mine = jobs / tasks + usize::from(t < jobs % tasks);
            tokio::spawn(async move {
                for _ in 0..mine {
                    job().await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    start.elapsed()
}

fn median(mut rounds: Vec<Duration>) -> Duration {
    rounds.sort();
    rounds[rounds.len() / 2]
}

fn main() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let quick = std::env::var("JOBGUARD_BENCH_QUICK").is_ok_and(|v| v == "1");
    let scale = if quick { 10 } else { 1 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&server.url())
            .await
            .unwrap();
        let store = PgStore::new(pool.clone());
        store.migrate().await.unwrap();
        sqlx::raw_sql("CREATE TABLE bench_effects (id bigserial PRIMARY KEY, key text NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let mut table = Vec::new();
        for tasks in [1usize, 16] {
            let jobs = if tasks == 1 { 2_000 } else { 10_000 } / scale;
            let (mut guarded, mut bare, mut in_tx, mut plain) = (vec![], vec![], vec![], vec![]);
            let mut begun = vec![];
            for _ in 0..ROUNDS {
                let s = store.clone();
                guarded.push(round(tasks, jobs, move || store_job(s.clone())).await);
                let p = pool.clone();
                bare.push(round(tasks, jobs, move || bare_job(p.clone())).await);
                let p = pool.clone();
                in_tx.push(round(tasks, jobs, move || in_transaction_job(p.clone())).await);
                let p = pool.clone();
                begun.push(round(tasks, jobs, move || begin_job(p.clone())).await);
                let p = pool.clone();
                plain.push(round(tasks, jobs, move || plain_transaction_job(p.clone())).await);
            }
            let rate = |d: Duration| jobs as f64 / d.as_secs_f64();
            let (g, b) = (rate(median(guarded)), rate(median(bare)));
            let (t, p) = (rate(median(in_tx)), rate(median(plain)));
            let o = rate(median(begun));
            table.push(format!(
                "| `PgStore` claim + complete | {tasks} | {g:.0} | bare INSERT ON CONFLICT + UPDATE: {b:.0} | {:.0}% |",
                100.0 * g / b
            ));
            table.push(format!(
                "| in the caller's transaction (1 effect row) | {tasks} | {t:.0} | same transaction without jobguard: {p:.0} | {:.0}% |",
                100.0 * t / p
            ));
            table.push(format!(
                "| `PgStore::begin`, the claim in the BEGIN (1 effect row) | {tasks} | {o:.0} | same transaction without jobguard: {p:.0} | {:.0}% |",
                100.0 * o / p
            ));
        }
        println!("| contender | tasks | jobs/s | peer jobs/s | ratio |");
        println!("|---|---|---|---|---|");
        for line in table {
            println!("{line}");
        }
    });
}
