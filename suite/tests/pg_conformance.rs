//! `PgStore` through the store conformance suite (`jobguard::testing::check_backend`): the same
//! checks as `MemoryStore`, a single `redis-server` and a Redis Cluster, on one private
//! `postgres` (each check starts from an empty table). The time left on a record is read from
//! its `expires_at`; the key listing is Redis's naming and is skipped here.

use jobguard::store::postgres::PgStore;
use jobguard::testing::Backend;
use jobguard::{Store as _, StoreKey};
use jobguard_testkit::postgres::PgServer;
use sqlx::Row;
use std::sync::Arc;

/// A `PgStore` on a private server, kept up for as long as the backend lives.
struct Postgres {
    _server: Arc<PgServer>,
    store: PgStore,
}

impl Backend for Postgres {
    type Store = PgStore;

    fn store(&self) -> PgStore {
        self.store.clone()
    }

    async fn pttl(&self, key: StoreKey<'_>) -> Option<i64> {
        let (scope, key) = PgStore::row_key(key);
        let left: Option<i64> = sqlx::query(
            "SELECT floor(extract(epoch FROM expires_at - now()) * 1000)::bigint \
             FROM jobguard_keys WHERE scope = $1 AND key = $2",
        )
        .bind(&*scope)
        .bind(&*key)
        .fetch_optional(self.store.pool())
        .await
        .expect("read the row")
        .map(|row| row.get(0));
        // A lapsed row is as good as absent, as Redis would have dropped it.
        Some(left.filter(|ms| *ms > 0).unwrap_or(-2))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_conformance_suite_passes_on_postgres() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = PgStore::connect(&server.url()).await.expect("connect");
    store.migrate().await.expect("migrate");
    // The store answers before the suite starts.
    let probe = StoreKey {
        scope: "tests.conformance",
        key: "probe",
    };
    store
        .release(probe, "nobody")
        .await
        .expect("a release of a free key is a no-op");
    let server = Arc::new(server);
    jobguard::testing::check_backend(|| async {
        sqlx::query("TRUNCATE jobguard_keys, jobguard_steps")
            .execute(store.pool())
            .await
            .expect("truncate");
        Postgres {
            _server: server.clone(),
            store: store.clone(),
        }
    })
    .await;
}
