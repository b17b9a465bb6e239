//! `MemoryStore` through the store conformance suite (`jobguard::testing::check_store`): the
//! same checks as a single `redis-server`, a Redis Cluster and `PgStore`, on the real clock. The
//! memory store cannot show a server's view (`PTTL`, `KEYS`), so those parts are skipped.

use jobguard::MemoryStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_conformance_suite_passes_in_memory() {
    jobguard::testing::check_store(|| async { MemoryStore::new() }).await;
}
