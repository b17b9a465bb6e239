//! A client that hangs up mid-request (a client timeout) does not make its repeat run twice:
//! once the key is claimed, the handler runs to its end and its response is stored whatever
//! becomes of the connection, so the repeat gets `409` while the first runs, then the replay.
//! A handler that panics still releases its claim, and its panic reaches the caller.

mod http_support;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use http_support::{Client, Handler, Reply, app, charge_request, ready, serve, watch_drops};
use jobguard::http::IdempotencyLayer;
use jobguard::testing::{Claim, PlainClaim};
use jobguard::{Event, MemoryStore, Runtime, StoreKey};
use jobguard_testkit::faulty::Faulty;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};
use tower::Service;

/// A bound on each wait, so that a regression fails the test instead of hanging it. Not a
/// synchronisation: every wait below is on an event.
async fn within<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The layer's key in the store for `Idempotency-Key: key`: its default scope, the key.
fn store_key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "http-anonymous",
        key,
    }
}

/// Sends `POST path` with `Idempotency-Key: key` and an empty body on a raw socket, and returns
/// the socket without reading the answer: the client that will hang up.
async fn send_and_hold(addr: SocketAddr, path: &str, key: &str) -> TcpStream {
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: {key}\r\n\
         content-length: 0\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.expect("send");
    socket
}

/// Checks that `reply` is the `409` of a request in progress, with `Retry-After`.
fn in_progress(reply: &Reply) {
    reply.problem(409);
    assert_eq!(reply.headers["retry-after"], "1", "{reply:?}");
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_handler_gets_409_then_the_replay() {
    let store = Faulty::default();
    let (handler, gate) = Handler::gated();
    let layer = IdempotencyLayer::new(store.clone()).required(true);
    let (app, dropped) = watch_drops(app(handler.clone(), layer));
    let addr = serve(app).await;

    // The first request reaches the handler, then its client times out and closes the socket.
    let socket = send_and_hold(addr, "/charge/order-A", "k-disc").await;
    within("the handler", handler.entered.notified()).await;
    drop(socket);
    within("the server to drop the request", dropped.notified()).await;

    // The server has given up on the request; the handler still runs, holding the key.
    let client = Client::new(addr);
    let during = within("the repeat during the run", client.charge("k-disc")).await;
    in_progress(&during);
    assert!(!during.replayed());
    assert_eq!(handler.runs(), 1, "the repeat did not run the handler");

    // The handler ends and its response is stored, though nobody waits for it.
    gate.add_permits(1);
    within("the response to be stored", store.completed.notified()).await;
    let after = within("the repeat after the run", client.charge("k-disc")).await;
    assert_eq!(after.status, 201, "{after:?}");
    assert!(after.replayed(), "{after:?}");
    assert_eq!(after.json()["run"], 1, "the first run's response");
    assert_eq!(handler.runs(), 1, "one run for the key");
}

/// `POST /slow-body`: answers `201` at once with a body that arrives only when the test sends
/// it, so that the layer is still buffering the response when the client hangs up.
#[derive(Clone, Default)]
struct SlowBody {
    runs: Arc<AtomicUsize>,
    answered: Arc<Notify>,
    bodies: Arc<Mutex<Vec<oneshot::Sender<Bytes>>>>,
}

async fn slow_body(State(s): State<SlowBody>) -> Response {
    s.runs.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = oneshot::channel();
    s.bodies.lock().unwrap().push(tx);
    s.answered.notify_one();
    let body = futures::stream::once(rx);
    Response::builder()
        .status(201)
        .header("content-type", "text/plain")
        .body(Body::from_stream(body))
        .unwrap()
}

#[tokio::test]
async fn a_client_that_hangs_up_while_the_response_is_buffered_gets_409_then_the_replay() {
    let store = Faulty::default();
    let state = SlowBody::default();
    let app = Router::new()
        .route("/slow-body", post(slow_body))
        .with_state(state.clone())
        .layer(IdempotencyLayer::new(store.clone()).required(true));
    let (app, dropped) = watch_drops(app);
    let addr = serve(app).await;

    let socket = send_and_hold(addr, "/slow-body", "k-buffer").await;
    within("the handler's answer", state.answered.notified()).await;
    drop(socket);
    within("the server to drop the request", dropped.notified()).await;

    let client = Client::new(addr);
    let during = within(
        "the repeat while buffering",
        client.send("POST", "/slow-body", Some("k-buffer"), ""),
    )
    .await;
    in_progress(&during);

    // The body arrives: the layer buffers it whole and stores the response.
    let tx = state
        .bodies
        .lock()
        .unwrap()
        .pop()
        .expect("the first run's body");
    tx.send(Bytes::from_static(b"receipt")).unwrap();
    within("the response to be stored", store.completed.notified()).await;
    let after = within(
        "the repeat after",
        client.send("POST", "/slow-body", Some("k-buffer"), ""),
    )
    .await;
    assert_eq!(after.status, 201, "{after:?}");
    assert!(after.replayed(), "{after:?}");
    assert_eq!(&after.body[..], b"receipt");
    assert_eq!(state.runs.load(Ordering::SeqCst), 1, "one run for the key");
}

#[tokio::test]
async fn a_request_future_dropped_mid_handler_keeps_its_claim_until_the_response_is_stored() {
    let store = Faulty::default();
    let (handler, gate) = Handler::gated();
    let mut service = app(handler.clone(), IdempotencyLayer::new(store.clone()));
    ready(&mut service).await;
    // Polled here, not spawned, so that dropping it below is the cancellation.
    let mut running = Box::pin(service.call(charge_request("k")));
    tokio::select! {
        done = &mut running => panic!("the gated handler answered: {done:?}"),
        () = handler.entered.notified() => {}
    }
    drop(running);

    // The key stays held: a probe's claim, and the repeat, find it in progress.
    let lease = Duration::from_secs(30);
    assert!(matches!(
        store
            .claim_plain(store_key("k"), "probe", None, lease)
            .await,
        Ok(Claim::InProgress { .. })
    ));
    ready(&mut service).await;
    let during = service.call(charge_request("k")).await.unwrap();
    assert_eq!(during.status(), 409);
    assert_eq!(during.headers()["retry-after"], "1");

    gate.add_permits(1);
    within("the response to be stored", store.completed.notified()).await;
    ready(&mut service).await;
    let after = service.call(charge_request("k")).await.unwrap();
    assert_eq!(after.status(), 201);
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    assert_eq!(handler.runs(), 1, "one run for the key");
}

#[tokio::test]
async fn a_panicking_handler_releases_its_claim_and_the_panic_reaches_the_caller() {
    let released = Arc::new(Notify::new());
    let seen = released.clone();
    // The observer is in the caller's scope: the panic unwinds in the caller's own poll.
    let runtime = Runtime::builder()
        .observer(move |e: &Event<'_>| {
            if matches!(e, Event::Released { key: "k-panic", .. }) {
                seen.notify_one();
            }
        })
        .build();
    let store = MemoryStore::new();
    let handler = Handler {
        panics: true,
        ..Handler::default()
    };
    let mut service = app(handler.clone(), IdempotencyLayer::new(store.clone()));
    ready(&mut service).await;
    let call = service.call(charge_request("k-panic"));
    let error = tokio::spawn(async move { runtime.scope(call).await })
        .await
        .expect_err("the request panicked");
    let panic = error.into_panic();
    let message = panic
        .downcast_ref::<String>()
        .expect("the handler's panic message");
    assert_eq!(message, "the handler panicked on run 1");

    within("the claim's release", released.notified()).await;
    assert_eq!(
        store
            .claim_plain(store_key("k-panic"), "probe", None, Duration::from_secs(30))
            .await,
        Ok(Claim::Acquired),
        "the key is free again"
    );
    assert_eq!(handler.runs(), 1);
}

/// `POST /scoped`: waits at the gate, then records whether the runtime it sees is the test's.
#[derive(Clone)]
struct Scoped {
    entered: Arc<Notify>,
    gate: Arc<tokio::sync::Semaphore>,
    expected: Runtime,
    saw_it: Arc<Mutex<Option<bool>>>,
}

async fn scoped(State(s): State<Scoped>) -> &'static str {
    s.entered.notify_one();
    s.gate.acquire().await.unwrap().forget();
    let current = Runtime::current();
    let same = Arc::ptr_eq(current.dead_letters(), s.expected.dead_letters());
    *s.saw_it.lock().unwrap() = Some(same);
    "done"
}

#[tokio::test]
async fn a_handler_that_runs_on_after_its_request_was_dropped_keeps_its_runtime_scope() {
    let runtime = Runtime::builder()
        .dead_letters(jobguard::MemoryDeadLetters::new())
        .build();
    let store = Faulty::default();
    let state = Scoped {
        entered: Arc::default(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
        expected: runtime.clone(),
        saw_it: Arc::default(),
    };
    let mut service = Router::new()
        .route("/scoped", post(scoped))
        .with_state(state.clone())
        .layer(IdempotencyLayer::new(store.clone()));
    ready(&mut service).await;
    let request = http::Request::post("/scoped")
        .header("idempotency-key", "k-scope")
        .body(Body::empty())
        .unwrap();
    let mut running = Box::pin(runtime.scope(service.call(request)));
    tokio::select! {
        done = &mut running => panic!("the gated handler answered: {done:?}"),
        () = state.entered.notified() => {}
    }
    // Dropped outside the scope: the handler goes on in a task, in the scope it started in.
    drop(running);
    state.gate.add_permits(1);
    within("the response to be stored", store.completed.notified()).await;
    assert_eq!(*state.saw_it.lock().unwrap(), Some(true));
}
