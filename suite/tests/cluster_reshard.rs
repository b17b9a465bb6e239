//! A slot migration under a running `RedisStore`: `redis-cli --cluster reshard` moves the slots
//! that hold the test's keys from one master to another while workers claim, complete and
//! replay those keys. The connection follows `ASK` (a key already moved out of a migrating slot)
//! and `MOVED` (a slot whose move is done) on its own: no call fails, every body runs once, and
//! every completed record is found on the new master.
//!
//! Real clock. The workers run until the resharding returns; nothing sleeps.

use jobguard_testkit::cluster;

use cluster::{RedisCluster, Reply, key_slot, query};
use jobguard::{Error, RedisStore, StoreKey};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The slots moved: the lowest `MOVED_SLOTS` of the source master, which `reshard` takes first.
const MOVED_SLOTS: u16 = 48;
const ORDERS: usize = 200;
/// Other keys written in each slot that moves.
const BALLAST_PER_SLOT: u32 = 16;
const WORKERS: usize = 8;
const SCOPE: &str = "tests.cluster_reshard.charge";

struct Ledger {
    /// The order ids, all hashing to the slots that move.
    ids: Vec<String>,
    runs: Vec<AtomicU32>,
}

#[jobguard::idempotent(store = *store, key = ledger.ids[order], scope = "tests.cluster_reshard.charge", in_progress = wait("30s"))]
async fn charge(store: &RedisStore, ledger: &Ledger, order: usize) -> Result<String, Error> {
    ledger.runs[order].fetch_add(1, Ordering::SeqCst);
    Ok(format!("receipt {}", ledger.ids[order]))
}

fn redis_key(id: &str) -> String {
    RedisStore::redis_key(StoreKey {
        scope: SCOPE,
        key: id,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resharding_under_running_calls_is_followed_transparently() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
    let source = cluster.master_of(0);
    let target = cluster
        .masters()
        .into_iter()
        .find(|m| m.id != source.id)
        .unwrap();
    let lowest = source.slots.iter().map(|&(a, _)| a).min().unwrap();
    let moving = lowest..lowest + MOVED_SLOTS;
    // Order ids whose keys hash into the slots that move.
    let ids: Vec<String> = (0..)
        .map(|i| format!("order-{i}"))
        .filter(|id| moving.contains(&key_slot(redis_key(id).as_bytes())))
        .take(ORDERS)
        .collect();
    let ledger = Arc::new(Ledger {
        runs: (0..ORDERS).map(|_| AtomicU32::new(0)).collect(),
        ids,
    });

    // Other keys in the same slots, so that each slot takes a while to migrate key by key,
    // and calls meet slots mid-migration.
    let mut connection = store.connection();
    let mut per_slot = vec![0u32; MOVED_SLOTS as usize];
    for i in 0.. {
        if per_slot.iter().all(|&n| n >= BALLAST_PER_SLOT) {
            break;
        }
        let key = format!("ballast-{i}");
        let slot = key_slot(key.as_bytes());
        if moving.contains(&slot) && per_slot[(slot - lowest) as usize] < BALLAST_PER_SLOT {
            per_slot[(slot - lowest) as usize] += 1;
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg("x")
                .query_async(&mut connection)
                .await
                .unwrap();
        }
    }

    // Half the orders are completed before the move, so there are records to migrate.
    for order in 0..ORDERS / 2 {
        charge(&store, &ledger, order).await.unwrap();
    }

    // Count the redirections from here on (`INFO errorstats`).
    for port in cluster.ports() {
        assert_eq!(
            query(port, &["CONFIG", "RESETSTAT"]).unwrap(),
            Reply::Status("OK".into())
        );
    }
    let done = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (store, ledger, done) = (store.clone(), ledger.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut calls = 0u32;
            let mut order = w;
            // Round and round over every order (the first half replay, the second half run
            // once and then replay) until the resharding is over, then once more round.
            let mut rounds_after = 0;
            while rounds_after < 1 {
                let receipt = charge(&store, &ledger, order)
                    .await
                    .unwrap_or_else(|e| panic!("order {order} during the resharding: {e}"));
                assert_eq!(receipt, format!("receipt {}", ledger.ids[order]));
                calls += 1;
                order += WORKERS;
                if order >= ORDERS {
                    order = w;
                    if done.load(Ordering::SeqCst) {
                        rounds_after += 1;
                    }
                }
            }
            calls
        }));
    }
    let (source_id, target_id) = (source.id.clone(), target.id.clone());
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.reshard(&source_id, &target_id, MOVED_SLOTS);
        cluster
    })
    .await
    .unwrap();
    done.store(true, Ordering::SeqCst);
    let mut calls = 0;
    for w in workers {
        calls += w.await.unwrap();
    }
    let redirections = |kind: &str| -> u64 {
        let prefix = format!("errorstat_{kind}:count=");
        cluster
            .ports()
            .into_iter()
            .filter_map(|port| match query(port, &["INFO", "errorstats"]) {
                Ok(Reply::Bulk(text)) => text.lines().find_map(|l| {
                    l.strip_prefix(&prefix)?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                }),
                _ => None,
            })
            .sum()
    };
    let (moved, ask) = (redirections("MOVED"), redirections("ASK"));
    println!("{calls} calls across the resharding; {moved} MOVED and {ask} ASK followed");
    // The client's slot map was stale after the move: it was sent elsewhere, and followed.
    assert!(moved > 0);
    // And calls met keys already moved out of a slot still migrating.
    assert!(ask > 0, "no call met a slot mid-migration");

    // The slots moved, with their records.
    for slot in moving.clone() {
        assert_eq!(cluster.master_of(slot).id, target.id, "slot {slot}");
    }
    let mut slots_with_keys = BTreeSet::new();
    for id in &ledger.ids {
        let key = redis_key(id);
        slots_with_keys.insert(key_slot(key.as_bytes()));
        assert_eq!(
            query(target.port, &["EXISTS", &key]).unwrap(),
            Reply::Int(1),
            "{key}"
        );
    }
    assert!(
        slots_with_keys.len() > MOVED_SLOTS as usize / 2,
        "{slots_with_keys:?}"
    );
    // Every body ran once, and replays go on after the move.
    for (order, runs) in ledger.runs.iter().enumerate() {
        assert_eq!(runs.load(Ordering::SeqCst), 1, "order {order}");
    }
    for order in 0..ORDERS {
        charge(&store, &ledger, order).await.unwrap();
    }
    assert!(ledger.runs.iter().all(|r| r.load(Ordering::SeqCst) == 1));
}
