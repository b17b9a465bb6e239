//! A checkout worker for the durable-step tests, and the harness that runs, kills, pauses and
//! restarts it.
//!
//! The worker is an apalis worker on apalis's Redis storage, like `examples/checkout.rs`: one
//! job, `#[idempotent]` around `#[retry]`, with three steps (capture, reserve, receipt) whose
//! effects are counters in Redis. Each order says where its worker stops ([`Point`]): after the
//! reservation, to be killed with `SIGKILL`; inside the reservation, after its effect and
//! before its record, to be paused with `SIGSTOP` and woken with `SIGCONT`; or never, with a
//! mail server that refuses the receipt until the test fixes it.
//!
//! Each test binary runs itself as a worker: its `worker` test does nothing unless
//! [`WORKER_ENV`] holds a Redis URL.

#![allow(dead_code)]

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::GuardLayer;
use jobguard::{Event, RedisDeadLetters, RedisStore, Runtime, Transient};
use jobguard_testkit::redis::rerun_test;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Set to a Redis URL, it makes the test binary's `worker` test run a worker.
pub const WORKER_ENV: &str = "JOBGUARD_STEPS_WORKER";
/// The apalis queue.
const QUEUE: &str = "steps.checkout";
/// Where a worker that reached its order's point announces `pid point id`.
const HOLDS: &str = "test:holds";
/// The stream the workers' dead letters go to.
pub const DEAD_LETTERS: &str = "test:steps:dead_letters";

/// One order, and where its worker stops.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Order {
    /// The order's id: the job's key.
    pub id: u32,
    /// Where the first worker to run it stops.
    pub point: Point,
}

/// Where a worker stops.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Point {
    /// After the reserve step, recorded: the worker hangs until it is killed.
    AfterReserve,
    /// Inside the reserve step, after its effect and before its record: the worker is paused
    /// until the test sets `resume:{id}` and wakes it.
    InReserve,
    /// The mail server refuses the receipt for good until the test sets `mail:fixed`.
    MailBroken,
}

/// The apalis-redis settings: a worker whose heartbeat stops for 2 s is dead, and its task
/// goes back on the queue.
pub fn config() -> apalis_redis::Config {
    apalis_redis::Config::default()
        .queue(QUEUE)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2)
}

/// Pushes `order`.
pub async fn push(url: &str, order: Order) {
    let conn = apalis_redis::connect(url)
        .await
        .expect("connect the producer");
    let mut storage = RedisStorage::<Order>::new(conn).with_config(config());
    storage.push(order).await.expect("push an order");
}

/// A connection to the test's server.
pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("a Redis URL");
    ConnectionManager::new(client)
        .await
        .expect("connect to the test's redis-server")
}

/// The counter `{name}:{id}`.
pub async fn count(redis: &mut ConnectionManager, name: &str, id: u32) -> u32 {
    let n: Option<u32> = redis.get(format!("{name}:{id}")).await.expect("GET");
    n.unwrap_or(0)
}

/// The list `{name}:{id}`: `pid step` for each step run (`runs`) or replayed (`replays`).
pub async fn list(redis: &mut ConnectionManager, name: &str, id: u32) -> Vec<String> {
    redis
        .lrange(format!("{name}:{id}"), 0, -1)
        .await
        .expect("LRANGE")
}

/// Polls until the counter `{name}:{id}` reaches `n`, for `limit` at most.
pub async fn until_count(
    redis: &mut ConnectionManager,
    name: &str,
    id: u32,
    n: u32,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    while count(redis, name, id).await < n {
        assert!(Instant::now() < deadline, "{name}:{id} never reached {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until the list `{name}:{id}` holds `n` notes, for `limit` at most: the notes are
/// written by tasks the observer spawns, after the step's effect.
pub async fn until_len(
    redis: &mut ConnectionManager,
    name: &str,
    id: u32,
    n: usize,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    while list(redis, name, id).await.len() < n {
        assert!(
            Instant::now() < deadline,
            "{name}:{id} never held {n} notes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Worker processes of one test, killed when dropped.
pub struct Workers {
    url: String,
    test: &'static str,
    children: Vec<Child>,
}

impl Workers {
    /// Starts `n` workers by re-running the test binary's `test`.
    pub fn start(url: &str, test: &'static str, n: usize) -> Workers {
        let mut workers = Workers {
            url: url.to_owned(),
            test,
            children: Vec::new(),
        };
        for _ in 0..n {
            let child = workers.spawn();
            workers.children.push(child);
        }
        workers
    }

    fn spawn(&self) -> Child {
        rerun_test(self.test)
            .env(WORKER_ENV, &self.url)
            .stdout(Stdio::null())
            .spawn()
            .expect("start a worker process")
    }

    /// Waits for a worker to announce `point` (for `limit` at most): its pid.
    pub async fn held(&self, redis: &mut ConnectionManager, point: &str, limit: Duration) -> u32 {
        let deadline = Instant::now() + limit;
        loop {
            let hold: Option<String> = redis.lpop(HOLDS, None).await.expect("LPOP");
            if let Some(hold) = hold {
                let mut parts = hold.split(' ');
                let pid: u32 = parts.next().and_then(|p| p.parse().ok()).expect("pid");
                assert_eq!(parts.next(), Some(point), "{hold}");
                return pid;
            }
            assert!(Instant::now() < deadline, "no worker reached {point}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the worker `pid` with `SIGKILL`, and starts one in its place.
    pub fn kill(&mut self, pid: u32) {
        let at = (self.children.iter())
            .position(|c| c.id() == pid)
            .expect("one of these workers");
        let mut child = self.children.swap_remove(at);
        child.kill().expect("SIGKILL the worker");
        child.wait().expect("reap the worker");
        self.children.push(self.spawn());
    }

    /// Stops the worker `pid` with `SIGSTOP`: its heartbeat and its lease's renewals stop.
    pub fn pause(&self, pid: u32) {
        signal(pid, "-STOP");
    }

    /// Lets the paused worker `pid`'s job go on (`resume:{id}`), and wakes it with `SIGCONT`.
    pub async fn wake(&self, redis: &mut ConnectionManager, pid: u32, id: u32) {
        let _: () = redis
            .set(format!("resume:{id}"), 1)
            .await
            .expect("SET resume");
        signal(pid, "-CONT");
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

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

// The worker side.

static REDIS: OnceLock<ConnectionManager> = OnceLock::new();

/// The connection the job's services use: the worker's, or the test's own for a redrive.
pub fn use_redis(redis: ConnectionManager) {
    let _ = REDIS.set(redis);
}

fn redis() -> ConnectionManager {
    REDIS.get().expect("the services' connection").clone()
}

/// Runs a worker when [`WORKER_ENV`] is set; returns at once otherwise.
pub fn worker_if_asked() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run_worker(&url));
}

/// The runtime a worker (or a test's redrive) runs jobs under: claims and steps in Redis, each
/// step run or replayed noted in `runs:{id}` / `replays:{id}` with the process's pid.
pub async fn runtime(url: &str) -> Runtime {
    let notes = connect(url).await;
    Runtime::builder()
        .store(RedisStore::connect(url).await.expect("RedisStore"))
        .dead_letters(
            RedisDeadLetters::connect(url, DEAD_LETTERS)
                .await
                .expect("RedisDeadLetters"),
        )
        .observer(move |event: &Event<'_>| {
            let (list, key, step) = match event {
                Event::StepReplayed { key, step, .. } => ("replays", key, step),
                Event::StepRecorded { key, step, .. } => ("runs", key, step),
                _ => return,
            };
            let note = format!("{} {step}", std::process::id());
            let mut notes = notes.clone();
            let list = format!("{list}:{key}");
            tokio::spawn(async move {
                let _: Result<(), _> = notes.rpush(list, note).await;
            });
        })
        .build()
}

async fn run_worker(url: &str) {
    use_redis(connect(url).await);
    runtime(url)
        .await
        .install()
        .expect("the first runtime installed in this process");
    let storage = RedisStorage::<Order>::new(apalis_redis::connect(url).await.expect("connect"))
        .with_config(config());
    let _ = WorkerBuilder::new(format!("worker-{}", std::process::id()))
        .backend(storage)
        .concurrency(1)
        .layer(GuardLayer::new())
        .build(handle)
        .run()
        .await;
    // A worker woken from a pause may find its apalis worker stopped (its heartbeat lapsed): it
    // waits here, killed at the test's end, so that its job's late step goes out.
    std::future::pending::<()>().await;
}

/// The handler: the job; a lost lease is noted in `lease_lost:{id}`. An order that pauses its
/// worker runs in a task of its own: a worker woken from the pause finds its apalis worker
/// stopped (its heartbeat lapsed) and its handler's future dropped, and the job's late step
/// must still go out.
async fn handle(order: Order) -> Result<String, ShopError> {
    match order.point {
        Point::InReserve => tokio::spawn(noted(order)).await.expect("the job's task"),
        _ => noted(order).await,
    }
}

/// The job, and its lost lease noted.
async fn noted(order: Order) -> Result<String, ShopError> {
    let done = checkout(order).await;
    if let Err(ShopError::Jobguard(jobguard::Error::LeaseLost)) = &done {
        let _: () = redis().incr(format!("lease_lost:{}", order.id), 1).await?;
    }
    done
}

/// The job: three steps; the payload is the order, for a redrive of its dead letter.
#[jobguard::idempotent(key = order.id, scope = "steps.checkout", lease = "2s")]
#[jobguard::retry(attempts = 2, base = "20ms", cap = "20ms", jitter = none, payload = order)]
pub async fn checkout(order: Order) -> Result<String, ShopError> {
    let payment = capture(order).await?;
    let reservation = reserve(order).await?;
    if order.point == Point::AfterReserve {
        hold("after-reserve", order.id).await;
    }
    receipt(order, &payment, reservation).await
}

#[jobguard::step(name = "capture.v1")]
async fn capture(order: Order) -> Result<String, ShopError> {
    let n: u32 = redis().incr(format!("captured:{}", order.id), 1).await?;
    Ok(format!("payment-{}-{n}", order.id))
}

/// The stock service reserves once per order (a second request for the same order is
/// answered, not applied), and counts the requests and the reservations applied.
#[jobguard::step(name = "reserve.v1")]
async fn reserve(order: Order) -> Result<u32, ShopError> {
    let id = order.id;
    let applied: u32 = redis::Script::new(
        "redis.call('INCR', KEYS[3]) \
         if redis.call('SET', KEYS[1], '1', 'NX') then return redis.call('INCR', KEYS[2]) end \
         return tonumber(redis.call('GET', KEYS[2]))",
    )
    .key(format!("reservation:{id}"))
    .key(format!("reserved:{id}"))
    .key(format!("reserve_requests:{id}"))
    .invoke_async(&mut redis())
    .await?;
    if order.point == Point::InReserve && hold("in-reserve", id).await {
        // Paused here by the test, past the lease; then woken.
        let mut redis = redis();
        loop {
            match redis.get::<_, Option<u32>>(format!("resume:{id}")).await {
                Ok(Some(_)) => break,
                Ok(None) => {}
                // A GET in flight when the process was stopped can time out when it resumes.
                Err(e) if e.is_timeout() => {}
                Err(e) => return Err(e.into()),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(applied)
}

#[jobguard::step(name = "receipt.v1")]
async fn receipt(order: Order, payment: &str, reservation: u32) -> Result<String, ShopError> {
    let mut redis = redis();
    if order.point == Point::MailBroken {
        let fixed: Option<u32> = redis.get("mail:fixed").await?;
        if fixed.is_none() {
            return Err(ShopError::MailRefused);
        }
    }
    let _: () = redis.incr(format!("receipts:{}", order.id), 1).await?;
    Ok(format!("receipt for {payment}, reservation {reservation}"))
}

/// Whether this process is the first to reach `point` for order `id` (`SET NX`); the first
/// announces itself on [`HOLDS`] and, after the reservation, hangs until it is killed.
async fn hold(point: &str, id: u32) -> bool {
    let mut redis = redis();
    let first = redis::cmd("SET")
        .arg(format!("held:{point}:{id}"))
        .arg(std::process::id())
        .arg("NX")
        .query_async::<Option<String>>(&mut redis)
        .await
        .expect("SET NX")
        .is_some();
    if !first {
        return false;
    }
    let _: () = redis
        .rpush(HOLDS, format!("{} {point} {id}", std::process::id()))
        .await
        .expect("announce the point");
    if point == "after-reserve" {
        std::future::pending::<()>().await;
    }
    true
}

/// The job's failures.
#[derive(Debug, Transient)]
pub enum ShopError {
    /// The mail server refuses the receipt: permanent, the job is dead-lettered.
    MailRefused,
    /// A service could not be reached.
    #[transient(from)]
    Redis(redis::RedisError),
    /// jobguard's own.
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for ShopError {}

impl From<redis::RedisError> for ShopError {
    fn from(e: redis::RedisError) -> Self {
        ShopError::Redis(e)
    }
}

impl From<jobguard::Error> for ShopError {
    fn from(e: jobguard::Error) -> Self {
        ShopError::Jobguard(e)
    }
}
