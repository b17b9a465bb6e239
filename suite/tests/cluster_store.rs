//! `RedisStore` and `RedisDeadLetters` on a private Redis Cluster (3 masters, 3 replicas;
//! `jobguard_testkit::cluster`): the store conformance suite, including 200 keys × 8 racing
//! claims and 8 racing `#[idempotent]` deliveries of 200 keys (each effect once); corrupt
//! records; keys spread over every master; bad seed nodes; dead letters in a stream on one slot.
//!
//! Real clock: leases live in the servers. Waits poll with a deadline.

use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::cluster;
use jobguard_testkit::conformance;

use cluster::{NodeInfo, Options, RedisCluster, Reply, SLOTS, crc16, key_slot, query};
use conformance::RedisBackend;
use jobguard::{DeadLetter, Error, GiveUp, RedisDeadLetters, RedisStore, Store, StoreKey};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[test]
fn the_test_kit_computes_slots_as_the_cluster_specification_does() {
    // The specification's example: CRC16("123456789") is 0x31C3.
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(key_slot(b"foo"), 12182);
    assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
    assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
    assert_eq!(key_slot(b"{}x"), crc16(b"{}x") % SLOTS);
}

async fn connect(cluster: &RedisCluster) -> RedisStore {
    let store = RedisStore::connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster");
    assert!(store.is_cluster());
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_conformance_suite_passes_on_a_cluster() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let store = connect(&cluster).await;
    let backend = RedisBackend {
        guard: Arc::new(cluster),
        store,
    };
    jobguard::testing::check_backend(|| async {
        backend.clear().await;
        RedisBackend {
            guard: backend.guard.clone(),
            store: backend.store.clone(),
        }
    })
    .await;
    backend.clear().await;
    conformance::a_record_that_cannot_be_decoded_is_corrupt_and_never_a_panic(&backend.store).await;
    backend.clear().await;
    conformance::records_of_the_first_layout_are_read(&backend.store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_spread_over_every_master_and_each_lives_on_the_master_of_its_slot() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    // Any one seed node is enough: the others are found from it.
    let store = RedisStore::connect_cluster([&cluster.urls()[3]])
        .await
        .expect("connect through one seed");
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    for i in 0..300 {
        let key = format!("order-{i}");
        let k = StoreKey {
            scope: "tests.cluster.spread",
            key: &key,
        };
        assert_eq!(
            store
                .claim_plain(k, "t", None, Duration::from_secs(60))
                .await,
            Ok(Claim::Acquired)
        );
        let redis_key = RedisStore::redis_key(k);
        let owner = cluster.master_of(key_slot(redis_key.as_bytes()));
        // The record is on that master, and the others send a client there.
        for m in &masters {
            let exists = query(m.port, &["EXISTS", &redis_key]).unwrap();
            assert_eq!(
                exists,
                on(&owner, &redis_key, m.port),
                "{redis_key} on {}",
                m.port
            );
        }
        *per_master.entry(owner.port).or_default() += 1;
    }
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    assert!(per_master.values().all(|&n| n >= 50), "{per_master:?}");
}

/// What `EXISTS key` answers on the master at `port` when `owner` holds `key`: `1` there, and
/// a redirection to `owner` elsewhere.
fn on(owner: &NodeInfo, key: &str, port: u16) -> Reply {
    if port == owner.port {
        Reply::Int(1)
    } else {
        let slot = key_slot(key.as_bytes());
        Reply::Error(format!("MOVED {slot} 127.0.0.1:{}", owner.port))
    }
}

#[tokio::test]
async fn bad_seed_nodes_are_a_store_error() {
    let none: [&str; 0] = [];
    let empty = RedisStore::connect_cluster(none).await;
    assert!(matches!(empty, Err(Error::Store(_))), "{empty:?}");
    let bad = RedisStore::connect_cluster(["not a url"]).await;
    assert!(matches!(bad, Err(Error::Store(_))), "{bad:?}");
    // A port that nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = RedisStore::connect_cluster(vec![format!("redis://127.0.0.1:{port}/")]).await;
    assert!(matches!(down, Err(Error::Store(_))), "{down:?}");
    let letters = RedisDeadLetters::connect_cluster(none, "s").await;
    assert!(matches!(letters, Err(Error::Store(_))), "{letters:?}");
}

fn letter(n: u32) -> DeadLetter {
    let now = SystemTime::now();
    DeadLetter::new(
        "tests::job",
        Some(format!("idem-{n}")),
        GiveUp::Exhausted,
        3,
        format!("e{n}"),
        now,
        now,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_live_in_one_stream_on_the_master_of_its_slot() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let stream = "jobguard:dead_letters:cluster";
    let letters = RedisDeadLetters::connect_cluster(&cluster.urls(), stream)
        .await
        .expect("connect");
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(letters.add(&letter(n)).await.unwrap());
    }
    let listed = letters.list().await.unwrap();
    assert_eq!(listed.len(), 5);
    for (n, ((id, got), added)) in listed.iter().zip(&ids).enumerate() {
        assert_eq!(id, added);
        let got = got.as_ref().unwrap();
        assert_eq!(got.error, format!("e{n}"));
        assert_eq!(got.key, Some(format!("idem-{n}")));
    }
    assert_eq!(
        letters.get(&ids[2]).await.unwrap().map(|l| l.error),
        Some("e2".into())
    );
    assert!(letters.remove(&ids[0]).await.unwrap());
    assert_eq!(letters.len().await.unwrap(), 4);
    let redriven = letters
        .redrive(&ids[1], |l| async move { Ok::<_, Error>(l.key) })
        .await
        .unwrap();
    assert!(redriven);
    assert_eq!(letters.len().await.unwrap(), 3);

    // The whole stream is one key on one master.
    let owner = cluster.master_of(key_slot(stream.as_bytes()));
    for m in cluster.masters() {
        let exists = query(m.port, &["EXISTS", stream]).unwrap();
        assert_eq!(exists, on(&owner, stream, m.port), "{}", m.port);
    }

    // Sharing the store's cluster connection works the same.
    let store = connect(&cluster).await;
    let shared = RedisDeadLetters::new(store.connection(), stream);
    assert_eq!(shared.len().await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_password_is_reached_through_urls_that_carry_it() {
    let Some(cluster) = RedisCluster::start_with(Options {
        password: Some("s3cret".into()),
        ..Options::default()
    }) else {
        return;
    };
    let urls = cluster.urls();
    assert!(urls[0].starts_with("redis://:s3cret@"), "{urls:?}");
    let store = RedisStore::connect_cluster(&urls)
        .await
        .expect("connect with the password");
    let k = StoreKey {
        scope: "tests.cluster.auth",
        key: "k",
    };
    assert_eq!(
        store
            .claim_plain(k, "t", None, Duration::from_secs(60))
            .await,
        Ok(Claim::Acquired)
    );
    store
        .complete(k, "t", b"r", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_plain(k, "u", None, Duration::from_secs(60))
            .await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
    let letters = RedisDeadLetters::connect_cluster(&urls, "jobguard:dead_letters")
        .await
        .expect("dead letters with the password");
    letters.add(&letter(1)).await.unwrap();
    assert_eq!(letters.len().await.unwrap(), 1);

    // Without the password, or with a wrong one, no connection: a store error.
    let bare: Vec<String> = urls.iter().map(|u| u.replace(":s3cret@", "")).collect();
    let refused = RedisStore::connect_cluster(&bare).await;
    assert!(matches!(refused, Err(Error::Store(_))), "{refused:?}");
    let wrong: Vec<String> = urls.iter().map(|u| u.replace("s3cret", "wrong")).collect();
    let refused = RedisStore::connect_cluster(&wrong).await;
    assert!(matches!(refused, Err(Error::Store(_))), "{refused:?}");
}
