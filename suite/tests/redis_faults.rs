//! `RedisStore` when things break: the server stopped mid-run (every call fails closed with
//! `Error::Store`; restarted on the same port, the same store recovers), and a worker killed with
//! SIGKILL while it holds a key (the key stays in progress while its lease runs, and is free
//! after one lease, not before).
//!
//! Real clock: the lease lives in the server. Waits poll the server with a deadline.

use jobguard::store::redis::RedisStore;
use jobguard::testing::{Claim, PlainClaim};
use jobguard::{Error, Store, StoreKey};
use jobguard_testkit::redis::{RedisServer, rerun_test};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);
const MARK: &str = "jobguard-child:";
const ROLE_ENV: &str = "JOBGUARD_TEST_ROLE";
const URL_ENV: &str = "JOBGUARD_TEST_REDIS_URL";

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "tests.redis_faults",
        key,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_fails_every_call_closed_and_a_restarted_one_is_used_again() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(
        store.claim_plain(key("before"), "t", None, LONG).await,
        Ok(Claim::Acquired)
    );

    server.stop();
    for i in 0..20 {
        let k = format!("down-{i}");
        let started = Instant::now();
        let got = store.claim_plain(key(&k), "t", None, LONG).await;
        assert!(matches!(got, Err(Error::Store(_))), "claim {i}: {got:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "claim {i} took {:?} to fail",
            started.elapsed()
        );
    }
    let before = key("before");
    assert!(matches!(
        store.complete(before, "t", b"r", DAY).await,
        Err(Error::Store(_))
    ));
    assert!(matches!(
        store.renew(before, "t", LONG).await,
        Err(Error::Store(_))
    ));
    assert!(matches!(
        store.release(before, "t").await,
        Err(Error::Store(_))
    ));

    server.restart();
    // The connection manager reconnects in the background: the same store works again.
    let deadline = Instant::now() + Duration::from_secs(15);
    let k = key("after");
    loop {
        match store.claim_plain(k, "t", None, LONG).await {
            Ok(Claim::Acquired) => break,
            Err(Error::Store(e)) => {
                assert!(Instant::now() < deadline, "no recovery within 15s: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{other:?}"),
        }
    }
    store.complete(k, "t", b"r", DAY).await.unwrap();
    assert_eq!(
        store.claim_plain(k, "u", None, LONG).await,
        Ok(Claim::Completed(b"r".to_vec()))
    );
}

/// The lease the SIGKILLed worker holds its key with.
const KILLED_LEASE: Duration = Duration::from_secs(1);
/// How often it renews.
const BEAT: Duration = Duration::from_millis(200);
/// How many renewals the parent waits for before the kill: beyond one lease, so the key is held
/// by the renewals, not the claim.
const BEATS_BEFORE_KILL: u32 = 7;

#[tokio::test]
async fn a_sigkilled_worker_blocks_its_key_for_one_lease_and_not_before() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let k = key("killed");
    let mut child = rerun_test("sigkilled_holder")
        .env(ROLE_ENV, "holder")
        .env(URL_ENV, server.url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut claimed_at = None;
    let wanted = format!("renewed {BEATS_BEFORE_KILL}");
    for line in lines.by_ref() {
        let line = line.unwrap();
        let Some(at) = line.find(MARK) else { continue };
        let said = line[at + MARK.len()..].trim();
        if said == "claimed" {
            claimed_at = Some(Instant::now());
        }
        if said == wanted {
            break;
        }
    }
    let claimed_at = claimed_at.expect("the child never claimed the key");
    // The renewals, not the claim, hold the key now.
    assert!(claimed_at.elapsed() > KILLED_LEASE);

    child.kill().unwrap(); // SIGKILL: no release, no cleanup
    child.wait().unwrap();
    let killed_at = Instant::now();

    // Still held: the lease set by the last renewal runs on. (The key itself is kept for the
    // claim's TTL, so that the lapsed claim is found and counted: the lease's end is in the
    // record, and a claim reports the time left on it, on the server's clock.)
    let measured_at = Instant::now();
    let Ok(Claim::InProgress { retry_in: left }) =
        store.claim_plain(k, "successor", None, LONG).await
    else {
        panic!("the killed worker's key must still be in progress");
    };
    assert!(
        left > Duration::ZERO && left <= KILLED_LEASE,
        "{left:?} left on the lease after the kill"
    );
    let Ok(Claim::InProgress { retry_in }) = store.claim_plain(k, "successor", None, LONG).await
    else {
        panic!("the killed worker's key must still be in progress");
    };
    assert!(retry_in <= left, "{retry_in:?} > {left:?}");

    // Free once the lease runs out, and not before.
    let deadline = killed_at + KILLED_LEASE + Duration::from_secs(2);
    let acquired_at = loop {
        match store.claim_plain(k, "successor", None, LONG).await {
            Ok(Claim::Acquired) => break Instant::now(),
            Ok(Claim::InProgress { retry_in }) => {
                assert!(Instant::now() < deadline, "still held after the lease");
                tokio::time::sleep(retry_in.min(Duration::from_millis(20))).await;
            }
            other => panic!("{other:?}"),
        }
    };
    // The lease ended at the server time of the first reading plus `left`, which is no earlier
    // than `measured_at + left` (1 ms of rounding allowed).
    assert!(
        acquired_at >= measured_at + left - Duration::from_millis(1),
        "acquired {:?} after the reading, which said {left:?}",
        acquired_at - measured_at
    );
    assert!(
        acquired_at - killed_at <= KILLED_LEASE + Duration::from_millis(500),
        "blocked for {:?}, more than one lease",
        acquired_at - killed_at
    );
}

/// The child role of [`a_sigkilled_worker_blocks_its_key_for_one_lease_and_not_before`]: claims
/// the key with a 1 s lease and renews it every 200 ms until it is killed, saying so on stdout.
/// Does nothing when run on its own.
#[test]
#[ignore = "a child process of a_sigkilled_worker_blocks_its_key_for_one_lease_and_not_before"]
fn sigkilled_holder() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("holder") {
        return;
    }
    let url = std::env::var(URL_ENV).expect("the parent passes the server's URL");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::connect(&url).await.expect("connect");
        let k = key("killed");
        assert_eq!(
            store.claim_plain(k, "doomed", None, KILLED_LEASE).await,
            Ok(Claim::Acquired)
        );
        println!("{MARK} claimed");
        let mut beats = 0u32;
        let mut tick = tokio::time::interval(BEAT);
        tick.tick().await;
        // Renews until the parent kills the process; it never gets to release.
        loop {
            tick.tick().await;
            store.renew(k, "doomed", KILLED_LEASE).await.expect("renew");
            beats += 1;
            println!("{MARK} renewed {beats}");
        }
    });
}
