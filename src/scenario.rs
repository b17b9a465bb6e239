//! The reference scenario of `SCENARIO.md`: a queue of charge jobs, a flaky gateway, one worker.
//!
//! `examples/charge.rs` runs it and prints the state document; `examples/server.rs` serves it
//! over HTTP; `tests/charge_scenario.rs` checks the document under a paused clock.
//!
//! Each [`Service`] owns a Prometheus recorder that records jobguard's metrics for the jobs its
//! worker runs ([`Service::metrics`], `GET /metrics`). The recorder is not installed globally:
//! it is the worker's local recorder while it polls a job, so several services in one process
//! (the tests) each count only their own jobs. A production service would install one recorder
//! for the process with `metrics::set_global_recorder` instead.

use jobguard::{Event, Runtime, Store, StoreKey, Transient};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What the gateway returns for a captured payment; stored by `#[idempotent]` and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The order charged.
    pub order_id: String,
    /// Attempts the charge took.
    pub attempts_used: u32,
}

/// The gateway's failures.
#[derive(Debug, Transient)]
pub enum GatewayError {
    /// The gateway did not answer in time: transient.
    #[transient]
    Timeout {
        /// The order.
        order_id: String,
        /// Which attempt timed out.
        attempt: u32,
    },
    /// The card was declined: permanent.
    Declined,
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
            GatewayError::Declined => f.write_str("card declined"),
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

/// The state document of `SCENARIO.md`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// A simulated gateway: `order-A` times out twice then succeeds; `order-B` always times out.
#[derive(Default)]
pub struct Gateway {
    state: Arc<Mutex<State>>,
    tries: Mutex<BTreeMap<String, u32>>,
}

impl Gateway {
    /// Captures a payment, or fails as the scenario says.
    pub async fn capture(&self, order_id: &str, _amount: u64) -> Result<Receipt, GatewayError> {
        let attempt = {
            let mut tries = self.tries.lock().unwrap();
            let n = tries.entry(order_id.to_owned()).or_default();
            *n += 1;
            *n
        };
        self.log(format!("{order_id} attempt {attempt}"));
        let recovers_on = if order_id == "order-A" { 3 } else { u32::MAX };
        if attempt < recovers_on {
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

    fn log(&self, line: String) {
        println!("  {line}");
        self.state.lock().unwrap().attempts.push(line);
    }
}

/// The job: idempotency outside, retry inside, `jitter = none` so the delays read
/// 0.5, 1.0, 2.0, 4.0.
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

/// One delivery from the queue.
#[derive(Debug, Clone)]
pub struct Job {
    /// The order to charge.
    pub order_id: String,
    /// Its idempotency key.
    pub key: String,
}

/// The service: a queue, one background worker, and the state it leaves.
#[derive(Clone)]
pub struct Service {
    gateway: Arc<Gateway>,
    runtime: Runtime,
    store: Arc<dyn Store>,
    keys: Arc<Mutex<Vec<String>>>,
    queue: mpsc::UnboundedSender<Job>,
    idle: Arc<tokio::sync::watch::Sender<usize>>,
    metrics: PrometheusHandle,
}

impl Service {
    /// Starts the worker on the current tokio runtime. Jobs use `store` and send their dead
    /// letters to `dead_letters`.
    pub fn start<S: Store + Clone + 'static>(
        store: S,
        dead_letters: impl jobguard::DeadLetterSink + 'static,
    ) -> Service {
        let gateway = Arc::new(Gateway::default());
        let orders: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let state = gateway.state.clone();
        let seen = orders.clone();
        let runtime = Runtime::builder()
            .store(store.clone())
            .dead_letters(dead_letters)
            .observer(move |event: &Event<'_>| match event {
                Event::Retry { delay, key, .. } => {
                    let order = key
                        .and_then(|k| seen.lock().unwrap().get(k).cloned())
                        .unwrap_or_default();
                    println!("    retrying {order} in {:.1}s", delay.as_secs_f64());
                    state
                        .lock()
                        .unwrap()
                        .backoff_delays
                        .push(delay.as_secs_f64());
                }
                Event::Replayed { key, .. } => {
                    let order = seen.lock().unwrap().get(*key).cloned().unwrap_or_default();
                    let line = format!("{order} skipped: idempotency key {key} already processed");
                    println!("  {line}");
                    state.lock().unwrap().attempts.push(line);
                }
                Event::DeadLetter(letter) => {
                    let key = letter.key.clone().unwrap_or_default();
                    let order = seen.lock().unwrap().get(&key).cloned().unwrap_or_default();
                    let line = format!("{order} key={key} gave up: {}", letter.error);
                    println!("  dead letter: {line}");
                    state.lock().unwrap().dead_letter.push(line);
                }
                _ => {}
            })
            .build();
        let (queue, mut jobs) = mpsc::unbounded_channel::<Job>();
        let (idle, _) = tokio::sync::watch::channel(0usize);
        let recorder = PrometheusBuilder::new().build_recorder();
        #[cfg(feature = "metrics")]
        metrics::with_local_recorder(&recorder, jobguard::observe::metrics::describe);
        let service = Service {
            gateway,
            runtime,
            store: Arc::new(store),
            keys: Arc::default(),
            queue,
            idle: Arc::new(idle),
            metrics: recorder.handle(),
        };
        let worker = service.clone();
        tokio::spawn(async move {
            while let Some(job) = jobs.recv().await {
                orders
                    .lock()
                    .unwrap()
                    .insert(job.key.clone(), job.order_id.clone());
                // A job's failure ends as a dead letter; nothing escapes into the service.
                let charging = charge(&worker.gateway, &job.order_id, 100, &job.key);
                let _ = recorded(&recorder, worker.runtime.scope(charging)).await;
                worker.idle.send_modify(|done| *done += 1);
            }
        });
        service
    }

    /// Queues a charge and returns at once.
    pub fn enqueue(&self, order_id: &str, key: &str) {
        {
            let mut keys = self.keys.lock().unwrap();
            if !keys.iter().any(|k| k == key) {
                keys.push(key.to_owned());
            }
        }
        let _ = self.queue.send(Job {
            order_id: order_id.to_owned(),
            key: key.to_owned(),
        });
    }

    /// Waits until `n` jobs in all have finished.
    pub async fn finished(&self, n: usize) {
        let mut rx = self.idle.subscribe();
        let _ = rx.wait_for(|done| *done >= n).await;
    }

    /// jobguard's metrics for this service's jobs, in the Prometheus text format.
    pub fn metrics(&self) -> String {
        self.metrics.render()
    }

    /// The state document, with the idempotency store read back from the store itself.
    pub async fn state(&self) -> State {
        let mut state = self.gateway.state.lock().unwrap().clone();
        let keys = self.keys.lock().unwrap().clone();
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
    match store
        .claim(key, "state-reader", None, std::time::Duration::from_secs(1))
        .await
        .ok()?
    {
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

/// The answer to `POST /charge/{order_id}?key=K`: the job is queued, not yet run.
pub fn queued(order_id: &str, key: &str) -> serde_json::Value {
    serde_json::json!({"order_id": order_id, "idempotency_key": key, "status": "queued"})
}

/// Runs the three requests of `SCENARIO.md` and returns the state once the work is done.
pub async fn run_scenario(service: &Service) -> State {
    for (order, key) in [
        ("order-A", "idem-1"),
        ("order-A", "idem-1"),
        ("order-B", "idem-2"),
    ] {
        println!("$ POST /charge/{order}?key={key}");
        println!("{}", queued(order, key));
        service.enqueue(order, key);
    }
    service.finished(3).await;
    service.state().await
}

/// The HTTP face of the service: `POST /charge/{order_id}?key=K` queues a charge and answers at
/// once; `GET /state` returns the state document; `GET /metrics` returns jobguard's metrics in
/// the Prometheus text format.
pub fn router(service: Service) -> axum::Router {
    use axum::Json;
    use axum::extract::{Path, Query, State as Shared};
    use axum::routing::{get, post};

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
        Json(queued(&order_id, &q.key))
    }

    async fn state_route(Shared(service): Shared<Service>) -> Json<State> {
        Json(service.state().await)
    }

    async fn metrics_route(
        Shared(service): Shared<Service>,
    ) -> ([(axum::http::header::HeaderName, &'static str); 1], String) {
        (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            service.metrics(),
        )
    }

    axum::Router::new()
        .route("/charge/{order_id}", post(charge_route))
        .route("/state", get(state_route))
        .route("/metrics", get(metrics_route))
        .with_state(service)
}
