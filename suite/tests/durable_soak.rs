//! The README's multi-worker setup under a backlog: 4 processes of `examples/worker.rs` (its
//! own settings, 16 jobs at a time each), 1,000 charge jobs pushed at once, the gateway down for
//! one order in twenty and timing out on one try in twenty. During the run, 10 workers are
//! killed with SIGKILL and 2 stopped with SIGTERM, each replaced by a new one.
//!
//! Every order is charged exactly once or dead-lettered exactly once (never both), and those the
//! gateway is down for are the ones dead-lettered; no worker exits on its own; a SIGTERMed
//! worker exits cleanly within its grace, and no key it held is counted as crashed unless a
//! SIGKILLed worker was running it too; each letter's `attempts` is the gateway's count of tries for
//! that order, counted in the key's record over every delivery (one more where a SIGKILL fell
//! between an attempt's count and its call).
//!
//! The workers are this test binary run again: its `worker` test runs the example's worker when
//! [`WORKER_ENV`] holds a Redis URL.

#[path = "../../examples/worker.rs"]
#[allow(dead_code)]
mod worker;

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::RedisDeadLetters;
use jobguard_testkit::redis::{RedisServer, rerun_test};
use redis::AsyncCommands;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const WORKER_ENV: &str = "JOBGUARD_SOAK_WORKER";
const JOBS: usize = 1_000;
const WORKERS: usize = 4;
const FAILURE_RATE: f64 = 0.05;
const KILLS: usize = 10;
const TERMS: usize = 2;

/// The worker role: runs the example's worker until it is stopped.
#[test]
fn worker() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let settings = worker::Settings {
        concurrency: 16,
        failure_rate: Some(FAILURE_RATE),
        grace: Duration::from_secs(5),
    };
    tokio::runtime::Runtime::new()
        .expect("a tokio runtime")
        .block_on(worker::run(&url, settings))
        .expect("the worker runs until it is stopped, and stops cleanly");
}

/// One worker process, its output in files for the checks at the end.
struct Proc {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

struct Fleet {
    url: String,
    dir: PathBuf,
    spawned: usize,
    running: Vec<Proc>,
    killed: Vec<Proc>,
    terminated: Vec<Proc>,
}

impl Fleet {
    fn spawn(&mut self) {
        self.spawned += 1;
        let out = self.dir.join(format!("worker-{}.out", self.spawned));
        let err = self.dir.join(format!("worker-{}.err", self.spawned));
        let child = rerun_test("worker")
            .env(WORKER_ENV, &self.url)
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
            .spawn()
            .expect("start a worker process");
        self.running.push(Proc { child, out, err });
    }

    /// Fails the test if a worker exited on its own.
    fn check_running(&mut self) {
        for proc in &mut self.running {
            if let Some(status) = proc.child.try_wait().expect("poll a worker") {
                let err = std::fs::read_to_string(&proc.err).unwrap_or_default();
                panic!("a worker exited on its own ({status}):\n{err}");
            }
        }
    }

    fn kill(&mut self, index: usize) {
        let mut proc = self.running.swap_remove(index);
        proc.child.kill().expect("SIGKILL a worker");
        proc.child.wait().expect("reap it");
        self.killed.push(proc);
        self.spawn();
    }

    fn terminate(&mut self, index: usize) {
        let mut proc = self.running.swap_remove(index);
        let status = std::process::Command::new("kill")
            .args(["-TERM", &proc.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        // The grace is 5 s, and the releases of what it drops take a moment more.
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = proc.child.try_wait().expect("poll a worker") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "a SIGTERMed worker did not stop within its grace"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = std::fs::read_to_string(&proc.err).unwrap_or_default();
        assert!(
            status.success(),
            "a SIGTERMed worker failed ({status}):\n{err}"
        );
        self.terminated.push(proc);
        self.spawn();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for proc in &mut self.running {
            let _ = proc.child.kill();
            let _ = proc.child.wait();
        }
    }
}

/// The keys each process was charging when it stopped: "charging ORDER (key KEY)" on its
/// stdout, and no "done with ORDER (key KEY)" after it.
fn keys_in_flight<'p>(procs: impl IntoIterator<Item = &'p Proc>) -> BTreeSet<String> {
    let key = |rest: &str| Some(rest.split("(key ").nth(1)?.strip_suffix(')')?.to_owned());
    let mut in_flight = BTreeSet::new();
    for proc in procs {
        let mut running = BTreeMap::<String, usize>::new();
        for line in std::fs::read_to_string(&proc.out)
            .unwrap_or_default()
            .lines()
        {
            if let Some(k) = line.strip_prefix("charging ").and_then(key) {
                *running.entry(k).or_default() += 1;
            } else if let Some(k) = line.strip_prefix("done with ").and_then(key)
                && let Some(n) = running.get_mut(&k)
            {
                *n -= 1;
            }
        }
        in_flight.extend(running.into_iter().filter(|(_, n)| *n > 0).map(|(k, _)| k));
    }
    in_flight
}

/// The keys some worker took over from a crashed claim (jobguard's warning on stderr).
fn keys_with_crashes<'p>(procs: impl IntoIterator<Item = &'p Proc>) -> BTreeSet<String> {
    procs
        .into_iter()
        .flat_map(|p| {
            std::fs::read_to_string(&p.err)
                .unwrap_or_default()
                .lines()
                .filter_map(|line| {
                    let rest = line.split(" with key ").nth(1)?;
                    rest.contains(" runs with ")
                        .then(|| rest.split(' ').next().unwrap_or_default().to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn key_of(order: usize) -> String {
    format!("soak-key-{order}")
}

fn order_of(order: usize) -> String {
    format!("soak-order-{order}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_over_killed_and_stopped_workers_charges_or_dead_letters_each_order_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let dir = std::env::temp_dir().join(format!("jobguard-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // The backlog, pushed at once, as the server pushes: three deliveries each.
    let conn = apalis_redis::connect(url.as_str()).await.unwrap();
    let mut storage = RedisStorage::<worker::ChargeJob>::new(conn)
        .with_config(apalis_redis::Config::default().queue(worker::QUEUE));
    for n in 0..JOBS {
        let job = worker::ChargeJob {
            order_id: order_of(n),
            key: key_of(n),
            amount: 100,
        };
        storage
            .push_task(TaskBuilder::new(job).max_attempts(3).build())
            .await
            .unwrap();
    }

    let mut fleet = Fleet {
        url: url.clone(),
        dir: dir.clone(),
        spawned: 0,
        running: Vec::new(),
        killed: Vec::new(),
        terminated: Vec::new(),
    };
    for _ in 0..WORKERS {
        fleet.spawn();
    }

    let mut redis = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap();
    let letters = RedisDeadLetters::connect(&url, worker::DEAD_LETTERS)
        .await
        .unwrap();
    // Ten SIGKILLs and two SIGTERMs, one every 3 s from the second second, at random workers.
    let mut actions: Vec<&str> = vec!["kill"; KILLS];
    actions.insert(3, "term");
    actions.insert(8, "term");
    assert_eq!(actions.len(), KILLS + TERMS);
    let start = Instant::now();
    let mut next_action = Duration::from_secs(2);
    let deadline = Duration::from_secs(110);
    loop {
        fleet.check_running();
        if !actions.is_empty() && start.elapsed() >= next_action {
            let index = rand::random_range(0..fleet.running.len());
            match actions.remove(0) {
                "kill" => fleet.kill(index),
                _ => fleet.terminate(index),
            }
            next_action += Duration::from_secs(3);
        }
        let charged: usize = redis.llen("demo:charges").await.unwrap();
        let dead = letters.len().await.unwrap();
        if actions.is_empty() && charged + dead >= JOBS {
            break;
        }
        assert!(
            start.elapsed() < deadline,
            "{charged} charged and {dead} dead-lettered of {JOBS} after {deadline:?}"
        );
        // Polls the run's progress; the workers run on their own.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.check_running();

    // Charged exactly once or dead-lettered exactly once, never both.
    let charges: Vec<String> = redis.lrange("demo:charges", 0, -1).await.unwrap();
    let mut charged = BTreeMap::<String, usize>::new();
    for order in &charges {
        *charged.entry(order.clone()).or_default() += 1;
    }
    let mut lettered = BTreeMap::<String, jobguard::DeadLetter>::new();
    for (id, letter) in letters.list().await.unwrap() {
        let letter = letter.unwrap_or_else(|e| panic!("letter {id} does not decode: {e}"));
        let key = letter.key.clone().expect("a keyed letter");
        let order = key.replace("soak-key-", "soak-order-");
        assert!(
            lettered.insert(order.clone(), letter).is_none(),
            "{order} dead-lettered twice"
        );
    }
    for n in 0..JOBS {
        let order = order_of(n);
        let times = charged.get(&order).copied().unwrap_or(0);
        let letter = lettered.get(&order);
        assert!(times <= 1, "{order} charged {times} times");
        assert!(
            (times == 1) != letter.is_some(),
            "{order}: charged {times} times, dead-lettered: {}",
            letter.is_some()
        );
        assert_eq!(
            letter.is_some(),
            worker::down_for(&order, FAILURE_RATE),
            "{order}: dead-lettered exactly when the gateway is down for it"
        );
    }

    // No crash counted for a SIGTERMed worker's keys, unless a SIGKILLed worker held them too.
    let crashed = keys_with_crashes(
        fleet
            .killed
            .iter()
            .chain(&fleet.terminated)
            .chain(&fleet.running),
    );
    let killed_keys = keys_in_flight(&fleet.killed);
    let termed_keys = keys_in_flight(&fleet.terminated);
    for key in &crashed {
        assert!(
            killed_keys.contains(key),
            "{key} was counted as crashed, but no SIGKILLed worker was running it (a SIGTERMed \
             one was: {})",
            termed_keys.contains(key)
        );
    }

    // Each letter's attempts is the gateway's count of tries for its order: the key's record
    // counts every attempt of every delivery, those a SIGKILL or a SIGTERM's grace cut short
    // included. An attempt is counted before it calls the gateway, so a worker killed between
    // the two leaves one attempt counted that the gateway never saw: for the orders a killed
    // worker was running, the letter may say one more.
    // A job whose workers died holding it three times is poisoned: its `crashed` letter counts
    // the attempts of the runs that died, each of which may have been killed between a count
    // and its call.
    let mut killed_between = Vec::new();
    let mut poisoned = Vec::new();
    for (order, letter) in &lettered {
        let tries: u32 = redis.get(format!("demo:tries:{order}")).await.unwrap_or(0);
        let key = letter.key.clone().unwrap_or_default();
        if letter.reason == jobguard::GiveUp::Crashed {
            assert!(killed_keys.contains(&key), "{order} poisoned, never killed");
            assert!(
                (tries..=tries + 3).contains(&letter.attempts),
                "{order}'s crashed letter: {} attempts, {tries} tries",
                letter.attempts
            );
            poisoned.push(order.clone());
            continue;
        }
        if killed_keys.contains(&key) && letter.attempts == tries + 1 {
            killed_between.push(order.clone());
            continue;
        }
        assert_eq!(letter.attempts, tries, "{order}'s letter");
    }
    println!(
        "letters with one attempt counted that a SIGKILL kept from the gateway: \
         {killed_between:?}; poisoned by three SIGKILLs: {poisoned:?}"
    );
    println!(
        "{} charged, {} dead-lettered (each checked against the gateway's tries), \
         {} SIGKILLs, {} SIGTERMs, {} keys taken over from a crash, in {:?}",
        charged.len(),
        lettered.len(),
        fleet.killed.len(),
        fleet.terminated.len(),
        crashed.len(),
        start.elapsed()
    );
    drop(fleet);
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}
