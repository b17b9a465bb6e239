//! Claims racing for the same keys on one private `redis-server` across 4 OS processes (children
//! of this test binary), 8 claimers each: exactly one claimer wins each of 200 keys. (The same
//! race within one process is in the store conformance suite, run by `tests/redis_store.rs`.)

use jobguard::StoreKey;
use jobguard::store::redis::RedisStore;
use jobguard::testing::{Claim, PlainClaim};
use jobguard_testkit::redis::{RedisServer, rerun_test};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

const KEYS: usize = 200;
const CLAIMERS: usize = 8;
const PROCESSES: usize = 4;
const LEASE: Duration = Duration::from_secs(120);
const SCOPE: &str = "tests.redis_concurrency";

/// Marks the lines a child writes for the parent (libtest writes its own lines around them).
const MARK: &str = "jobguard-child:";
const ROLE_ENV: &str = "JOBGUARD_TEST_ROLE";
const URL_ENV: &str = "JOBGUARD_TEST_REDIS_URL";
const ID_ENV: &str = "JOBGUARD_TEST_CHILD";

/// `CLAIMERS` tasks each claim all `KEYS` keys, each starting at a different key; returns the
/// keys each task won as `(task, key)`.
async fn race(store: &RedisStore, tag: &str) -> Vec<(String, usize)> {
    let mut tasks = Vec::new();
    for c in 0..CLAIMERS {
        let store = store.clone();
        let token = format!("{tag}-{c}");
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for i in 0..KEYS {
                let k = (i + c * KEYS / CLAIMERS) % KEYS;
                let key = format!("order-{k}");
                let key = StoreKey {
                    scope: SCOPE,
                    key: &key,
                };
                match store.claim_plain(key, &token, None, LEASE).await {
                    Ok(Claim::Acquired) => won.push((token.clone(), k)),
                    Ok(Claim::InProgress { .. }) => {}
                    other => panic!("claim of {k}: {other:?}"),
                }
            }
            won
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        won.extend(t.await.expect("claimer task"));
    }
    won
}

fn assert_one_winner_per_key(won: &[(String, usize)]) {
    let mut winners: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (who, k) in won {
        winners.entry(*k).or_default().push(who);
    }
    for k in 0..KEYS {
        let w = winners.get(&k).map_or(&[][..], Vec::as_slice);
        assert_eq!(w.len(), 1, "key {k} won by {w:?}");
    }
    assert_eq!(won.len(), KEYS);
}

#[test]
fn two_hundred_keys_four_processes_one_winner_each() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            rerun_test("cross_process_claimer")
                .env(ROLE_ENV, "claimer")
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
    // Wait until every child is connected, then start them together.
    for (i, lines) in outputs.iter_mut().enumerate() {
        wait_for(lines, "ready", i);
    }
    for child in &mut children {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let mut won = Vec::new();
    for (i, lines) in outputs.into_iter().enumerate() {
        for line in lines {
            let line = line.expect("child stdout");
            if let Some(k) = marked(&line).and_then(|said| said.strip_prefix("won ")) {
                won.push((format!("process-{i}"), k.parse().unwrap()));
            }
        }
    }
    for (i, mut child) in children.into_iter().enumerate() {
        let status = child.wait().unwrap();
        assert!(status.success(), "child {i} failed: {status}");
    }
    assert_one_winner_per_key(&won);
    let per_process: BTreeMap<&str, usize> = won.iter().fold(BTreeMap::new(), |mut m, (w, _)| {
        *m.entry(w.as_str()).or_default() += 1;
        m
    });
    println!("keys won per process: {per_process:?}");
}

fn marked(line: &str) -> Option<&str> {
    line.find(MARK).map(|at| line[at + MARK.len()..].trim())
}

fn wait_for(lines: &mut impl Iterator<Item = std::io::Result<String>>, what: &str, child: usize) {
    for line in lines.by_ref() {
        if marked(&line.expect("child stdout")) == Some(what) {
            return;
        }
    }
    panic!("child {child} exited before saying {what:?}");
}

/// The child role of [`two_hundred_keys_four_processes_one_winner_each`]: connects, says
/// `ready`, waits for `go` on stdin, races `CLAIMERS` tasks over the keys and prints each key
/// it won. Does nothing when run on its own.
#[test]
#[ignore = "a child process of two_hundred_keys_four_processes_one_winner_each"]
fn cross_process_claimer() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("claimer") {
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
        for (_, k) in race(&store, &format!("process-{id}")).await {
            println!("{MARK} won {k}");
        }
    });
}
