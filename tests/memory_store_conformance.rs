//! `MemoryStore` through the store conformance suite (`jobguard_testkit::conformance`): the same
//! checks as a single `redis-server` and a Redis Cluster, on the real clock. The memory store
//! cannot show a server's view (`PTTL`, `KEYS`), so those parts are skipped.

use jobguard_testkit::conformance;
use jobguard_testkit::store_conformance;

use conformance::Backend;
use jobguard::{MemoryStore, StoreKey};

/// A fresh `MemoryStore`.
struct Memory(MemoryStore);

impl Backend for Memory {
    type Store = MemoryStore;

    fn store(&self) -> MemoryStore {
        self.0.clone()
    }

    async fn pttl(&self, _: StoreKey<'_>) -> Option<i64> {
        None
    }

    async fn keys(&self) -> Option<Vec<String>> {
        None
    }

    async fn clear(&self) {}
}

async fn memory() -> Option<Memory> {
    Some(Memory(MemoryStore::new()))
}

store_conformance!(memory());
