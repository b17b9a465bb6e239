//! `#[idempotent(store = ..., key = ...)]` on a `RedisStore`, against a private `redis-server`:
//! 200 keys × 8 concurrent deliveries from 4 OS processes run each body once (within one process
//! it is in the store conformance suite, run by `tests/redis_store.rs`), a stopped server runs
//! zero bodies, and a SIGKILLed worker blocks its key for one lease, not before.
//!
//! Real clock: the lease lives in the server. Waits poll with a deadline.

use jobguard::Error;
use jobguard::store::redis::RedisStore;
use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::redis::{RedisServer, rerun_test};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const KEYS: usize = 200;
const DELIVERIES: usize = 8;
const PROCESSES: usize = 4;
const MARK: &str = "jobguard-child:";
const ROLE_ENV: &str = "JOBGUARD_TEST_ROLE";
const URL_ENV: &str = "JOBGUARD_TEST_REDIS_URL";
const ID_ENV: &str = "JOBGUARD_TEST_CHILD";

/// How many times each order's body ran in this process.
struct Ledger {
    runs: Vec<AtomicU32>,
    /// Print a line for every run (the child processes report to their parent).
    report: bool,
}

impl Ledger {
    fn new(report: bool) -> Arc<Self> {
        Arc::new(Ledger {
            runs: (0..KEYS).map(|_| AtomicU32::new(0)).collect(),
            report,
        })
    }
    fn total(&self) -> u32 {
        self.runs.iter().map(|r| r.load(Ordering::SeqCst)).sum()
    }
}

#[jobguard::idempotent(
    store = *store,
    key = order,
    scope = "tests.redis_idempotent.charge",
    in_progress = wait("30s")
)]
async fn charge(
    store: &RedisStore,
    ledger: &Ledger,
    order: usize,
    who: &str,
) -> Result<String, Error> {
    ledger.runs[order].fetch_add(1, Ordering::SeqCst);
    if ledger.report {
        println!("{MARK} ran {order}");
    }
    // The side effect takes a moment, so the other deliveries find it in progress.
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(format!("receipt {order} by {who}"))
}

/// `DELIVERIES` tasks each deliver every order, each starting at a different one; returns every
/// delivery's `(order, result)`.
async fn deliver_all(store: &RedisStore, ledger: &Arc<Ledger>, who: &str) -> Vec<(usize, String)> {
    let mut tasks = Vec::new();
    for d in 0..DELIVERIES {
        let (store, ledger, who) = (store.clone(), ledger.clone(), format!("{who}/{d}"));
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..KEYS {
                let order = (i + d * KEYS / DELIVERIES) % KEYS;
                let receipt = charge(&store, &ledger, order, &who)
                    .await
                    .unwrap_or_else(|e| panic!("delivery of {order}: {e}"));
                got.push((order, receipt));
            }
            got
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.extend(t.await.expect("delivery task"));
    }
    got
}

/// Every delivery of an order got the same receipt.
fn assert_one_receipt_per_order(got: &[(usize, String)]) {
    let mut receipts: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (order, r) in got {
        receipts.entry(*order).or_default().insert(r);
    }
    assert_eq!(receipts.len(), KEYS);
    for (order, r) in receipts {
        assert_eq!(r.len(), 1, "order {order} got {r:?}");
    }
}

#[test]
fn deliveries_from_four_processes_run_each_body_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            rerun_test("cross_process_deliverer")
                .env(ROLE_ENV, "deliverer")
                .env(URL_ENV, server.url())
                .env(ID_ENV, i.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a child test process")
        })
        .collect();
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()).lines())
        .collect();
    for (i, lines) in outputs.iter_mut().enumerate() {
        let ready = lines.by_ref().any(|l| marked(&l.unwrap()) == Some("ready"));
        assert!(ready, "child {i} exited before it was ready");
    }
    for child in &mut children {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let mut runs = vec![0u32; KEYS];
    let mut got = Vec::new();
    for lines in outputs {
        for line in lines {
            let line = line.unwrap();
            let Some(said) = marked(&line) else { continue };
            if let Some(order) = said.strip_prefix("ran ") {
                runs[order.parse::<usize>().unwrap()] += 1;
            } else if let Some(rest) = said.strip_prefix("got ") {
                let (order, receipt) = rest.split_once(' ').unwrap();
                got.push((order.parse().unwrap(), receipt.to_owned()));
            }
        }
    }
    for (i, mut child) in children.into_iter().enumerate() {
        let status = child.wait().unwrap();
        assert!(status.success(), "child {i} failed: {status}");
    }
    for (order, n) in runs.iter().enumerate() {
        assert_eq!(*n, 1, "order {order} ran {n} times across the processes");
    }
    assert_eq!(got.len(), PROCESSES * DELIVERIES * KEYS);
    assert_one_receipt_per_order(&got);
}

fn marked(line: &str) -> Option<&str> {
    line.find(MARK).map(|at| line[at + MARK.len()..].trim())
}

/// The child role of [`deliveries_from_four_processes_run_each_body_once`]: connects, says
/// `ready`, waits for `go`, delivers every order from `DELIVERIES` tasks, and reports each body
/// run and each result. Does nothing when run on its own.
#[test]
#[ignore = "a child process of deliveries_from_four_processes_run_each_body_once"]
fn cross_process_deliverer() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("deliverer") {
        return;
    }
    let url = std::env::var(URL_ENV).expect("the parent passes the server's URL");
    let id = std::env::var(ID_ENV).expect("the parent passes the child's number");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::connect(&url).await.expect("connect");
        println!("{MARK} ready");
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
        assert_eq!(go.trim(), "go");
        let ledger = Ledger::new(true);
        for (order, receipt) in deliver_all(&store, &ledger, &format!("process-{id}")).await {
            println!("{MARK} got {order} {receipt}");
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_runs_zero_bodies_and_a_restarted_one_runs_them_again() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let ledger = Ledger::new(false);
    assert_eq!(
        charge(&store, &ledger, 0, "before").await.unwrap(),
        "receipt 0 by before"
    );
    assert_eq!(ledger.total(), 1);

    server.stop();
    for order in 1..=20 {
        let got = charge(&store, &ledger, order, "down").await;
        assert!(
            matches!(got, Err(Error::Store(_))),
            "order {order}: {got:?}"
        );
    }
    assert_eq!(ledger.total(), 1, "no body ran while the store was down");

    server.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match charge(&store, &ledger, 1, "after").await {
            Ok(receipt) => {
                assert_eq!(receipt, "receipt 1 by after");
                break;
            }
            Err(Error::Store(e)) => {
                assert!(Instant::now() < deadline, "no recovery within 15s: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ledger.runs[1].load(Ordering::SeqCst), 1);
    assert_eq!(
        charge(&store, &ledger, 1, "replay").await.unwrap(),
        "receipt 1 by after"
    );
    assert_eq!(ledger.total(), 2);
}

/// The lease of the job the SIGKILLed worker runs.
const KILLED_LEASE: Duration = Duration::from_secs(1);

/// The job the child starts and never finishes: it is killed inside the body.
#[jobguard::idempotent(store = *store, key = key, scope = "tests.redis_idempotent.killed", lease = "1s")]
async fn never_finishes(store: &RedisStore, key: &str) -> Result<u64, Error> {
    println!("{MARK} started");
    std::future::pending().await
}

/// The same job, delivered again after the crash.
#[jobguard::idempotent(store = *store, key = key, scope = "tests.redis_idempotent.killed", lease = "1s")]
async fn redelivered(store: &RedisStore, key: &str, runs: &AtomicU32) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(42)
}

#[tokio::test]
async fn a_sigkilled_job_blocks_its_key_for_one_lease_and_not_before() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut child = rerun_test("sigkilled_job")
        .env(ROLE_ENV, "job")
        .env(URL_ENV, server.url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = lines
        .by_ref()
        .any(|l| marked(&l.unwrap()) == Some("started"));
    assert!(started, "the child's job never started");
    let started_at = Instant::now();
    let k = jobguard::StoreKey {
        scope: "tests.redis_idempotent.killed",
        key: "order-K",
    };
    // The time left on the job's lease, as the server measures it. (The key itself is kept for
    // the claim's TTL, so that a lapsed claim is found and counted; the lease's end is in the
    // record.) A probe's claim of a live claim changes nothing.
    let lease_left = async |store: &RedisStore| -> Duration {
        match store.claim_plain(k, "probe", None, KILLED_LEASE).await {
            Ok(Claim::InProgress { retry_in }) => retry_in,
            other => panic!("the running job lost its claim: {other:?}"),
        }
    };
    // The heartbeat keeps the claim alive past its first lease.
    while started_at.elapsed() < KILLED_LEASE + KILLED_LEASE / 2 {
        assert!(lease_left(&store).await > Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    child.kill().unwrap(); // SIGKILL: no release, no cleanup
    child.wait().unwrap();
    let killed_at = Instant::now();
    let runs = AtomicU32::new(0);

    let measured_at = Instant::now();
    let left = lease_left(&store).await;
    assert!(
        left > Duration::ZERO && left <= KILLED_LEASE,
        "{left:?} left on the lease after the kill"
    );
    assert_eq!(
        redelivered(&store, "order-K", &runs).await,
        Err(Error::InProgress)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let deadline = killed_at + KILLED_LEASE + Duration::from_secs(2);
    let ran_at = loop {
        match redelivered(&store, "order-K", &runs).await {
            Ok(42) => break Instant::now(),
            Err(Error::InProgress) => {
                assert!(Instant::now() < deadline, "still blocked after the lease");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        ran_at >= measured_at + left - Duration::from_millis(1),
        "ran {:?} after a reading of {left:?} left",
        ran_at - measured_at
    );
    assert!(
        ran_at - killed_at <= KILLED_LEASE + Duration::from_millis(500),
        "blocked for {:?}, more than one lease",
        ran_at - killed_at
    );
    assert_eq!(redelivered(&store, "order-K", &runs).await, Ok(42));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the redelivery replays");
}

/// The child role of [`a_sigkilled_job_blocks_its_key_for_one_lease_and_not_before`]: starts a
/// job with a 1 s lease that never finishes; the parent kills it. Does nothing on its own.
#[test]
#[ignore = "a child process of a_sigkilled_job_blocks_its_key_for_one_lease_and_not_before"]
fn sigkilled_job() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("job") {
        return;
    }
    let url = std::env::var(URL_ENV).expect("the parent passes the server's URL");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::connect(&url).await.expect("connect");
        let _ = never_finishes(&store, "order-K").await;
        unreachable!("the job never finishes");
    });
}
