//! Worker processes for the fleet tests, and the harness that drives them.
//!
//! Two `redis-server`s per test: the *fleet's* Redis, through which the workers share their
//! breaker and retry budget (and which a test may kill), and the *gateway*, the dependency the
//! workers' jobs call: a Redis whose one script decides, as the test sets its `mode`, whether a
//! call fails (`down`: every call; `first`: a job's first call; `up`: none), and counts every
//! call and failure. The gateway also carries the test's commands to the workers and their
//! replies, so a worker stays reachable while the fleet's Redis is down.
//!
//! Each test binary runs itself as a worker (its `worker` test, see [`worker_if_asked`]): a
//! worker shares what the test asks ([`SHARE_ENV`]), then runs the commands it pops from its
//! list `cmd:<id>` on the gateway and pushes each reply on `reply:<id>`:
//!
//! - `breaker FROM N`: runs jobs `FROM..FROM+N` one after another through the breaker, each until
//!   it succeeds; a job the breaker refuses waits the refusal's `retry_in` (at least 20 ms) and
//!   runs again, as a broker would deliver it again. Replies `done`.
//! - `budget FROM N`: runs jobs `FROM..FROM+N` once each under the retry budget. Replies
//!   `done OK GAVE_UP` (gave up: the budget refused the retry).
//! - `calls N`: makes N calls through the breaker, once each. Replies `done STATE`, with the
//!   breaker's state after them.
//! - `state`: replies the breaker's state. `events`: replies the `Shared` events seen, as
//!   `KIND:SHARED` (`breaker:false`, `retry_budget:true`...), space-separated. Anything else:
//!   the worker exits.

#![allow(dead_code)]

use jobguard::{CircuitBreaker, Event, RedisStore, RetryBudget, Runtime};
use jobguard_testkit::gateway::GatewayError;
use jobguard_testkit::redis::{RedisServer, rerun_test};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use std::process::{Child, Stdio};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Set to the fleet's Redis URL, it makes the test binary's `worker` test run a worker.
pub const WORKER_ENV: &str = "JOBGUARD_FLEET_WORKER";
/// The gateway's URL.
pub const GATEWAY_ENV: &str = "JOBGUARD_FLEET_GATEWAY";
/// The worker's id.
pub const ID_ENV: &str = "JOBGUARD_FLEET_ID";
/// What the worker shares: `breaker`, `budget`, both (`breaker,budget`) or nothing.
pub const SHARE_ENV: &str = "JOBGUARD_FLEET_SHARE";

/// The breaker every worker puts in front of the gateway: open after 5 failures in a row, for
/// 300 ms.
pub const THRESHOLD: u64 = 5;
pub const COOLDOWN: Duration = Duration::from_millis(300);
pub static BREAKER: CircuitBreaker =
    CircuitBreaker::new(THRESHOLD as u32, COOLDOWN).named("gateway");

/// The retry budget: one retry per ten calls, plus one a second over 10 s.
pub const RATIO: f64 = 0.1;
const PER_SECOND: u32 = 1;
const WINDOW: Duration = Duration::from_secs(10);
pub const FLOOR: u64 = PER_SECOND as u64 * WINDOW.as_secs();
pub static BUDGET: RetryBudget = RetryBudget::new(RATIO as f32, PER_SECOND, WINDOW);

/// The gateway's one script: counts the call, and fails it as `mode` says.
const CALL: &str = r#"
redis.call('INCR', 'calls')
local mode = redis.call('GET', 'mode') or 'down'
local fail = mode == 'down' or (mode == 'first' and redis.call('INCR', 'try:' .. ARGV[1]) == 1)
if fail then redis.call('INCR', 'failures') return 0 end
return 1
"#;

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CALL));

async fn call_gateway(gateway: &ConnectionManager, id: u32) -> Result<(), GatewayError> {
    let ok: i64 = SCRIPT
        .arg(id)
        .invoke_async(&mut gateway.clone())
        .await
        .expect("the gateway answers");
    if ok == 1 {
        Ok(())
    } else {
        Err(GatewayError::Timeout)
    }
}

#[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms", jitter = none, breaker = BREAKER)]
async fn charge(gateway: &ConnectionManager, id: u32) -> Result<(), GatewayError> {
    call_gateway(gateway, id).await
}

#[jobguard::retry(attempts = 2, base = "1ms", jitter = none, retry_budget = BUDGET)]
async fn refund(gateway: &ConnectionManager, id: u32) -> Result<(), GatewayError> {
    call_gateway(gateway, id).await
}

/// Runs a worker when this process was started as one; returns at once otherwise.
pub fn worker_if_asked() {
    let Ok(fleet) = std::env::var(WORKER_ENV) else {
        return;
    };
    let gateway = std::env::var(GATEWAY_ENV).expect("the gateway's URL");
    let id = std::env::var(ID_ENV).expect("the worker's id");
    let share = std::env::var(SHARE_ENV).unwrap_or_default();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(work(&fleet, &gateway, &id, &share));
}

async fn work(fleet: &str, gateway: &str, id: &str, share: &str) {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let events = seen.clone();
    let runtime = Runtime::builder()
        .dead_letters(jobguard::MemoryDeadLetters::new())
        .observer(move |event: &Event<'_>| {
            if let Event::Shared { kind, shared, .. } = event {
                events.lock().unwrap().push(format!("{kind}:{shared}"));
            }
        })
        .build();
    let _ = runtime.install();
    let store = RedisStore::connect(fleet).await.expect("the fleet's Redis");
    if share.contains("breaker") {
        BREAKER
            .share(&store, "gateway")
            .await
            .expect("share the breaker");
    }
    if share.contains("budget") {
        BUDGET
            .share(&store, "gateway")
            .await
            .expect("share the budget");
    }
    let gateway = connect(gateway).await;
    let mut commands = gateway.clone();
    let mut replies = gateway.clone();
    let _: () = replies
        .rpush(format!("reply:{id}"), "ready")
        .await
        .expect("say ready");
    loop {
        let (_, command): (String, String) = commands
            .blpop(format!("cmd:{id}"), 0.0)
            .await
            .expect("a command");
        let words: Vec<&str> = command.split(' ').collect();
        let number = |i: usize| {
            words
                .get(i)
                .and_then(|w| w.parse::<u32>().ok())
                .unwrap_or(0)
        };
        let reply = match words[0] {
            "breaker" => {
                for job in number(1)..number(1) + number(2) {
                    loop {
                        match charge(&gateway, job).await {
                            Ok(()) => break,
                            Err(GatewayError::Jobguard(jobguard::Error::CircuitOpen {
                                retry_in,
                            })) => {
                                tokio::time::sleep(retry_in.max(Duration::from_millis(20))).await
                            }
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                }
                "done".to_owned()
            }
            "budget" => {
                let (mut ok, mut gave_up) = (0, 0);
                for job in number(1)..number(1) + number(2) {
                    match refund(&gateway, job).await {
                        Ok(()) => ok += 1,
                        Err(_) => gave_up += 1,
                    }
                }
                format!("done {ok} {gave_up}")
            }
            "calls" => {
                for job in 0..number(1) {
                    let _ = charge(&gateway, job).await;
                }
                format!("done {}", BREAKER.state())
            }
            "state" => BREAKER.state().to_string(),
            "events" => seen.lock().unwrap().join(" "),
            _ => return,
        };
        let _: () = replies
            .rpush(format!("reply:{id}"), reply)
            .await
            .expect("reply");
    }
}

/// A connection with no response timeout, for the blocking pops of commands and replies.
pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("a Redis URL");
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    ConnectionManager::new_with_config(client, config)
        .await
        .expect("connect")
}

/// Whether the last `Shared` event of `kind` in a worker's `events` reply says `shared`.
pub fn last_shared(events: &str, kind: &str, shared: bool) -> bool {
    events
        .rsplit(' ')
        .find(|e| e.starts_with(&format!("{kind}:")))
        == Some(&format!("{kind}:{shared}"))
}

/// The worker processes of one test and its two servers, killed when dropped.
pub struct Fleet {
    /// The fleet's Redis, which a test may stop and restart.
    pub redis: RedisServer,
    gateway: ConnectionManager,
    children: Vec<Child>,
    _gateway_server: RedisServer,
}

impl Fleet {
    /// Starts the fleet's Redis, the gateway and `n` workers (ids `0..n`) sharing `share`, and
    /// waits until each worker is ready; `None` (the test skips) without `redis-server`.
    pub async fn start(n: usize, share: &str) -> Option<Fleet> {
        let (Some(redis), Some(gateway_server)) = (RedisServer::start(), RedisServer::start())
        else {
            return None;
        };
        let gateway = connect(&gateway_server.url()).await;
        let children = (0..n)
            .map(|id| {
                rerun_test("worker")
                    .env(WORKER_ENV, redis.url())
                    .env(GATEWAY_ENV, gateway_server.url())
                    .env(ID_ENV, id.to_string())
                    .env(SHARE_ENV, share)
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("start a worker")
            })
            .collect();
        let mut fleet = Fleet {
            redis,
            gateway,
            children,
            _gateway_server: gateway_server,
        };
        for id in 0..n {
            assert_eq!(fleet.reply(id).await, "ready");
        }
        Some(fleet)
    }

    /// Sends `command` to worker `id`.
    pub async fn send(&mut self, id: usize, command: &str) {
        let _: () = self
            .gateway
            .rpush(format!("cmd:{id}"), command)
            .await
            .expect("send a command");
    }

    /// Worker `id`'s next reply (within 60 s).
    pub async fn reply(&mut self, id: usize) -> String {
        let popped: Option<(String, String)> = self
            .gateway
            .blpop(format!("reply:{id}"), 60.0)
            .await
            .expect("read a reply");
        popped
            .unwrap_or_else(|| panic!("worker {id} did not answer within 60 s"))
            .1
    }

    /// Sends `command` to worker `id` and returns its reply.
    pub async fn ask(&mut self, id: usize, command: &str) -> String {
        self.send(id, command).await;
        self.reply(id).await
    }

    /// Asks worker `id` with `command` until `done` holds for its reply, within `within`.
    pub async fn ask_until(
        &mut self,
        id: usize,
        command: &str,
        within: Duration,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let reply = self.ask(id, command).await;
            if done(&reply) {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "worker {id}: `{command}` still answers {reply:?} after {within:?}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Sets the gateway's mode: `down`, `first` or `up`.
    pub async fn gateway(&mut self, mode: &str) {
        let _: () = self.gateway.set("mode", mode).await.expect("set the mode");
    }

    /// The gateway's count of `calls` or `failures`.
    pub async fn count(&mut self, what: &str) -> u64 {
        let n: Option<u64> = self.gateway.get(what).await.expect("read a count");
        n.unwrap_or(0)
    }

    /// Waits until the gateway's `what` reaches `at_least`, within `within`.
    pub async fn wait_for_count(&mut self, what: &str, at_least: u64, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let n = self.count(what).await;
            if n >= at_least {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "the gateway's {what} is {n}, not {at_least}, after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
