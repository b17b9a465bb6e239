//! A test worker for the durable-job tests, and the harness that runs, crashes and restarts it.
//!
//! The worker is an apalis worker on apalis's Redis storage, like `examples/worker.rs`, with one
//! job that increments a counter in Redis (the side effect), under `#[idempotent]` with
//! `RedisStore`. Unlike the example, its job carries crash points: the environment variable
//! [`CRASH_ENV`] names the jobs at which a worker stops dead, once per job and point, and waits
//! to be killed; the harness sees the announcement and kills that worker with `SIGKILL`
//! (`Child::kill`), then starts a new one.
//!
//! A worker runs one job at a time, so a kill lands exactly where a crash point says: a SIGKILL
//! ends every job in flight, and one caught between its effect and its stored result would be in
//! the window that `durable_window.rs` shows on purpose.
//!
//! The crash point `abort` is different: a worker that reaches it counts the run (`INCR
//! runs:{id}`) and aborts its process (`std::process::abort`), every time, as a job with a bug
//! that kills its worker would; the harness restarts a worker that exited when the test said it
//! may ([`Workers::allow_exits`]).
//!
//! The workers' dead letters go to the Redis stream [`DEAD_LETTERS`] on the test's server.
//!
//! Each test binary runs itself as a worker process: its `worker` test does nothing unless
//! [`WORKER_ENV`] holds a Redis URL, and then runs a worker until it is killed.

#![allow(dead_code)]

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::{Delivery, GuardLayer};
use jobguard::{RedisDeadLetters, RedisStore, Runtime};
use jobguard_testkit::redis::rerun_test;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Set to a Redis URL, it makes the test binary's `worker` test run a worker.
pub const WORKER_ENV: &str = "JOBGUARD_DURABLE_WORKER";
/// Crash points: `point:id,id;point:id`, with `point` one of `before` (the claim is held, the
/// effect not done), `effect` (the effect done, the result not stored), `acked` (the result
/// stored, the task not acknowledged to the broker), `abort` (the run counted, then the
/// process aborts, at every delivery) and `stall` (the run counted, the effect not yet written:
/// the harness stops the process with `SIGSTOP`, as a GC pause or a stalled VM would, until
/// [`Workers::resume_stalled`]).
pub const CRASH_ENV: &str = "JOBGUARD_TEST_CRASH";

/// The apalis queue the tests use.
const QUEUE: &str = "durable";
/// The list where a worker that reached a crash point announces `pid point id`.
const HOLDS: &str = "test:holds";
/// The stream the workers' dead letters go to.
pub const DEAD_LETTERS: &str = "test:dead_letters";

/// One job: an id, and how its effect reaches the downstream.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Job {
    /// The job's id, and its idempotency key.
    pub id: u32,
    /// How the effect is applied.
    pub downstream: Downstream,
}

/// How the job's side effect reaches the downstream system.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum Downstream {
    /// `INCR effect:{id}`: every run that gets this far counts.
    Plain,
    /// The key goes with the write, and the downstream applies a key once: `INCR effect:{id}`
    /// only when `applied:{id}` was not set.
    Dedupe,
    /// The claim's fence goes with the write, and the downstream keeps the largest it has seen
    /// (`fence:{id}`) and refuses a write with a smaller one; each fence that arrives is pushed
    /// on `fences:{id}`, each refusal counted in `refused:{id}`.
    Fenced,
}

/// The apalis-redis settings of the tests: a worker whose heartbeat stops for 5 s is dead, and
/// its tasks go back on the queue. apalis-redis beats from the worker's poll of the queue, which
/// a worker at concurrency 1 makes only between tasks: a task that waits out another claim's
/// lease (2 s here) delays its beat by as long, so a limit of 2 s declared such live workers
/// dead (and stopped them with "worker not registered").
pub fn config() -> apalis_redis::Config {
    apalis_redis::Config::default()
        .queue(QUEUE)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(5)
        .batch_size(4)
}

/// Pushes each job `times` times, one copy of every job after another.
pub async fn push(url: &str, jobs: &[Job], times: usize) {
    let conn = apalis_redis::connect(url)
        .await
        .expect("connect the producer");
    let mut storage = RedisStorage::<Job>::new(conn).with_config(config());
    for _ in 0..times {
        for job in jobs {
            storage.push(*job).await.expect("push a job");
        }
    }
}

/// Worker processes of one test, killed when dropped.
pub struct Workers {
    url: String,
    test: &'static str,
    crash: String,
    children: Vec<Child>,
    /// The crash points at which a worker was killed, as `(point, id)`.
    pub kills: Vec<(String, u32)>,
    /// Whether a worker may exit on its own (at an `abort` crash point): it is then restarted.
    exits_allowed: bool,
    /// Workers that exited on their own, and were restarted.
    pub exits: usize,
    /// Workers stopped (`SIGSTOP`) at a `stall` point, as `(pid, id)`.
    pub stalled: Vec<(u32, u32)>,
}

impl Workers {
    /// Starts `n` workers by re-running the test binary's `test` (its `worker` test).
    pub fn start(url: &str, test: &'static str, crash: &str, n: usize) -> Workers {
        let mut workers = Workers {
            url: url.to_owned(),
            test,
            crash: crash.to_owned(),
            children: Vec::new(),
            kills: Vec::new(),
            exits_allowed: false,
            exits: 0,
            stalled: Vec::new(),
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
            .env(CRASH_ENV, &self.crash)
            .stdout(Stdio::null())
            .spawn()
            .expect("start a worker process")
    }

    /// Lets workers exit on their own (an `abort` crash point): each is restarted and counted in
    /// [`exits`](Self::exits).
    pub fn allow_exits(mut self) -> Self {
        self.exits_allowed = true;
        self
    }

    /// Kills (SIGKILL) every worker that announced a crash point, and starts one in its place.
    /// Returns how many it killed.
    pub async fn kill_held(&mut self, redis: &mut ConnectionManager) -> usize {
        let mut killed = 0;
        while let Some(hold) = redis
            .lpop::<_, Option<String>>(HOLDS, None)
            .await
            .expect("read the holds")
        {
            let mut parts = hold.split(' ');
            let pid: u32 = parts.next().and_then(|p| p.parse().ok()).expect("pid");
            let point = parts.next().expect("point").to_owned();
            let id: u32 = parts.next().and_then(|p| p.parse().ok()).expect("id");
            if point == "stall" {
                // Paused, not killed: its heartbeats stop and its lease lapses, and it wakes up
                // when the test says.
                signal(pid, "-STOP");
                self.stalled.push((pid, id));
                continue;
            }
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
            killed += 1;
        }
        for i in 0..self.children.len() {
            if let Some(status) = self.children[i].try_wait().expect("poll a worker") {
                assert!(self.exits_allowed, "a worker exited on its own: {status}");
                self.children[i] = self.spawn();
                self.exits += 1;
            }
        }
        killed
    }

    /// Wakes every stalled worker (`SIGCONT`) and lets its job go on from the `stall` point.
    pub async fn resume_stalled(&mut self, redis: &mut ConnectionManager) {
        for (pid, id) in self.stalled.drain(..) {
            let _: () = redis
                .set(format!("resume:{id}"), 1)
                .await
                .expect("SET resume");
            signal(pid, "-CONT");
        }
    }

    /// Kills held workers and restarts them until `done` tasks are acknowledged as done, or
    /// panics with the state after `limit`.
    pub async fn run_until_done(&mut self, done: usize, limit: Duration) {
        let mut redis = connect(&self.url).await;
        let done_set = config().done_jobs_set();
        let deadline = Instant::now() + limit;
        loop {
            self.kill_held(&mut redis).await;
            let finished: usize = redis.scard(&done_set).await.expect("count done tasks");
            if finished >= done {
                return;
            }
            if Instant::now() > deadline {
                let dead: usize = redis
                    .scard(config().dead_jobs_set())
                    .await
                    .expect("count dead tasks");
                panic!(
                    "{finished} of {done} tasks done after {limit:?} ({dead} dead); kills so far: {:?}",
                    self.kills
                );
            }
            // Polls the broker's progress; the workers run on their own.
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

/// Sends `signal` (`-STOP`, `-CONT`) to process `pid` with kill(1).
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

/// A connection to the test's server.
pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("a Redis URL");
    ConnectionManager::new(client)
        .await
        .expect("connect to the test's redis-server")
}

/// The counter `{name}:{id}`, 0 when it was never incremented.
async fn count(redis: &mut ConnectionManager, name: &str, id: u32) -> u32 {
    let n: Option<u32> = redis.get(format!("{name}:{id}")).await.expect("GET");
    n.unwrap_or(0)
}

/// The list `{name}:{id}`, in order.
async fn list<T: redis::FromRedisValue>(
    redis: &mut ConnectionManager,
    name: &str,
    id: u32,
) -> Vec<T> {
    redis
        .lrange(format!("{name}:{id}"), 0, -1)
        .await
        .expect("LRANGE")
}

/// How many times job `id`'s effect landed.
pub async fn effects(redis: &mut ConnectionManager, id: u32) -> u32 {
    count(redis, "effect", id).await
}

/// How many times job `id`'s body reached its effect.
pub async fn runs(redis: &mut ConnectionManager, id: u32) -> u32 {
    count(redis, "runs", id).await
}

/// The delivery numbers the body of job `id` saw, in order.
pub async fn deliveries(redis: &mut ConnectionManager, id: u32) -> Vec<u32> {
    list(redis, "deliveries", id).await
}

// The worker side.

static REDIS: OnceLock<ConnectionManager> = OnceLock::new();
static CRASHES: OnceLock<Vec<(String, u32)>> = OnceLock::new();

fn redis() -> ConnectionManager {
    REDIS.get().expect("the worker's connection").clone()
}

/// Runs a worker when [`WORKER_ENV`] is set; returns at once otherwise.
pub fn worker_if_asked() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let crashes = std::env::var(CRASH_ENV).unwrap_or_default();
    CRASHES
        .set(parse_crashes(&crashes))
        .expect("crash points set once");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run_worker(&url));
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

async fn run_worker(url: &str) {
    REDIS
        .set(connect(url).await)
        .unwrap_or_else(|_| panic!("connection set once"));
    Runtime::builder()
        .store(RedisStore::connect(url).await.expect("RedisStore"))
        .dead_letters(
            RedisDeadLetters::connect(url, DEAD_LETTERS)
                .await
                .expect("RedisDeadLetters"),
        )
        .build()
        .install()
        .expect("the first runtime installed in this process");
    let storage = RedisStorage::<Job>::new(apalis_redis::connect(url).await.expect("connect"))
        .with_config(config());
    let worker = WorkerBuilder::new(format!("worker-{}", std::process::id()))
        .backend(storage)
        .concurrency(1)
        .layer(GuardLayer::new())
        .build(handle)
        .run()
        .await;
    // A worker woken from a stall may stop here (its heartbeat lapsed); its job's late write
    // still goes out before the process ends.
    tails_done().await;
    worker.expect("the worker runs until it is killed");
}

/// The handler: the idempotent job, then the point between the stored result and the ack. A
/// poisoned job's refusal is handed back as it is: `GuardLayer` settles the task (`Killed`), so
/// apalis does not deliver it again.
async fn handle(job: Job) -> Result<u64, BoxDynError> {
    let id = job.id;
    let n = effect(job).await?;
    crash_point("acked", id).await;
    Ok(n)
}

#[jobguard::idempotent(key = job.id, scope = "durable.effect", lease = "2s")]
async fn effect(job: Job) -> Result<u64, jobguard::Error> {
    let mut redis = redis();
    if let Some(delivery) = Delivery::current() {
        let _: () = redis
            .rpush(format!("deliveries:{}", job.id), delivery.number)
            .await
            .map_err(store)?;
    }
    crash_point("before", job.id).await;
    let _: () = redis
        .incr(format!("runs:{}", job.id), 1)
        .await
        .map_err(store)?;
    abort_point(job.id);
    // The stall and the write run in a task of their own, which the worker process waits for
    // before it exits: a worker woken from a stall may find its apalis worker gone (its
    // heartbeat lapsed) and its handler's future dropped, and the late write must still happen.
    let fence = jobguard::fence();
    TAILS.fetch_add(1, Ordering::SeqCst);
    let n = tokio::spawn(async move {
        let written = stall_then_write(job, fence).await;
        TAILS.fetch_sub(1, Ordering::SeqCst);
        TAIL_DONE.notify_waiters();
        written
    })
    .await
    .expect("the write's task")?;
    crash_point("effect", job.id).await;
    Ok(n)
}

/// The job's tail: the `stall` point, then the write to the downstream, counted in
/// `written:{id}`.
async fn stall_then_write(job: Job, fence: Option<u64>) -> Result<u64, jobguard::Error> {
    let mut redis = redis();
    stall_point(job.id).await;
    let n: u64 = match job.downstream {
        Downstream::Plain => redis
            .incr(format!("effect:{}", job.id), 1)
            .await
            .map_err(store)?,
        Downstream::Dedupe => redis::Script::new(
            "if redis.call('SET', KEYS[1], '1', 'NX') then \
                 return redis.call('INCR', KEYS[2]) \
             end \
             return tonumber(redis.call('GET', KEYS[2]))",
        )
        .key(format!("applied:{}", job.id))
        .key(format!("effect:{}", job.id))
        .invoke_async(&mut redis)
        .await
        .map_err(store)?,
        Downstream::Fenced => {
            let fence = fence.expect("RedisStore numbers its claims");
            let applied: i64 = redis::Script::new(
                "redis.call('RPUSH', KEYS[3], ARGV[1]) \
                 local seen = tonumber(redis.call('GET', KEYS[1]) or '0') \
                 if tonumber(ARGV[1]) < seen then \
                     redis.call('INCR', KEYS[4]) \
                     return -1 \
                 end \
                 redis.call('SET', KEYS[1], ARGV[1]) \
                 return redis.call('INCR', KEYS[2])",
            )
            .key(format!("fence:{}", job.id))
            .key(format!("effect:{}", job.id))
            .key(format!("fences:{}", job.id))
            .key(format!("refused:{}", job.id))
            .arg(fence)
            .invoke_async(&mut redis)
            .await
            .map_err(store)?;
            // Refused: a newer claim has written, so this worker's lease lapsed; it stops here.
            u64::try_from(applied).map_err(|_| jobguard::Error::LeaseLost)?
        }
    };
    let _: () = redis
        .incr(format!("written:{}", job.id), 1)
        .await
        .map_err(store)?;
    Ok(n)
}

/// Job tails ([`stall_then_write`]) running in this process.
static TAILS: AtomicUsize = AtomicUsize::new(0);
/// Woken when a tail ends.
static TAIL_DONE: Notify = Notify::const_new();

/// Waits until no job tail runs in this process.
async fn tails_done() {
    loop {
        let done = TAIL_DONE.notified();
        if TAILS.load(Ordering::SeqCst) == 0 {
            return;
        }
        done.await;
    }
}

fn store(e: redis::RedisError) -> jobguard::Error {
    jobguard::Error::Store(e.to_string())
}

/// At a `stall` crash point named for this job, the first worker to reach it announces itself,
/// is stopped by the harness, and goes on once `resume:{id}` is set.
async fn stall_point(id: u32) {
    let Some(mut redis) = hold_first("stall", id).await else {
        return;
    };
    // Polls for the test's word; the process is stopped in between, so most of the waiting is
    // not even this loop's. A GET in flight when the process was stopped can time out when it
    // resumes (the timer fires before the connection's reader hands over the reply): it is
    // asked again.
    loop {
        match redis.get::<_, Option<u32>>(format!("resume:{id}")).await {
            Ok(Some(_)) => break,
            Ok(None) => {}
            Err(e) if e.is_timeout() => {}
            Err(e) => panic!("GET resume: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many of job `id`'s writes the fenced downstream refused.
pub async fn refused(redis: &mut ConnectionManager, id: u32) -> u32 {
    count(redis, "refused", id).await
}

/// How many of job `id`'s runs got past the downstream write (applied or, for a plain one,
/// landed).
pub async fn written(redis: &mut ConnectionManager, id: u32) -> u32 {
    count(redis, "written", id).await
}

/// The fences of job `id`'s writes, in the order the fenced downstream received them.
pub async fn fences(redis: &mut ConnectionManager, id: u32) -> Vec<u64> {
    list(redis, "fences", id).await
}

/// At an `abort` crash point named for this job, the process aborts: no unwinding, no release,
/// no reply to the broker.
fn abort_point(id: u32) {
    let crashes = CRASHES.get().expect("crash points");
    if crashes.iter().any(|(p, i)| p == "abort" && *i == id) {
        std::process::abort();
    }
}

/// Whether job `id` stops at `point` in this process: it is one of the configured crash points,
/// and no process has stopped there before (`SET NX`). The first announces itself on
/// [`HOLDS`] for the harness and gets the connection it did that on.
async fn hold_first(point: &str, id: u32) -> Option<ConnectionManager> {
    let crashes = CRASHES.get().expect("crash points");
    if !crashes.iter().any(|(p, i)| p == point && *i == id) {
        return None;
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
        return None;
    }
    let _: () = redis
        .rpush(HOLDS, format!("{} {point} {id}", std::process::id()))
        .await
        .expect("announce the crash point");
    Some(redis)
}

/// At a crash point named for this job, the first worker to reach it announces itself and
/// stops, holding everything it holds, until the harness kills it.
async fn crash_point(point: &str, id: u32) {
    if hold_first(point, id).await.is_none() {
        return;
    }
    std::future::pending::<()>().await;
}
