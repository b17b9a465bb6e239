//! A web service that queues charge jobs and runs them in the background, against a flaky
//! gateway: `order-A` times out twice then succeeds, `order-B` always times out. The charge
//! example (`examples/charge.rs`) tells the scenario in full.
//!
//! ```text
//! cargo run --example server                 # listens on 127.0.0.1:3000
//! curl -X POST 'http://127.0.0.1:3000/charge/order-A?key=idem-1'
//! curl http://127.0.0.1:3000/state
//! curl http://127.0.0.1:3000/metrics         # jobguard_attempts_total, jobguard_dead_lettered_total, ...
//! ```
//!
//! - `POST /charge/{order_id}?key=K` queues a charge under the idempotency key `K` and answers
//!   at once: `{"idempotency_key":K,"order_id":...,"status":"queued"}`.
//! - `GET /state` returns the state document: attempts, charges, retry delays, the idempotency
//!   store and the dead letters.
//! - `GET /metrics` returns jobguard's metrics in the Prometheus text format.
//!
//! The service owns a Prometheus recorder for jobguard's metrics, which is the worker's local
//! recorder while it polls a job, so several services in one process (tests) each count only
//! their own jobs. A production service installs one recorder for the process with
//! `metrics::set_global_recorder` instead.

use axum::Json;
use axum::extract::{Path, Query, State as Shared};
use axum::http::header::{CONTENT_TYPE, HeaderName};
use axum::routing::{get, post};
use jobguard::{Event, MemoryDeadLetters, MemoryStore, Runtime, Store, StoreKey, Transient};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let service = Service::start(MemoryStore::new(), MemoryDeadLetters::new());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(service)).await?;
    Ok(())
}

/// The routes: `POST /charge/{order_id}?key=K`, `GET /state`, `GET /metrics`.
pub fn router(service: Service) -> axum::Router {
    axum::Router::new()
        .route("/charge/{order_id}", post(charge_route))
        .route("/state", get(state_route))
        .route("/metrics", get(metrics_route))
        .with_state(service)
}

#[derive(Deserialize)]
struct KeyParam {
    key: String,
}

async fn charge_route(
    Shared(service): Shared<Service>,
    Path(order_id): Path<String>,
    Query(q): Query<KeyParam>,
) -> Json<serde_json::Value> {
    service.enqueue(&order_id, &q.key);
    Json(serde_json::json!({"order_id": order_id, "idempotency_key": q.key, "status": "queued"}))
}

async fn state_route(Shared(service): Shared<Service>) -> Json<State> {
    Json(service.state().await)
}

async fn metrics_route(
    Shared(service): Shared<Service>,
) -> ([(HeaderName, &'static str); 1], String) {
    let rendered = service.metrics.render();
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], rendered)
}

/// The job: idempotency outside, retry inside.
#[jobguard::idempotent(key = key, scope = "payments.charge")]
#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", jitter = none, on = transient)]
pub async fn charge(
    gateway: &Gateway,
    order_id: &str,
    amount: u64,
    key: &str,
) -> Result<Receipt, GatewayError> {
    gateway.capture(order_id, amount).await
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

/// A simulated gateway: `order-A` times out twice then succeeds; any other order always times
/// out.
#[derive(Default)]
pub struct Gateway {
    state: Arc<Mutex<State>>,
    tries: Mutex<BTreeMap<String, u32>>,
}

impl Gateway {
    /// Captures a payment, or times out.
    pub async fn capture(&self, order_id: &str, _amount: u64) -> Result<Receipt, GatewayError> {
        let attempt = {
            let mut tries = self.tries.lock().unwrap();
            let n = tries.entry(order_id.to_owned()).or_default();
            *n += 1;
            *n
        };
        let line = format!("{order_id} attempt {attempt}");
        println!("  {line}");
        self.state.lock().unwrap().attempts.push(line);
        if order_id != "order-A" || attempt < 3 {
            return Err(GatewayError::Timeout {
                order_id: order_id.to_owned(),
                attempt,
            });
        }
        self.state.lock().unwrap().charges.push(order_id.to_owned());
        Ok(Receipt {
            order_id: order_id.to_owned(),
            attempts_used: attempt,
        })
    }
}

/// The service: a queue, one background worker running [`charge`], the state it leaves and the
/// metrics it records.
#[derive(Clone)]
pub struct Service {
    gateway: Arc<Gateway>,
    runtime: Runtime,
    store: Arc<dyn Store>,
    /// Idempotency key to order id, for every job queued.
    orders: Arc<Mutex<BTreeMap<String, String>>>,
    queue: mpsc::UnboundedSender<(String, String)>,
    /// How many jobs have finished.
    done: Arc<watch::Sender<usize>>,
    metrics: PrometheusHandle,
}

impl Service {
    /// Starts the worker on the current tokio runtime. Jobs use `store` and send their dead
    /// letters to `dead_letters`; an observer writes retries, replays and dead letters into the
    /// state document as they happen.
    pub fn start<S: Store + Clone + 'static>(
        store: S,
        dead_letters: impl jobguard::DeadLetterSink + 'static,
    ) -> Service {
        let gateway = Arc::new(Gateway::default());
        let orders: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let (state, seen) = (gateway.state.clone(), orders.clone());
        let order_of = move |key: &str| seen.lock().unwrap().get(key).cloned().unwrap_or_default();
        let runtime = Runtime::builder()
            .store(store.clone())
            .dead_letters(dead_letters)
            .observer(move |event: &Event<'_>| match event {
                Event::Retry { delay, key, .. } => {
                    let order = order_of(key.unwrap_or_default());
                    println!("    retrying {order} in {:.1}s", delay.as_secs_f64());
                    let delay = delay.as_secs_f64();
                    state.lock().unwrap().backoff_delays.push(delay);
                }
                Event::Replayed { key, .. } => {
                    let order = order_of(key);
                    let line = format!("{order} skipped: idempotency key {key} already processed");
                    println!("  {line}");
                    state.lock().unwrap().attempts.push(line);
                }
                Event::DeadLetter(letter) => {
                    let key = letter.key.clone().unwrap_or_default();
                    let line = format!("{} key={key} gave up: {}", order_of(&key), letter.error);
                    println!("  dead letter: {line}");
                    state.lock().unwrap().dead_letter.push(line);
                }
                _ => {}
            })
            .build();
        let recorder = PrometheusBuilder::new().build_recorder();
        #[cfg(feature = "metrics")]
        metrics::with_local_recorder(&recorder, jobguard::observe::metrics::describe);
        let (queue, mut jobs) = mpsc::unbounded_channel::<(String, String)>();
        let service = Service {
            gateway,
            runtime,
            store: Arc::new(store),
            orders,
            queue,
            done: Arc::new(watch::channel(0).0),
            metrics: recorder.handle(),
        };
        let worker = service.clone();
        tokio::spawn(async move {
            while let Some((order_id, key)) = jobs.recv().await {
                // A job's failure ends as a dead letter; nothing escapes into the service.
                let charging = charge(&worker.gateway, &order_id, 100, &key);
                let _ = recorded(&recorder, worker.runtime.scope(charging)).await;
                worker.done.send_modify(|done| *done += 1);
            }
        });
        service
    }

    /// Queues a charge and returns at once.
    pub fn enqueue(&self, order_id: &str, key: &str) {
        self.orders
            .lock()
            .unwrap()
            .insert(key.to_owned(), order_id.to_owned());
        let _ = self.queue.send((order_id.to_owned(), key.to_owned()));
    }

    /// Waits until `n` jobs in all have finished.
    pub async fn finished(&self, n: usize) {
        let _ = self.done.subscribe().wait_for(|done| *done >= n).await;
    }

    /// The state document, with the idempotency store read back from the store itself.
    pub async fn state(&self) -> State {
        let mut state = self.gateway.state.lock().unwrap().clone();
        let keys: Vec<String> = self.orders.lock().unwrap().keys().cloned().collect();
        for key in keys {
            if let Some(receipt) = completed(&*self.store, &key).await {
                state.idempotency_store.insert(key, receipt);
            }
        }
        state
    }
}

/// Runs `fut` with `recorder` as the local recorder of whichever thread polls it, so the
/// metrics its events record land in `recorder` on a multi-threaded runtime too.
async fn recorded<F: Future>(recorder: &PrometheusRecorder, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| metrics::with_local_recorder(recorder, || fut.as_mut().poll(cx)))
        .await
}

/// The stored receipt for `key`, read without disturbing it: a claim of a completed key returns
/// the record; a claim that happens to succeed is released at once.
async fn completed(store: &dyn Store, key: &str) -> Option<Receipt> {
    #[derive(Deserialize)]
    struct Record {
        ok: Receipt,
    }
    let key = StoreKey {
        scope: "payments.charge",
        key,
    };
    let claim = store.claim(key, "state-reader", None, std::time::Duration::from_secs(1));
    match claim.await.ok()? {
        jobguard::Claim::Completed(bytes) => {
            serde_json::from_slice::<Record>(&bytes).ok().map(|r| r.ok)
        }
        jobguard::Claim::Acquired => {
            let _ = store.release(key, "state-reader").await;
            None
        }
        _ => None,
    }
}
