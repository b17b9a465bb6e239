//! `examples/ledger.rs`, in memory and against a private `postgres`: every transfer delivered
//! twice, the second delivery a replay, the balances moved once.

#[path = "../../examples/ledger.rs"]
#[allow(dead_code)]
mod ledger;
use jobguard_testkit::postgres;

use postgres::PgServer;
use std::collections::BTreeMap;

fn moved_once() -> BTreeMap<String, i64> {
    [("alice", 50), ("bob", 40), ("carol", 10)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn assert_replayed(receipts: &[ledger::Receipt]) {
    assert_eq!(receipts.len(), 6);
    for pair in receipts.chunks(2) {
        assert_eq!(pair[0], pair[1]);
    }
}

#[tokio::test]
async fn in_memory_every_transfer_moves_once() {
    let (balances, receipts) = ledger::run(None).await.unwrap();
    assert_eq!(balances, moved_once());
    assert_replayed(&receipts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_every_transfer_moves_once_and_a_second_run_replays_them_all() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let (balances, receipts) = ledger::run(Some(&server.url())).await.unwrap();
    assert_eq!(balances, moved_once());
    assert_replayed(&receipts);
    let (again, replayed) = ledger::run(Some(&server.url())).await.unwrap();
    assert_eq!(again, moved_once());
    assert_eq!(replayed, receipts);
}
