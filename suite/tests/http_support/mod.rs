//! What the `Idempotency-Key` layer's tests share: an axum app with the layer on
//! `POST /charge/{order_id}` on a loopback port, a hyper client, and the checks of a problem
//! document.
#![allow(dead_code)] // each test file uses a part

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jobguard::http::IdempotencyLayer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

/// What the test's handler does, and what it saw.
#[derive(Clone, Default)]
pub struct Handler {
    /// Handler runs so far.
    pub runs: Arc<AtomicUsize>,
    /// Notified as a run starts.
    pub entered: Arc<Notify>,
    /// When set, each run waits for a permit here before it answers.
    pub gate: Option<Arc<Semaphore>>,
    /// How long each run works before it answers.
    pub work: Duration,
    /// The status each run answers (201 when `None`).
    pub status: Option<StatusCode>,
    /// The size of the body each run answers, when not the default JSON.
    pub body_len: Option<usize>,
    /// When set, each run panics (after the gate and the work) instead of answering.
    pub panics: bool,
}

impl Handler {
    /// Runs so far.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// A handler whose runs wait until the test opens the gate.
    pub fn gated() -> (Handler, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        let handler = Handler {
            gate: Some(gate.clone()),
            ..Handler::default()
        };
        (handler, gate)
    }
}

/// `POST /charge/{order_id}`: counts the run, then answers `201` with a JSON receipt numbered by
/// the run, `Location` and a custom header that is not stored.
async fn charge(State(h): State<Handler>, Path(order_id): Path<String>, body: Bytes) -> Response {
    let run = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    h.entered.notify_one();
    if let Some(gate) = &h.gate {
        gate.acquire().await.expect("gate open").forget();
    }
    if !h.work.is_zero() {
        tokio::time::sleep(h.work).await;
    }
    if h.panics {
        panic!("the handler panicked on run {run}");
    }
    let status = h.status.unwrap_or(StatusCode::CREATED);
    if let Some(len) = h.body_len {
        return (
            status,
            [("content-type", "application/octet-stream")],
            vec![b'x'; len],
        )
            .into_response();
    }
    let receipt = serde_json::json!({
        "order_id": order_id,
        "run": run,
        "body_bytes": body.len(),
    });
    (
        status,
        [
            ("content-type", "application/json"),
            ("location", &format!("/charges/{order_id}")[..]),
            ("x-run", &run.to_string()[..]),
        ],
        receipt.to_string(),
    )
        .into_response()
}

/// `GET`, `PUT` and `DELETE /charge/{order_id}`: the same handler, for methods the layer may not
/// guard.
pub fn app(handler: Handler, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route(
            "/charge/{order_id}",
            post(charge).get(charge).put(charge).patch(charge),
        )
        .route("/runs", get(runs))
        .with_state(handler)
        .layer(layer)
}

async fn runs(State(h): State<Handler>) -> String {
    h.runs().to_string()
}

/// `app` with a watch around each request, outside every layer: the `Notify` is notified when
/// the server drops a request's future before it answered (the client hung up), so that a test
/// can wait for the server to have seen the disconnect.
pub fn watch_drops(app: Router) -> (Router, Arc<Notify>) {
    /// Notifies `dropped` when dropped armed.
    struct Watch {
        dropped: Option<Arc<Notify>>,
    }
    impl Watch {
        fn disarm(&mut self) {
            self.dropped = None;
        }
    }
    impl Drop for Watch {
        fn drop(&mut self) {
            if let Some(dropped) = self.dropped.take() {
                dropped.notify_one();
            }
        }
    }
    let dropped = Arc::new(Notify::new());
    let notify = dropped.clone();
    let app = app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let dropped = notify.clone();
            async move {
                let mut watch = Watch {
                    dropped: Some(dropped),
                };
                let response = next.run(request).await;
                watch.disarm();
                response
            }
        },
    ));
    (app, dropped)
}

/// `app` ready for [`tower::Service::call`], for a test that calls it in process, without a
/// socket (to drop a request mid-handler, or to run it inside a `Runtime`'s scope).
pub async fn ready(app: &mut Router) {
    std::future::poll_fn(|cx| {
        tower::Service::<http::Request<axum::body::Body>>::poll_ready(&mut *app, cx)
    })
    .await
    .expect("a Router is always ready");
}

/// `POST /charge/order-A` with `Idempotency-Key: key` and an empty JSON body, for [`ready`]'s
/// app.
pub fn charge_request(key: &str) -> http::Request<axum::body::Body> {
    http::Request::post("/charge/order-A")
        .header("idempotency-key", key)
        .body(axum::body::Body::from("{}"))
        .expect("a valid request")
}

/// Serves `app` on a free loopback port.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, app).into_future());
    addr
}

/// A keep-alive HTTP/1.1 client.
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Client {
    /// A client for the server at `addr`.
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            inner: HyperClient::builder(TokioExecutor::new()).build_http(),
            addr,
        }
    }

    /// `method path` with `Idempotency-Key: key` (when given) and `body`.
    pub async fn send(&self, method: &str, path: &str, key: Option<&str>, body: &str) -> Reply {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        self.send_request(request.body(Full::from(body.to_owned())).unwrap())
            .await
    }

    /// `POST /charge/order-A` with `key` and an empty body.
    pub async fn charge(&self, key: &str) -> Reply {
        self.send("POST", "/charge/order-A", Some(key), "").await
    }

    /// Any request, its URI's path and query taken as relative to the server.
    pub async fn send_request(&self, mut request: http::Request<Full<Bytes>>) -> Reply {
        if request.uri().authority().is_none() {
            *request.uri_mut() = format!("http://{}{}", self.addr, request.uri())
                .parse()
                .unwrap();
        }
        let response = self
            .inner
            .request(request)
            .await
            .expect("the server answers");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("the whole body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// Whether `Idempotent-Replayed: true` is set.
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// Checks that this is an RFC 9457 problem document with `status`, a title and a detail, and
    /// returns the detail.
    pub fn problem(&self, status: u16) -> String {
        assert_eq!(self.status.as_u16(), status, "{self:?}");
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "{self:?}"
        );
        let doc = self.json();
        assert_eq!(doc["status"], status, "{doc}");
        let title = doc["title"].as_str().expect("a title");
        let detail = doc["detail"].as_str().expect("a detail");
        assert!(title.len() > 10, "{doc}");
        assert!(detail.len() > 40, "{doc}");
        assert!(doc["type"].as_str().is_some(), "{doc}");
        detail.to_owned()
    }
}
