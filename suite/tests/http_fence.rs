//! A request holds its key in the same claim session as a job: the handler reads
//! `jobguard::fence()`, the claims of servers that died mid-request are counted, and the repeat
//! that finds the crash limit is answered `500` (problem+json, at once) without running the
//! handler again.

mod http_support;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http_support::{Client, ready, serve};
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tower::Service;

const LEASE: Duration = Duration::from_secs(30);

/// `POST /fence` answers the claim's fence; `POST /hang` counts its run, says it entered, and
/// never answers (a server that dies mid-request is one whose request never ends).
fn app(layer: IdempotencyLayer, runs: Arc<AtomicUsize>, entered: Arc<Notify>) -> Router {
    Router::new()
        .route(
            "/fence",
            post(|| async { format!("{:?}", jobguard::fence()) }),
        )
        .route(
            "/hang",
            post(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                entered.notify_one();
                std::future::pending::<String>().await
            }),
        )
        .layer(layer)
}

fn request(path: &str, key: &str) -> http::Request<Body> {
    http::Request::post(path)
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap()
}

async fn body(response: http::Response<Body>) -> (u16, String) {
    use http_body_util::BodyExt;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn a_handler_reads_its_claims_fence() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let client = Client::new(serve(app(layer, Arc::default(), Arc::default())).await);
    let first = client.send("POST", "/fence", Some("k-1"), "").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, "Some(1)", "the key's first claim");
    let again = client.send("POST", "/fence", Some("k-1"), "").await;
    assert!(again.replayed());
    assert_eq!(again.body, "Some(1)");
    // Outside a guarded request there is no fence.
    let unguarded = client.send("POST", "/fence", None, "").await;
    assert_eq!(unguarded.body, "None");
}

/// Sends a request to `/hang` and forgets its future once the handler runs: the server that
/// served it died, holding the claim, which nothing releases.
async fn die_mid_request(app: &mut Router, entered: &Notify, key: &str) {
    ready(app).await;
    let mut future = Box::pin(app.call(request("/hang", key)));
    tokio::select! {
        _ = &mut future => panic!("the hanging handler answered"),
        () = entered.notified() => {}
    }
    std::mem::forget(future);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_kills_its_server_is_refused_at_the_crash_limit() {
    let runs = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(Notify::new());
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(store.clone()).lease(LEASE).crashes(2);
    let mut app = app(layer, runs.clone(), entered.clone());

    die_mid_request(&mut app, &entered, "k-poison").await;
    // While the dead server's lease runs, a repeat is told to come back.
    ready(&mut app).await;
    let (status, _) = body(app.call(request("/hang", "k-poison")).await.unwrap()).await;
    assert_eq!(status, 409);

    // The lease lapses: the repeat takes the claim over (one crash counted) and runs again,
    // and dies again.
    tokio::time::advance(LEASE).await;
    die_mid_request(&mut app, &entered, "k-poison").await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The second crash reaches the limit: refused at once, without running the handler.
    tokio::time::advance(LEASE).await;
    for _ in 0..2 {
        ready(&mut app).await;
        let response = app.call(request("/hang", "k-poison")).await.unwrap();
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        assert!(response.headers().get("retry-after").is_none());
        let (status, doc) = body(response).await;
        assert_eq!(status, 500, "{doc}");
        let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(doc["type"], "tag:jobguard,2026:idempotency-key/poisoned");
        assert_eq!(doc["status"], 500);
        assert!(doc["detail"].as_str().unwrap().contains("2 times"), "{doc}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "never run a third time");

    // An operator forgives the key: the next repeat runs, under a newer fence.
    let scope = "http-anonymous";
    let key = jobguard::StoreKey {
        scope,
        key: "k-poison",
    };
    assert!(jobguard::Store::forgive(&store, key).await.unwrap());
    die_mid_request(&mut app, &entered, "k-poison").await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_takeover_runs_under_a_newer_fence() {
    // The first run dies holding the claim; the runs after it answer their fence.
    let runs = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(Notify::new());
    let (count, notify) = (runs.clone(), entered.clone());
    let mut app = Router::new()
        .route(
            "/hang",
            post(move || async move {
                let run = count.fetch_add(1, Ordering::SeqCst) + 1;
                notify.notify_one();
                if run == 1 {
                    std::future::pending::<()>().await;
                }
                format!("{:?}", jobguard::fence())
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new()).lease(LEASE));
    die_mid_request(&mut app, &entered, "k-fence").await;
    tokio::time::advance(LEASE).await;
    ready(&mut app).await;
    let (status, fence) = body(app.call(request("/hang", "k-fence")).await.unwrap()).await;
    assert_eq!(
        (status, fence.as_str()),
        (200, "Some(2)"),
        "the dead claim's successor"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
