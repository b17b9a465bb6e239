//! Worker processes on RabbitMQ, NATS JetStream and apalis-postgres for the crash tests, and the
//! harness that runs, kills and restarts them.
//!
//! A worker is this test binary run again (its `worker` test, with [`ROLE_ENV`] set): a consumer
//! loop like `examples/rabbitmq_worker.rs` or `examples/nats_worker.rs` (prefetch 1, the job in
//! the delivery's scope, ack after the job, hand-back on a failure, ack or term once the job is
//! settled), or an apalis worker on `PostgresStorage` under `GuardLayer`, over one job under
//! `#[idempotent]`. Its store is `RedisStore` on the test's private `redis-server` (on
//! apalis-postgres: `PgStore`, in apalis's own database); its dead letters go to the Redis
//! stream [`DEAD_LETTERS`], where the test reads them with the rest of what the workers saw.
//!
//! The job's [`Behaviour`] says what its body does: apply its effect (`INCR effect:{id}`), abort
//! its process (`std::process::abort`, every time: a job with a bug that kills its worker), or
//! fail with a transient error on every attempt. Crash points ([`CRASH_ENV`]) name the jobs at
//! which the first worker to get there stops dead, announces itself on [`HOLDS`] and waits for the
//! harness to kill it with SIGKILL: `acked` stops after the job's result is stored and before the
//! ack goes to the broker.
//!
//! What the workers saw is kept in Redis, where the test reads it: `deliveries:{id}` (each
//! delivery as `number` or `number!` when it was the last), `runs:{id}` (bodies started),
//! `effect:{id}` (effects landed), `acked:{id}` and `settled:{id}` (acks sent after a success,
//! and after a settled failure), `handed:{id}` (hand-backs).

#![allow(dead_code)]

pub mod apalis_postgres;
pub mod crash;
pub mod nats;
pub mod rabbitmq;

use jobguard::{DeadLetter, Delivery, PgStore, RedisDeadLetters, RedisStore, Runtime, Transient};
use jobguard_testkit::redis::rerun_test;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Which broker a worker consumes from: `rabbitmq`, `nats` or `apalis-postgres`. Set, the test
/// binary's `worker` test runs a worker.
pub const ROLE_ENV: &str = "JOBGUARD_BROKER_WORKER";
/// The broker's URL (apalis-postgres: the database's).
pub const BROKER_URL_ENV: &str = "JOBGUARD_BROKER_URL";
/// The queue (RabbitMQ, apalis-postgres) or the stream (NATS; its consumer is named the same).
pub const NAME_ENV: &str = "JOBGUARD_BROKER_NAME";
/// The broker's limit: the queue's `x-delivery-limit`, the consumer's `max_deliver`, or the
/// tasks' `max_attempts`.
pub const LIMIT_ENV: &str = "JOBGUARD_BROKER_LIMIT";
/// The private `redis-server`: the store, the dead letters, and what the workers saw.
pub const REDIS_ENV: &str = "JOBGUARD_BROKER_REDIS";
/// Crash points: `acked:1,2,3`.
pub const CRASH_ENV: &str = "JOBGUARD_BROKER_CRASH";

/// Where a worker that reached a crash point announces `pid point id`.
const HOLDS: &str = "test:holds";
/// The stream the workers' dead letters go to.
pub const DEAD_LETTERS: &str = "test:dead_letters";

/// `#[retry]`'s attempts in each delivery.
pub const ATTEMPTS: u32 = 2;

/// One job: an id (its idempotency key) and what its body does.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Job {
    /// The job's id, and its idempotency key.
    pub id: u32,
    /// What the body does.
    pub behaviour: Behaviour,
}

/// What a job's body does each time it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Behaviour {
    /// `INCR effect:{id}`.
    Effect,
    /// Aborts the worker process, every time.
    Abort,
    /// Fails with a transient error, every attempt.
    Fail,
}

/// The broker a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// RabbitMQ through lapin.
    RabbitMq,
    /// NATS JetStream through async-nats.
    Nats,
    /// apalis on apalis-postgres, under `GuardLayer`, with `PgStore` in the same database.
    ApalisPostgres,
}

impl Kind {
    fn role(self) -> &'static str {
        match self {
            Kind::RabbitMq => "rabbitmq",
            Kind::Nats => "nats",
            Kind::ApalisPostgres => "apalis-postgres",
        }
    }
}

/// What a worker needs to know, from its environment.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The broker.
    pub kind: Kind,
    /// The broker's URL.
    pub url: String,
    /// The queue, or the stream and its consumer.
    pub name: String,
    /// The broker's delivery limit.
    pub limit: u32,
    /// The private Redis.
    pub redis: String,
}

/// Worker processes of one test, killed when dropped.
pub struct Workers {
    setup: Setup,
    test: &'static str,
    crash: String,
    children: Vec<Child>,
    /// The crash points at which a worker was killed, as `(point, id)`.
    pub kills: Vec<(String, u32)>,
    /// Whether a worker may exit on its own (a job that aborts it): it is then restarted.
    exits_allowed: bool,
    /// Workers that exited on their own, and were restarted.
    pub exits: usize,
}

impl Workers {
    /// Starts `n` workers by re-running the test binary's `test` (its `worker` test).
    pub fn start(setup: &Setup, test: &'static str, crash: &str, n: usize) -> Workers {
        let mut workers = Workers {
            setup: setup.clone(),
            test,
            crash: crash.to_owned(),
            children: Vec::new(),
            kills: Vec::new(),
            exits_allowed: false,
            exits: 0,
        };
        for _ in 0..n {
            let child = workers.spawn();
            workers.children.push(child);
        }
        workers
    }

    fn spawn(&self) -> Child {
        rerun_test(self.test)
            .env(ROLE_ENV, self.setup.kind.role())
            .env(BROKER_URL_ENV, &self.setup.url)
            .env(NAME_ENV, &self.setup.name)
            .env(LIMIT_ENV, self.setup.limit.to_string())
            .env(REDIS_ENV, &self.setup.redis)
            .env(CRASH_ENV, &self.crash)
            .stdout(Stdio::null())
            .spawn()
            .expect("start a worker process")
    }

    /// Lets workers exit on their own (a job that aborts them): each is restarted and counted
    /// in [`exits`](Self::exits).
    pub fn allow_exits(mut self) -> Self {
        self.exits_allowed = true;
        self
    }

    /// Kills (SIGKILL) every worker that announced a crash point and starts one in its place;
    /// restarts a worker that exited, when allowed (panics when not).
    pub async fn tend(&mut self, redis: &mut ConnectionManager) {
        while let Some(hold) = redis
            .lpop::<_, Option<String>>(HOLDS, None)
            .await
            .expect("read the holds")
        {
            let mut parts = hold.split(' ');
            let pid: u32 = parts.next().and_then(|p| p.parse().ok()).expect("pid");
            let point = parts.next().expect("point").to_owned();
            let id: u32 = parts.next().and_then(|p| p.parse().ok()).expect("id");
            let index = self
                .children
                .iter()
                .position(|c| c.id() == pid)
                .unwrap_or_else(|| panic!("no worker with pid {pid} announced {hold}"));
            let mut child = self.children.swap_remove(index);
            child.kill().expect("SIGKILL the worker");
            child.wait().expect("reap the worker");
            self.children.push(self.spawn());
            self.kills.push((point, id));
        }
        for i in 0..self.children.len() {
            if let Some(status) = self.children[i].try_wait().expect("poll a worker") {
                assert!(self.exits_allowed, "a worker exited on its own: {status}");
                self.children[i] = self.spawn();
                self.exits += 1;
            }
        }
    }

    /// Tends the workers until `done` holds of what they wrote in Redis, or panics with
    /// `what` after `limit`.
    pub async fn until<F>(&mut self, limit: Duration, what: &str, mut done: F)
    where
        F: AsyncFnMut(&mut ConnectionManager) -> bool,
    {
        let mut redis = connect(&self.setup.redis).await;
        let deadline = Instant::now() + limit;
        loop {
            self.tend(&mut redis).await;
            if done(&mut redis).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what} not reached after {limit:?}; kills {:?}, exits {}",
                self.kills,
                self.exits
            );
            // Polls what the workers wrote; they run on their own.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A connection to the test's Redis.
pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("a Redis URL");
    ConnectionManager::new(client)
        .await
        .expect("connect to the test's redis-server")
}

/// The counter `{name}:{id}`, 0 when never incremented.
pub async fn count(redis: &mut ConnectionManager, name: &str, id: u32) -> u32 {
    let n: Option<u32> = redis.get(format!("{name}:{id}")).await.expect("GET");
    n.unwrap_or(0)
}

/// The deliveries of job `id` that its handler saw, in order.
pub async fn deliveries(redis: &mut ConnectionManager, id: u32) -> Vec<Delivery> {
    let seen: Vec<String> = redis
        .lrange(format!("deliveries:{id}"), 0, -1)
        .await
        .expect("LRANGE");
    seen.iter()
        .map(|s| Delivery {
            number: s.trim_end_matches('!').parse().expect("a number"),
            last: s.ends_with('!'),
        })
        .collect()
}

/// The letters in the workers' stream.
pub async fn letters(redis_url: &str) -> Vec<DeadLetter> {
    RedisDeadLetters::connect(redis_url, DEAD_LETTERS)
        .await
        .expect("RedisDeadLetters")
        .list()
        .await
        .expect("list the letters")
        .into_iter()
        .map(|(_, letter)| letter.expect("a letter"))
        .collect()
}

/// Deliveries numbered `1..=n`, the `last` one marked.
pub fn numbered(n: u32, last: u32) -> Vec<Delivery> {
    (1..=n)
        .map(|number| Delivery {
            number,
            last: number == last,
        })
        .collect()
}

// The worker side.

static REDIS: OnceLock<ConnectionManager> = OnceLock::new();
static CRASHES: OnceLock<Vec<(String, u32)>> = OnceLock::new();

fn redis() -> ConnectionManager {
    REDIS.get().expect("the worker's connection").clone()
}

/// Runs a worker when [`ROLE_ENV`] is set; returns at once otherwise.
pub fn worker_if_asked() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let setup = Setup {
        kind: match role.as_str() {
            "rabbitmq" => Kind::RabbitMq,
            "nats" => Kind::Nats,
            "apalis-postgres" => Kind::ApalisPostgres,
            other => panic!("unknown broker {other}"),
        },
        url: var(BROKER_URL_ENV),
        name: var(NAME_ENV),
        limit: var(LIMIT_ENV).parse().expect("a limit"),
        redis: var(REDIS_ENV),
    };
    CRASHES
        .set(parse_crashes(&var(CRASH_ENV)))
        .expect("crash points set once");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async {
            REDIS
                .set(connect(&setup.redis).await)
                .unwrap_or_else(|_| panic!("connection set once"));
            let letters = RedisDeadLetters::connect(&setup.redis, DEAD_LETTERS)
                .await
                .expect("RedisDeadLetters");
            let runtime = match setup.kind {
                Kind::ApalisPostgres => {
                    Runtime::builder().store(PgStore::connect(&setup.url).await.expect("PgStore"))
                }
                _ => Runtime::builder()
                    .store(RedisStore::connect(&setup.redis).await.expect("RedisStore")),
            };
            runtime
                .dead_letters(letters)
                .build()
                .install()
                .expect("the first runtime installed in this process");
            match setup.kind {
                Kind::RabbitMq => rabbitmq::run_worker(&setup).await,
                Kind::Nats => nats::run_worker(&setup).await,
                Kind::ApalisPostgres => apalis_postgres::run_worker(&setup).await,
            }
        });
}

/// The crash points of a [`CRASH_ENV`] value, as `(point, id)`.
pub fn parse_crashes(spec: &str) -> Vec<(String, u32)> {
    spec.split(';')
        .filter(|part| !part.is_empty())
        .flat_map(|part| {
            let (point, ids) = part.split_once(':').expect("point:ids");
            ids.split(',')
                .map(move |id| (point.to_owned(), id.parse().expect("a job id")))
        })
        .collect()
}

/// What the consumer loop does with a message once its job returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done (run or replayed): ack.
    Done,
    /// Failed and settled (its one letter written): ack (RabbitMQ) or term (NATS).
    Settled,
    /// Failed on a delivery that is not its last: hand it back.
    HandBack,
}

/// Runs `job` in `delivery`'s scope, as the examples' loops do, and says what to do with the
/// message. Records the delivery first, and stops at the `acked` crash point after a stored
/// result.
pub async fn handle(job: Job, delivery: Delivery) -> Outcome {
    record(job, delivery).await;
    let (result, settled) = delivery.scope_settled(run(job)).await;
    match result {
        Ok(_) => {
            crash_point("acked", job.id).await;
            Outcome::Done
        }
        Err(_) if settled => Outcome::Settled,
        Err(_) => Outcome::HandBack,
    }
}

/// Notes `delivery` in `deliveries:{id}`.
async fn record(job: Job, delivery: Delivery) {
    let seen = format!(
        "{}{}",
        delivery.number,
        if delivery.last { "!" } else { "" }
    );
    let _: () = redis()
        .rpush(format!("deliveries:{}", job.id), seen)
        .await
        .expect("RPUSH deliveries");
}

/// Notes in Redis that the loop sent the message's ack, term or hand-back.
pub async fn sent(job: Job, outcome: Outcome) {
    let counter = match outcome {
        Outcome::Done => "acked",
        Outcome::Settled => "settled",
        Outcome::HandBack => "handed",
    };
    let _: () = redis()
        .incr(format!("{counter}:{}", job.id), 1)
        .await
        .expect("INCR");
}

/// The job's error.
#[derive(Debug, Transient)]
pub enum JobError {
    /// A failure worth another attempt.
    #[transient]
    Timeout,
    /// jobguard's own, with its own verdict.
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Timeout => f.write_str("timeout"),
            JobError::Jobguard(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for JobError {}

impl From<jobguard::Error> for JobError {
    fn from(e: jobguard::Error) -> Self {
        JobError::Jobguard(e)
    }
}

/// The job: idempotency outside, retry inside, as the examples'. A 2 s lease, and a wait
/// longer than it, so that a delivery that finds a dead worker's claim takes it over.
#[jobguard::idempotent(key = job.id, scope = "brokers.effect", lease = "2s", in_progress = wait("6s"))]
#[jobguard::retry(attempts = 2, base = "0ms", cap = "0ms", jitter = none, on = transient)]
async fn run(job: Job) -> Result<u64, JobError> {
    let mut redis = redis();
    let _: () = redis
        .incr(format!("runs:{}", job.id), 1)
        .await
        .map_err(store)?;
    match job.behaviour {
        Behaviour::Effect => Ok(redis
            .incr(format!("effect:{}", job.id), 1)
            .await
            .map_err(store)?),
        Behaviour::Abort => std::process::abort(),
        Behaviour::Fail => Err(JobError::Timeout),
    }
}

fn store(e: redis::RedisError) -> jobguard::Error {
    jobguard::Error::Store(e.to_string())
}

/// At a crash point named for this job, the first worker to reach it announces itself and stops,
/// holding everything it holds, until the harness kills it.
async fn crash_point(point: &str, id: u32) {
    let crashes = CRASHES.get().expect("crash points");
    if !crashes.iter().any(|(p, i)| p == point && *i == id) {
        return;
    }
    let mut redis = redis();
    let first: bool = redis::cmd("SET")
        .arg(format!("held:{point}:{id}"))
        .arg(std::process::id())
        .arg("NX")
        .query_async::<Option<String>>(&mut redis)
        .await
        .expect("SET NX")
        .is_some();
    if !first {
        return;
    }
    let _: () = redis
        .rpush(HOLDS, format!("{} {point} {id}", std::process::id()))
        .await
        .expect("announce the crash point");
    std::future::pending::<()>().await;
}
