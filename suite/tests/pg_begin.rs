//! `PgStore::begin`, the key claimed in the `BEGIN`'s round trip of a transaction jobguard
//! begins and commits, against a private `postgres`: a run, its replay, a failing body and a
//! body's own unique violation, the `Store` form's claims, the attribute on a connection outside
//! a transaction (with `#[retry]`), hostile scopes and keys, a concurrent duplicate waiting on the
//! key's row, 200 keys raced by 8 deliveries each, a worker killed before its commit, and the
//! round trips each transactional form sends, counted by a proxy between the client and the
//! server.

use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::pg_job::{JobError, effects, pool};
use jobguard_testkit::postgres;

use jobguard::StoreKey;
use jobguard::store::postgres::PgStore;
use postgres::PgServer;
use sqlx::postgres::PgPool;
use sqlx::{Connection, PgConnection};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SCOPE: &str = "tests.begin";

/// The attribute on a connection: called with one outside a transaction, jobguard begins the
/// transaction with the claim and commits it.
#[jobguard::idempotent(key = order, transaction = conn, scope = "tests.begin")]
async fn attributed(conn: &mut PgConnection, order: &str) -> Result<i64, JobError> {
    effect(conn, order, "attribute").await
}

static FLAKY: AtomicU32 = AtomicU32::new(0);

/// The same with `#[retry]`: the first attempt's effect is rolled back to its savepoint.
#[jobguard::idempotent(key = order, transaction = conn, scope = "tests.begin")]
#[jobguard::retry(attempts = 3, base = "1ms", cap = "2ms")]
async fn attributed_flaky(conn: &mut PgConnection, order: &str) -> Result<i64, JobError> {
    let id = effect(conn, order, "flaky").await?;
    if FLAKY.fetch_add(1, Ordering::Relaxed) == 0 {
        return Err(JobError::Guard(jobguard::Error::Store("flaky".into())));
    }
    Ok(id)
}

async fn setup(server: &PgServer) -> (PgStore, PgPool) {
    let pool = pool(&server.url(), 16).await;
    let store = PgStore::new(pool.clone());
    store.migrate().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS effects (id bigserial PRIMARY KEY, key text NOT NULL, \
         worker text NOT NULL); \
         CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)",
    )
    .execute(&pool)
    .await
    .unwrap();
    (store, pool)
}

/// The effect row's statement: the body every delivery runs.
async fn effect(conn: &mut PgConnection, key: &str, worker: &str) -> Result<i64, JobError> {
    Ok(
        sqlx::query_scalar("INSERT INTO effects (key, worker) VALUES ($1, $2) RETURNING id")
            .bind(key)
            .bind(worker)
            .fetch_one(conn)
            .await?,
    )
}

/// One delivery through `PgStore::begin`: the effect row and the key, committed together.
async fn deliver(pool: &PgPool, key: &str, worker: &str) -> Result<i64, JobError> {
    let mut conn = pool.acquire().await?;
    PgStore::begin(&mut conn, SCOPE, key)
        .run(async |tx| effect(tx, key, worker).await)
        .await
}

async fn key_row(pool: &PgPool, key: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM jobguard_keys WHERE scope = $1 AND key = $2)")
        .bind(SCOPE)
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_run_commits_and_replays_and_a_failing_body_leaves_nothing() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (store, pool) = setup(&server).await;
    let ran = AtomicU32::new(0);
    let mut conn = pool.acquire().await.unwrap();
    let mut run = async |key: &str| {
        PgStore::begin(&mut conn, SCOPE, key)
            .run(async |tx| {
                ran.fetch_add(1, Ordering::Relaxed);
                effect(tx, key, "a").await
            })
            .await
    };
    let first = run("k1").await.unwrap();
    let again = run("k1").await.unwrap();
    assert_eq!(first, again, "replayed");
    assert_eq!(
        ran.load(Ordering::Relaxed),
        1,
        "the replay did not run the body"
    );
    assert_eq!(effects(&pool, "k1").await, 1);
    // Committed by jobguard: the record is the Store form's too.
    let k1 = StoreKey {
        scope: SCOPE,
        key: "k1",
    };
    assert_eq!(
        store
            .claim_plain(k1, "t", None, Duration::from_secs(5))
            .await,
        Ok(Claim::Completed(
            format!("{{\"v\":1,\"ok\":{first}}}").into_bytes()
        ))
    );

    // A failing body: rolled back, the key with it; a later delivery runs.
    let failed: Result<i64, JobError> = PgStore::begin(&mut conn, SCOPE, "k2")
        .run(async |tx| {
            effect(tx, "k2", "b").await?;
            Err(JobError::Guard(jobguard::Error::Timeout))
        })
        .await;
    assert!(matches!(
        failed,
        Err(JobError::Guard(jobguard::Error::Timeout))
    ));
    assert_eq!(
        (effects(&pool, "k2").await, key_row(&pool, "k2").await),
        (0, false)
    );
    assert!(deliver(&pool, "k2", "c").await.is_ok());
    assert_eq!(effects(&pool, "k2").await, 1);

    // The body's own unique violation is the body's error, not the key's conflict.
    sqlx::query("INSERT INTO orders VALUES ('o-1')")
        .execute(&pool)
        .await
        .unwrap();
    let own: Result<(), JobError> = PgStore::begin(&mut conn, SCOPE, "k3")
        .run(async |tx| {
            sqlx::query("INSERT INTO orders VALUES ('o-1')")
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
        .await;
    assert!(
        matches!(&own, Err(JobError::Db(sqlx::Error::Database(db))) if db.constraint() == Some("orders_pkey")),
        "{own:?}"
    );
    assert!(!key_row(&pool, "k3").await);
    let ok = PgStore::begin(&mut conn, SCOPE, "k3")
        .run(async |_| Ok::<_, JobError>(3))
        .await
        .unwrap();
    assert_eq!(ok, 3);
}

#[tokio::test]
async fn the_attribute_on_a_connection_outside_a_transaction_commits_its_own() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (_store, pool) = setup(&server).await;
    let mut conn = pool.acquire().await.unwrap();
    let first = attributed(&mut conn, "attr").await.unwrap();
    assert!(!conn.is_in_transaction());
    assert_eq!(attributed(&mut conn, "attr").await.unwrap(), first);
    assert_eq!(effects(&pool, "attr").await, 1);
    // Inside the caller's transaction, the same function joins it; a rollback takes it back.
    let mut tx = conn.begin().await.unwrap();
    attributed(&mut tx, "attr-tx").await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        (
            effects(&pool, "attr-tx").await,
            key_row(&pool, "attr-tx").await
        ),
        (0, false)
    );

    let flaky = attributed_flaky(&mut conn, "flaky").await.unwrap();
    assert_eq!(FLAKY.load(Ordering::Relaxed), 2);
    assert_eq!(attributed_flaky(&mut conn, "flaky").await.unwrap(), flaky);
    assert_eq!(
        effects(&pool, "flaky").await,
        1,
        "the failed attempt's row rolled back"
    );
}

#[tokio::test]
async fn store_claims_fingerprints_and_a_connection_inside_a_transaction() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (store, pool) = setup(&server).await;
    let mut conn = pool.acquire().await.unwrap();
    PgStore::begin(&mut conn, SCOPE, "fp")
        .fingerprint("a".into())
        .run(async |_| Ok::<_, JobError>(5))
        .await
        .unwrap();
    let reused: Result<i32, JobError> = PgStore::begin(&mut conn, SCOPE, "fp")
        .fingerprint("b".into())
        .run(async |_| Ok(6))
        .await;
    assert!(matches!(
        reused,
        Err(JobError::Guard(jobguard::Error::KeyReused))
    ));

    // A live claim of the Store form: in progress, and the body does not run.
    let held = |key| StoreKey { scope: SCOPE, key };
    store
        .claim_plain(held("held"), "t", None, Duration::from_secs(60))
        .await
        .unwrap();
    let ran = AtomicBool::new(false);
    let busy: Result<i32, JobError> = PgStore::begin(&mut conn, SCOPE, "held")
        .run(async |_| {
            ran.store(true, Ordering::Relaxed);
            Ok(1)
        })
        .await;
    assert!(matches!(
        busy,
        Err(JobError::Guard(jobguard::Error::InProgress))
    ));
    assert!(!ran.load(Ordering::Relaxed));
    // An expired one (its lease ended a second ago) is taken over, and the result replaces it.
    sqlx::query(
        "INSERT INTO jobguard_keys (scope, key, token, expires_at) \
         VALUES ($1, 'expired', 't', now() - interval '1 second')",
    )
    .bind(SCOPE)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        PgStore::begin(&mut conn, SCOPE, "expired")
            .run(async |_| Ok::<_, JobError>(7))
            .await
            .unwrap(),
        7
    );
    assert_eq!(
        store
            .claim_plain(held("expired"), "v", None, Duration::from_secs(5))
            .await,
        Ok(Claim::Completed(b"{\"v\":1,\"ok\":7}".to_vec()))
    );

    // Inside a transaction, the caller's form is `in_transaction`.
    let mut tx = conn.begin().await.unwrap();
    let refused: Result<i32, JobError> = PgStore::begin(&mut tx, SCOPE, "inside")
        .run(async |_| Ok(1))
        .await;
    assert!(
        matches!(&refused, Err(JobError::Guard(jobguard::Error::Config(m))) if m.contains("outside a transaction")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn quotes_backslashes_long_keys_and_nul_bytes_are_claimed_as_the_store_form_writes_them() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (store, pool) = setup(&server).await;
    let mut conn = pool.acquire().await.unwrap();
    let long = "k".repeat(10_000);
    let scopes = ["it's \\ \"quoted\"", "with%percent", "nul\0scope"];
    let keys = [
        "'); DROP TABLE effects; --",
        "back\\slash\\'",
        long.as_str(),
        "nul\0key",
        "#hash",
        "café ☕",
    ];
    for scope in scopes {
        for key in keys {
            let stored = PgStore::begin(&mut conn, scope, key)
                .run(async |_| Ok::<_, JobError>(key.len()))
                .await
                .unwrap();
            assert_eq!(stored, key.len());
            // The Store form finds the row under the same (scope, key).
            let claim = store
                .claim_plain(StoreKey { scope, key }, "t", None, Duration::from_secs(5))
                .await;
            assert_eq!(
                claim,
                Ok(Claim::Completed(
                    format!("{{\"v\":1,\"ok\":{}}}", key.len()).into_bytes()
                )),
                "{scope:?} {key:?}"
            );
        }
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobguard_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, (scopes.len() * keys.len()) as i64);
    // A fingerprint with a NUL byte cannot be text: refused, and nothing runs or stays.
    let refused: Result<(), JobError> = PgStore::begin(&mut conn, SCOPE, "fp-nul")
        .fingerprint("a\0b".into())
        .run(async |_| panic!("the body ran"))
        .await;
    assert!(
        matches!(&refused, Err(JobError::Guard(jobguard::Error::Store(_)))),
        "{refused:?}"
    );
    assert!(!key_row(&pool, "fp-nul").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_duplicate_waits_then_replays_or_runs_if_the_first_rolled_back() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (_store, pool) = setup(&server).await;
    for commit in [true, false] {
        let key = if commit { "dup-commit" } else { "dup-rollback" };
        let (inserted, on_inserted) = tokio::sync::oneshot::channel::<i64>();
        let (release, on_release) = tokio::sync::oneshot::channel::<()>();
        // The first delivery's body writes its effect, then waits, its transaction open.
        let first = tokio::spawn({
            let pool = pool.clone();
            async move {
                let mut conn = pool.acquire().await.unwrap();
                PgStore::begin(&mut conn, SCOPE, key)
                    .run(async |tx| {
                        let id = effect(tx, key, "first").await?;
                        inserted.send(id).unwrap();
                        on_release.await.unwrap();
                        if commit {
                            Ok(id)
                        } else {
                            Err(JobError::Guard(jobguard::Error::Timeout))
                        }
                    })
                    .await
            }
        });
        let id = on_inserted.await.unwrap();
        let duplicate = tokio::spawn({
            let pool = pool.clone();
            async move { deliver(&pool, key, "second").await.unwrap() }
        });
        // Until the duplicate is seen waiting on a lock (the key's row), the first stays open.
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(!duplicate.is_finished());
        release.send(()).unwrap();
        let first = first.await.unwrap();
        if commit {
            assert_eq!(first.unwrap(), id);
            assert_eq!(
                duplicate.await.unwrap(),
                id,
                "replayed the committed result"
            );
        } else {
            assert!(first.is_err());
            assert_ne!(duplicate.await.unwrap(), id, "ran itself");
        }
        assert_eq!(effects(&pool, key).await, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_keys_eight_racing_deliveries_one_effect_each() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (_store, setup_pool) = setup(&server).await;
    const KEYS: usize = 200;
    const DELIVERIES: usize = 8;
    let mut pools = Vec::new();
    for _ in 0..4 {
        pools.push(pool(&server.url(), 8).await);
    }
    let mut tasks = Vec::new();
    for d in 0..DELIVERIES {
        for k in 0..KEYS {
            let pool = pools[(k + d) % pools.len()].clone();
            tasks.push(tokio::spawn(async move {
                let id = deliver(&pool, &k.to_string(), &format!("delivery-{d}"))
                    .await
                    .unwrap();
                (k, id)
            }));
        }
    }
    let mut results: HashMap<usize, Vec<i64>> = HashMap::new();
    for task in tasks {
        let (k, id) = task.await.unwrap();
        results.entry(k).or_default().push(id);
    }
    assert_eq!(results.len(), KEYS);
    for (k, ids) in &results {
        assert_eq!(ids.len(), DELIVERIES, "key {k}");
        assert!(ids.iter().all(|id| *id == ids[0]), "key {k}: {ids:?}");
    }
    let per_key: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, count(*) FROM effects GROUP BY key")
            .fetch_all(&setup_pool)
            .await
            .unwrap();
    assert_eq!(per_key.len(), KEYS);
    assert!(per_key.iter().all(|(_, n)| *n == 1), "{per_key:?}");
}

/// A TCP proxy in front of the server that counts round trips: each time the client sends
/// after the server has answered is one. sqlx sends nothing before the previous message's
/// answer has arrived, so this is the number of waits the client makes.
struct Proxy {
    port: u16,
    round_trips: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let round_trips = Arc::new(AtomicU64::new(0));
        let counter = round_trips.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                // Whether the client's next bytes start a new round trip.
                let answered = Arc::new(Mutex::new(true));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let (counter, up) = (counter.clone(), answered.clone());
                tokio::spawn(pipe(client_read, server_write, move || {
                    let mut answered = up.lock().unwrap();
                    if *answered {
                        counter.fetch_add(1, Ordering::SeqCst);
                        *answered = false;
                    }
                }));
                tokio::spawn(pipe(server_read, client_write, move || {
                    *answered.lock().unwrap() = true;
                }));
            }
        });
        Proxy { port, round_trips }
    }

    /// The server's URL through the proxy, without TLS (whose handshake would be counted).
    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    fn count(&self) -> u64 {
        self.round_trips.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to`, calling `seen` for each chunk before forwarding it.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    seen: impl Fn() + Send + 'static,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                seen();
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[tokio::test]
async fn round_trips_beside_the_same_transaction_without_jobguard() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (_store, _pool) = setup(&server).await;
    let proxy = Proxy::start(server.port()).await;
    let mut conn = PgConnection::connect(&proxy.url()).await.unwrap();
    let mut n = 0;
    let mut next_key = move || {
        n += 1;
        format!("rt-{n}")
    };
    // Each form once before counting, so that every statement is prepared on the connection.
    let counted = async |form: &str, conn: &mut PgConnection, key: String| {
        let before = proxy.count();
        match form {
            "bare" => {
                let mut tx = conn.begin().await.unwrap();
                effect(&mut tx, &key, "bare").await.unwrap();
                tx.commit().await.unwrap();
            }
            "begin" => {
                PgStore::begin(conn, SCOPE, &key)
                    .run(async |tx| effect(tx, &key, "begin").await)
                    .await
                    .unwrap();
            }
            "attribute" => {
                attributed(conn, &key).await.unwrap();
            }
            "in_transaction" => {
                let mut tx = conn.begin().await.unwrap();
                PgStore::in_transaction(&mut tx, SCOPE, &key)
                    .run(async |tx| effect(tx, &key, "in_transaction").await)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            _ => unreachable!(),
        }
        proxy.count() - before
    };
    let mut trips = HashMap::new();
    for form in ["bare", "begin", "attribute", "in_transaction"] {
        counted(form, &mut conn, next_key()).await;
        trips.insert(form, counted(form, &mut conn, next_key()).await);
    }
    // The replay of a completed key through `begin`: the failed claim, then the read.
    let key = next_key();
    counted("begin", &mut conn, key.clone()).await;
    counted("begin", &mut conn, key.clone()).await;
    let replay = counted("begin", &mut conn, key).await;
    println!("round trips per job: {trips:?}, a replay through begin: {replay}");
    assert_eq!(
        replay, 3,
        "BEGIN with the claim, failing on the key; the ROLLBACK; the row's read"
    );
    assert_eq!(trips["bare"], 3, "BEGIN, the effect, COMMIT");
    assert_eq!(
        trips["begin"],
        trips["bare"] + 1,
        "BEGIN with the claim, the effect, the result, COMMIT"
    );
    assert_eq!(
        trips["attribute"],
        trips["bare"] + 1,
        "#[idempotent(transaction = conn)] on a connection outside a transaction"
    );
    assert_eq!(
        trips["in_transaction"],
        trips["bare"] + 2,
        "BEGIN, the claim, the effect, the result, COMMIT"
    );
}

const ROLE_ENV: &str = "JOBGUARD_PG_BEGIN_ROLE";
const URL_ENV: &str = "JOBGUARD_PG_BEGIN_URL";
const MARK: &str = "@@";

#[test]
fn a_worker_killed_between_its_effect_and_the_commit_leaves_nothing_and_the_redelivery_runs_once() {
    use std::io::BufRead;
    let Some(server) = PgServer::start() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pool = rt.block_on(async { setup(&server).await.1 });
    let mut child = jobguard_testkit::redis::rerun_test("killed_worker")
        .env(ROLE_ENV, "victim")
        .env(URL_ENV, server.url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the worker");
    let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let said = lines
        .map(|l| l.expect("child stdout"))
        .any(|l| l.trim().ends_with(&format!("{MARK}inserted")));
    assert!(said, "the worker exited before inserting its effect");
    child.kill().expect("SIGKILL the worker");
    child.wait().unwrap();
    rt.block_on(async {
        assert_eq!(effects(&pool, "victim").await, 0, "no effect row");
        assert!(!key_row(&pool, "victim").await, "no key row");
        // The redelivery waits for the dead transaction to be rolled back, then runs.
        let id = deliver(&pool, "victim", "redelivery").await.unwrap();
        assert_eq!(deliver(&pool, "victim", "again").await.unwrap(), id);
        assert_eq!(effects(&pool, "victim").await, 1, "ran once");
    });
}

/// The child role of the kill test: inserts its effect inside the transaction `PgStore::begin`
/// began, says so, and waits forever before the result and the commit.
#[test]
#[ignore = "a child process of a_worker_killed_between_its_effect_and_the_commit_leaves_nothing_and_the_redelivery_runs_once"]
fn killed_worker() {
    use std::io::Write;
    if std::env::var(ROLE_ENV).as_deref() != Ok("victim") {
        return;
    }
    let url = std::env::var(URL_ENV).expect("the parent passes the URL");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let _: i64 = PgStore::begin(&mut conn, SCOPE, "victim")
            .run(async |tx| {
                effect(tx, "victim", "victim").await?;
                println!("{MARK}inserted");
                std::io::stdout().flush().unwrap();
                std::future::pending::<()>().await;
                Ok::<_, JobError>(0)
            })
            .await
            .unwrap();
        unreachable!("killed before the commit");
    });
}

/// A `BEGIN` sent as SQL, which sqlx does not count (`is_in_transaction()` is false): jobguard
/// does not begin (and later commit) inside it. The call is `Error::Config` before the body
/// runs, and the caller's transaction is rolled back, so neither its `ROLLBACK` nor a `COMMIT`
/// it sends anyway commits anything of it.
#[tokio::test]
async fn a_begin_sent_as_sql_is_refused_and_nothing_of_its_transaction_commits() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (_store, pool) = setup(&server).await;
    for (key, attribute, end) in [
        ("raw.begin", false, "ROLLBACK"),
        ("raw.attribute", true, "ROLLBACK"),
        ("raw.commit", false, "COMMIT"),
    ] {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
        sqlx::query("INSERT INTO orders (id) VALUES ($1)")
            .bind(key)
            .execute(&mut *conn)
            .await
            .unwrap();
        assert!(!conn.is_in_transaction(), "sqlx does not count it");
        let out = if attribute {
            attributed(&mut conn, key).await
        } else {
            PgStore::begin(&mut conn, SCOPE, key)
                .run(async |tx| effect(tx, key, "raw").await)
                .await
        };
        match &out {
            Err(JobError::Guard(jobguard::Error::Config(why))) => {
                assert!(why.contains("PgStore::in_transaction"), "{why}");
            }
            other => panic!("{key}: {other:?}"),
        }
        sqlx::raw_sql(end).execute(&mut *conn).await.unwrap();
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = $1")
            .bind(key)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(orders, 0, "{key}: the caller's own write was committed");
        assert_eq!(effects(&pool, key).await, 0, "{key}: the body ran");
        assert!(!key_row(&pool, key).await, "{key}: the key was committed");
        // The connection is usable again, outside any transaction.
        assert_eq!(
            deliver(&pool, key, "after").await.map(|_| ()).ok(),
            Some(())
        );
        assert_eq!(effects(&pool, key).await, 1);
    }
}
