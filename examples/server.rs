//! A web service that queues charge jobs on apalis and answers at once, while workers run them
//! against a flaky gateway: `order-A` times out twice then succeeds, `order-B` always times out.
//! The charge example (`examples/charge.rs`) tells the scenario in full.
//!
//! ```text
//! cargo run --example server                                  # 127.0.0.1:3000, all in this process
//! cargo run --example server -- --redis redis://127.0.0.1:6379/   # jobs to Redis, run by examples/worker.rs
//! cargo run --example server -- --redis URL --worker          # ... and by a worker in the server too
//! curl -X POST 'http://127.0.0.1:3000/charge/order-A?key=idem-1'
//! curl -X POST -H 'Idempotency-Key: idem-9' http://127.0.0.1:3000/charge/order-C   # a client's key
//! curl http://127.0.0.1:3000/state
//! curl http://127.0.0.1:3000/metrics         # jobguard_attempts_total, jobguard_dead_lettered_total, ...
//! open http://127.0.0.1:3000/jobguard/         # the operator console: dead letters, keys, breakers
//! curl http://127.0.0.1:3000/jobguard/api/dead-letters
//! ```
//!
//! - `POST /charge/{order_id}?key=K` pushes a charge job under the idempotency key `K` and
//!   answers at once: `{"idempotency_key":K,"order_id":...,"status":"queued"}`. A client may
//!   send the key as an `Idempotency-Key` header instead: `jobguard::http::IdempotencyLayer`
//!   then replays the first answer to every repeat (`Idempotent-Replayed: true`), answers `409`
//!   to a repeat while the first is in flight and `422` to the same key on another request.
//! - `GET /state` returns the state document: attempts, charges, retry delays, the idempotency
//!   store and the dead letters.
//! - `GET /metrics` returns jobguard's metrics for the jobs this process ran, in the Prometheus
//!   text format.
//! - `/jobguard/` is jobguard's operator console (`jobguard::console`): the dead letters, newest
//!   first, filtered, each redriven (pushed back onto the queue as a new charge job under its
//!   key) or deleted; a key's state, forgiven or forgotten; its JSON API under
//!   `/jobguard/api/`. **The console has no authentication of its own**: this example serves it
//!   read-write only when it listens on a loopback address, and read-only otherwise. A real
//!   service nests it behind its own authentication layer (which also names the operator for
//!   the audit trail, with a `jobguard::console::Actor` extension).
//!
//! Without flags, the jobs go to apalis's in-memory storage and an apalis worker in this process
//! runs them, with jobguard's embedded stores: nothing survives a restart. With `--redis URL`,
//! the jobs go to apalis's Redis storage, claims to `RedisStore` and dead letters to a Redis
//! stream, and the workers are other processes (`cargo run --example worker -- --redis URL`),
//! on this machine or others: a worker killed mid-job has its job re-enqueued by the broker and
//! finished by another, once. Each job is pushed for [`DELIVERIES`] deliveries: one that keeps
//! failing is handed back to the queue after each delivery's five attempts and dead-lettered
//! once, on the last. The gateway keeps its journal (attempts, charges, delays, dead letters)
//! in Redis then, so that this server's `GET /state` shows what every worker did.
//!
//! The service owns a Prometheus recorder for jobguard's metrics, which is the worker's local
//! recorder while it polls a job, so several services in one process (tests) each count only
//! their own jobs. A production service installs one recorder for the process with
//! `metrics::set_global_recorder` instead.

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use axum::Json;
use axum::extract::{Path, Query, State as Shared};
use axum::http::header::{CONTENT_TYPE, HeaderName};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use futures::SinkExt;
use jobguard::apalis::GuardLayer;
use jobguard::console::Console;
use jobguard::dead_letter::Browse;
use jobguard::http::IdempotencyLayer;
use jobguard::{Event, MemoryDeadLetters, MemoryStore, RedisDeadLetters, RedisStore, Runtime};
use jobguard::{Store, StoreKey, Transient};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The apalis queue the server pushes to and the workers take from.
pub const QUEUE: &str = "payments.charge";
/// The Redis stream of dead letters.
pub const DEAD_LETTERS: &str = "jobguard:dead_letters:charge";
/// How many times the broker delivers a charge that keeps failing, each delivery with
/// `#[retry]`'s five attempts: the server pushes every job to Redis with this `max_attempts`,
/// and the workers' `GuardLayer` reads it from the task. (apalis's in-memory storage delivers
/// a task once: its jobs carry no limit, and their first delivery is the last.)
pub const DELIVERIES: usize = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut addr, mut redis, mut worker) = ("127.0.0.1:3000".to_owned(), None, false);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => redis = Some(args.next().ok_or("--redis needs a URL")?),
            "--worker" => worker = true,
            _ => addr = arg,
        }
    }
    let service = match redis {
        None => Service::start(MemoryStore::new(), MemoryDeadLetters::new()),
        Some(url) => Service::start_redis(&url, worker).await?,
    };
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    // The console acts (redrive, delete, forgive) only for a loopback listener: it has no
    // authentication of its own. Anywhere else it is read-only here; put it behind your own
    // authentication layer before you make it read-write.
    let read_only = !local.ip().is_loopback();
    if read_only {
        println!("the console at /jobguard/ is read-only: {local} is not a loopback address");
    }
    axum::serve(listener, app(service, read_only)).await?;
    Ok(())
}

/// The routes: `POST /charge/{order_id}` (`?key=K` or an `Idempotency-Key` header),
/// `GET /state`, `GET /metrics`.
///
/// `IdempotencyLayer` guards the POST: a client that repeats a request with the same
/// `Idempotency-Key` gets the first answer replayed (`Idempotent-Replayed: true`) and queues no
/// second job; a repeat while the first is being answered is `409`, the same key with another
/// request `422`. Requests without the header (`?key=K`, as a queue's producer sends them) pass
/// through; the job itself is idempotent under its key either way.
pub fn router(service: Service) -> axum::Router {
    app(service, false)
}

/// [`router`], with the console read-only or not.
pub fn app(service: Service, console_read_only: bool) -> axum::Router {
    let requests = IdempotencyLayer::new(service.store.clone()).required(false);
    let console = console(&service).read_only(console_read_only);
    axum::Router::new()
        .route("/charge/{order_id}", post(charge_route))
        .route("/state", get(state_route))
        .route("/metrics", get(metrics_route))
        .with_state(service)
        .layer(requests)
        .nest("/jobguard", console.router())
}

/// The operator console over the service's dead letters and idempotency store. A charge's
/// letter is redriven by pushing the charge back onto the queue under its key, from the
/// letter's payload (`#[retry(payload = (order_id, amount))]`): a worker runs it again.
pub fn console(service: &Service) -> Console {
    let queue = service.clone();
    Console::new()
        .dead_letters(service.letters.clone())
        .store(service.store.clone())
        .redrive("payments.charge", move |letter: jobguard::DeadLetter| {
            let queue = queue.clone();
            async move {
                let (order_id, _amount): (String, u64) =
                    letter.payload_as().ok_or_else(|| {
                        jobguard::Error::Corrupt("a letter without its payload".into())
                    })??;
                let key = letter
                    .key
                    .ok_or_else(|| jobguard::Error::Corrupt("a letter without its key".into()))?;
                queue
                    .push(&order_id, &key)
                    .await
                    .map_err(jobguard::Error::Store)
            }
        })
}

#[derive(Deserialize)]
struct KeyParam {
    key: Option<String>,
}

async fn charge_route(
    Shared(service): Shared<Service>,
    Path(order_id): Path<String>,
    Query(q): Query<KeyParam>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, (StatusCode, Json<serde_json::Value>)> {
    // The job's key: `?key=K`, else the request's `Idempotency-Key` (a bare token or a
    // structured-field string, which the layer has already checked).
    let header = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().trim_matches('"').to_owned());
    let Some(key) = q.key.or(header) else {
        let problem = serde_json::json!({
            "title": "no idempotency key",
            "detail": "send the charge's key as ?key=K or in an Idempotency-Key header",
        });
        return Err((StatusCode::BAD_REQUEST, Json(problem)));
    };
    service.enqueue(&order_id, &key).await;
    Ok(Json(
        serde_json::json!({"order_id": order_id, "idempotency_key": key, "status": "queued"}),
    ))
}

async fn state_route(Shared(service): Shared<Service>) -> Json<State> {
    Json(service.state().await)
}

async fn metrics_route(
    Shared(service): Shared<Service>,
) -> ([(HeaderName, &'static str); 1], String) {
    let rendered = service.recorder.handle().render();
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], rendered)
}

/// What the queue carries: one charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeJob {
    pub order_id: String,
    pub key: String,
    pub amount: u64,
}

/// The job: idempotency outside, retry inside. The lease is short so that the job of a worker
/// killed mid-charge is taken over within seconds.
#[jobguard::idempotent(key = key, scope = "payments.charge", lease = "5s")]
#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = none, on = transient, payload = (order_id, amount))]
pub async fn charge(
    gateway: &Gateway,
    order_id: &str,
    amount: u64,
    key: &str,
) -> Result<Receipt, GatewayError> {
    gateway.capture(order_id, amount).await
}

/// The apalis handler: runs [`charge`] under the service's runtime and metrics recorder, and
/// returns its error to the broker.
///
/// On a delivery that is not the last, `#[retry]` ran out of attempts without writing a dead
/// letter, and the broker delivers the job again. On the last delivery it wrote the job's one
/// letter, and `GuardLayer` tells the broker not to deliver it again. jobguard's own failures
/// (the key in progress on a worker that died, the store out of reach) are delivered again too.
async fn handle(job: ChargeJob, service: Data<Service>) -> Result<Receipt, GatewayError> {
    service.remember(&job.key, &job.order_id);
    let charging = charge(&service.gateway, &job.order_id, job.amount, &job.key);
    let result = recorded(&service.recorder, service.runtime.scope(charging)).await;
    service.done.send_modify(|done| *done += 1);
    result
}

/// What the gateway returns for a captured payment; stored by `#[idempotent]` and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub order_id: String,
    pub attempts_used: u32,
}

/// The gateway's failures. `#[derive(Transient)]` gives `on = transient` its verdicts.
#[derive(Debug, Transient)]
pub enum GatewayError {
    /// The gateway did not answer in time: worth another attempt.
    #[transient]
    Timeout { order_id: String, attempt: u32 },
    /// jobguard's own failure (store, lease, ...), with its own verdict.
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout { order_id, attempt } => {
                write!(f, "gateway timeout on {order_id} (attempt {attempt})")
            }
            GatewayError::Jobguard(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for GatewayError {}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

/// The state document that `GET /state` returns.
#[derive(Debug, Clone, Default, Serialize)]
pub struct State {
    /// Every attempt and every skipped delivery, in order.
    pub attempts: Vec<String>,
    /// Orders actually charged.
    pub charges: Vec<String>,
    /// Every retry delay, in seconds.
    pub backoff_delays: Vec<f64>,
    /// Completed idempotency keys and their stored receipts.
    pub idempotency_store: BTreeMap<String, Receipt>,
    /// One line per dead letter.
    pub dead_letter: Vec<String>,
}

/// One line of the gateway's journal.
enum Entry {
    Attempt(String),
    Charge(String),
    Delay(f64),
    DeadLetter(String),
}

/// Where the gateway keeps its journal and its count of tries per order: in this process, or in
/// Redis where every worker process writes it.
#[derive(Clone)]
enum Journal {
    Memory {
        state: Arc<Mutex<State>>,
        tries: Arc<Mutex<BTreeMap<String, u32>>>,
    },
    /// Lines go through one writer task, so they land in the order they were written.
    Redis {
        conn: ConnectionManager,
        lines: mpsc::UnboundedSender<Entry>,
    },
}

impl Journal {
    fn memory() -> Journal {
        Journal::Memory {
            state: Arc::default(),
            tries: Arc::default(),
        }
    }

    fn redis(conn: ConnectionManager) -> Journal {
        let (lines, mut pending) = mpsc::unbounded_channel::<Entry>();
        let mut writer = conn.clone();
        tokio::spawn(async move {
            while let Some(entry) = pending.recv().await {
                let (list, line) = match entry {
                    Entry::Attempt(line) => ("demo:attempts", line),
                    Entry::Charge(order) => ("demo:charges", order),
                    Entry::Delay(secs) => ("demo:delays", secs.to_string()),
                    Entry::DeadLetter(line) => ("demo:dead_letters", line),
                };
                if let Err(e) = writer.rpush::<_, _, ()>(list, &line).await {
                    eprintln!("journal line lost ({e}): {line}");
                }
            }
        });
        Journal::Redis { conn, lines }
    }

    fn record(&self, entry: Entry) {
        match self {
            Journal::Memory { state, .. } => {
                let mut state = state.lock().unwrap();
                match entry {
                    Entry::Attempt(line) => state.attempts.push(line),
                    Entry::Charge(order) => state.charges.push(order),
                    Entry::Delay(secs) => state.backoff_delays.push(secs),
                    Entry::DeadLetter(line) => state.dead_letter.push(line),
                }
            }
            Journal::Redis { lines, .. } => {
                let _ = lines.send(entry);
            }
        }
    }

    /// Counts one more try of `order_id` and returns it.
    async fn next_try(&self, order_id: &str) -> Result<u32, GatewayError> {
        match self {
            Journal::Memory { tries, .. } => {
                let mut tries = tries.lock().unwrap();
                let n = tries.entry(order_id.to_owned()).or_default();
                *n += 1;
                Ok(*n)
            }
            Journal::Redis { conn, .. } => conn
                .clone()
                .incr(format!("demo:tries:{order_id}"), 1)
                .await
                .map_err(|e| jobguard::Error::Store(e.to_string()).into()),
        }
    }

    /// The journal's part of the state document.
    async fn read(&self) -> State {
        match self {
            Journal::Memory { state, .. } => state.lock().unwrap().clone(),
            Journal::Redis { conn, .. } => {
                let mut conn = conn.clone();
                let mut list = async |key: &str| -> Vec<String> {
                    conn.lrange(key, 0, -1).await.unwrap_or_default()
                };
                State {
                    attempts: list("demo:attempts").await,
                    charges: list("demo:charges").await,
                    backoff_delays: list("demo:delays")
                        .await
                        .iter()
                        .filter_map(|d| d.parse().ok())
                        .collect(),
                    idempotency_store: BTreeMap::new(),
                    dead_letter: list("demo:dead_letters").await,
                }
            }
        }
    }
}

/// A simulated gateway: `order-A` times out twice then succeeds; any other order always times
/// out. It counts tries per order in its journal, so the count holds across worker processes.
pub struct Gateway {
    journal: Journal,
}

impl Gateway {
    /// Captures a payment, or times out.
    pub async fn capture(&self, order_id: &str, _amount: u64) -> Result<Receipt, GatewayError> {
        let attempt = self.journal.next_try(order_id).await?;
        let line = format!("{order_id} attempt {attempt}");
        println!("  {line}");
        self.journal.record(Entry::Attempt(line));
        if order_id != "order-A" || attempt < 3 {
            return Err(GatewayError::Timeout {
                order_id: order_id.to_owned(),
                attempt,
            });
        }
        self.journal.record(Entry::Charge(order_id.to_owned()));
        Ok(Receipt {
            order_id: order_id.to_owned(),
            attempts_used: attempt,
        })
    }
}

/// Where the service pushes its jobs.
#[derive(Clone)]
enum Queue {
    Memory(MemorySink<ChargeJob>),
    Redis(Box<RedisStorage<ChargeJob>>),
}

/// The service: a queue on apalis, the state the workers leave, and the metrics this process's
/// worker records.
#[derive(Clone)]
pub struct Service {
    gateway: Arc<Gateway>,
    runtime: Runtime,
    store: Arc<dyn Store>,
    /// The dead letters, for the console.
    letters: Arc<dyn Browse>,
    queue: Queue,
    /// Idempotency key to order id, for every job queued or run here.
    orders: Arc<Mutex<BTreeMap<String, String>>>,
    /// How many jobs this process's worker has finished.
    done: Arc<watch::Sender<usize>>,
    recorder: Arc<PrometheusRecorder>,
}

impl Service {
    /// The embedded service: jobs on apalis's in-memory storage, run by an apalis worker on the
    /// current tokio runtime. Jobs use `store` and send their dead letters to `dead_letters`.
    pub fn start<S: Store + Clone + 'static>(
        store: S,
        dead_letters: impl jobguard::DeadLetterSink + Browse + Clone + 'static,
    ) -> Service {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<Task<ChargeJob>>();
        let sink: Box<
            dyn futures::Sink<Task<ChargeJob>, Error = MemoryStorageError> + Send + Sync + Unpin,
        > = Box::new(sender.sink_map_err(MemoryStorageError::from));
        let sink = MemorySink::new(Arc::new(futures::lock::Mutex::new(sink)));
        let storage = MemoryStorage::new_with(sink.clone(), Box::pin(receiver));
        let service = Service::new(store, dead_letters, Journal::memory(), Queue::Memory(sink));
        let worker = WorkerBuilder::new("server")
            .backend(storage)
            .data(service.clone())
            .concurrency(1)
            .layer(GuardLayer::new())
            .build(handle);
        tokio::spawn(worker.run());
        service
    }

    /// The service on Redis: jobs on apalis's Redis storage at `url`, claims in `RedisStore`,
    /// dead letters in a Redis stream. With `worker`, an apalis worker runs jobs in this process
    /// too.
    pub async fn start_redis(
        url: &str,
        worker: bool,
    ) -> Result<Service, Box<dyn std::error::Error>> {
        let conn = apalis_redis::connect(url).await?;
        let storage = RedisStorage::<ChargeJob>::new(conn.clone()).with_config(redis_config());
        let service = Service::new(
            RedisStore::connect(url).await?,
            RedisDeadLetters::connect(url, DEAD_LETTERS).await?,
            Journal::redis(conn),
            Queue::Redis(Box::new(storage.clone())),
        );
        if worker {
            let worker = WorkerBuilder::new(format!("server-{}", std::process::id()))
                .backend(storage)
                .data(service.clone())
                .concurrency(1)
                .layer(GuardLayer::new())
                .build(handle);
            tokio::spawn(worker.run());
        }
        Ok(service)
    }

    fn new<S: Store + Clone + 'static>(
        store: S,
        dead_letters: impl jobguard::DeadLetterSink + Browse + Clone + 'static,
        journal: Journal,
        queue: Queue,
    ) -> Service {
        let letters: Arc<dyn Browse> = Arc::new(dead_letters.clone());
        let orders: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let (lines, seen) = (journal.clone(), orders.clone());
        let order_of = move |key: &str| seen.lock().unwrap().get(key).cloned().unwrap_or_default();
        let runtime = Runtime::builder()
            .store(store.clone())
            .dead_letters(dead_letters)
            .observer(move |event: &Event<'_>| match event {
                Event::Retry { delay, key, .. } => {
                    let order = order_of(key.unwrap_or_default());
                    println!("    retrying {order} in {:.1}s", delay.as_secs_f64());
                    lines.record(Entry::Delay(delay.as_secs_f64()));
                }
                Event::Replayed { key, .. } => {
                    let order = order_of(key);
                    let line = format!("{order} skipped: idempotency key {key} already processed");
                    println!("  {line}");
                    lines.record(Entry::Attempt(line));
                }
                Event::DeadLetter(letter) => {
                    let key = letter.key.clone().unwrap_or_default();
                    let line = format!("{} key={key} gave up: {}", order_of(&key), letter.error);
                    println!("  dead letter: {line}");
                    lines.record(Entry::DeadLetter(line));
                }
                Event::HandedBack {
                    key: Some(key),
                    attempts,
                    delivery,
                    ..
                } => {
                    let order = order_of(key);
                    let n = delivery.number;
                    println!("  {order} handed back to the queue after {attempts} attempts (delivery {n})");
                }
                _ => {}
            })
            .build();
        let recorder = PrometheusBuilder::new().build_recorder();
        #[cfg(feature = "metrics")]
        metrics::with_local_recorder(&recorder, jobguard::observe::metrics::describe);
        Service {
            gateway: Arc::new(Gateway { journal }),
            runtime,
            store: Arc::new(store),
            letters,
            queue,
            orders,
            done: Arc::new(watch::channel(0).0),
            recorder: Arc::new(recorder),
        }
    }

    fn remember(&self, key: &str, order_id: &str) {
        self.orders
            .lock()
            .unwrap()
            .insert(key.to_owned(), order_id.to_owned());
    }

    /// Pushes a charge of 100 to the queue and returns.
    pub async fn enqueue(&self, order_id: &str, key: &str) {
        if let Err(e) = self.push(order_id, key).await {
            eprintln!("charge of {order_id} not queued: {e}");
        }
    }

    /// Pushes a charge of 100 to the queue, or says why it was not.
    async fn push(&self, order_id: &str, key: &str) -> Result<(), String> {
        self.remember(key, order_id);
        let job = ChargeJob {
            order_id: order_id.to_owned(),
            key: key.to_owned(),
            amount: 100,
        };
        match self.queue.clone() {
            Queue::Memory(mut sink) => sink.send(Task::new(job)).await.map_err(|e| e.to_string()),
            Queue::Redis(mut storage) => {
                let task = TaskBuilder::new(job).max_attempts(DELIVERIES).build();
                storage.push_task(task).await.map_err(|e| e.to_string())
            }
        }
    }

    /// Waits until this process's worker has finished `n` jobs in all.
    pub async fn finished(&self, n: usize) {
        let _ = self.done.subscribe().wait_for(|done| *done >= n).await;
    }

    /// The state document, with the idempotency store read back from the store itself.
    pub async fn state(&self) -> State {
        let mut state = self.gateway.journal.read().await;
        let keys: Vec<String> = self.orders.lock().unwrap().keys().cloned().collect();
        for key in keys {
            if let Some(receipt) = completed(&*self.store, &key).await {
                state.idempotency_store.insert(key, receipt);
            }
        }
        state
    }
}

/// apalis-redis's settings, as every worker has them (`examples/worker.rs`): a worker whose
/// heartbeat stops for 10 s is dead, and its jobs go back on the queue.
pub fn redis_config() -> apalis_redis::Config {
    apalis_redis::Config::default()
        .queue(QUEUE)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(10)
}

/// Runs `fut` with `recorder` as the local recorder of whichever thread polls it, so the
/// metrics its events record land in `recorder` on a multi-threaded runtime too.
async fn recorded<F: Future>(recorder: &PrometheusRecorder, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| metrics::with_local_recorder(recorder, || fut.as_mut().poll(cx)))
        .await
}

/// The stored receipt for `key`, read without disturbing it: `Store::lookup` claims nothing,
/// so a delivery of the same key at the same moment is never refused because of this read.
async fn completed(store: &dyn Store, key: &str) -> Option<Receipt> {
    #[derive(Deserialize)]
    struct Record {
        ok: Receipt,
    }
    let key = StoreKey {
        scope: "payments.charge",
        key,
    };
    let bytes = store.lookup(key).await.ok()??;
    serde_json::from_slice::<Record>(&bytes).ok().map(|r| r.ok)
}
