//! Requests per second of a trivial axum handler with and without `IdempotencyLayer` on
//! `MemoryStore`, over a real loopback socket with a keep-alive client, in one run; and the
//! latency each request adds, at the median and the 99th percentile.
//!
//! ```text
//! cargo bench --bench http -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The contenders, one `POST /charge/{order_id}` with a 2-byte body and an `Idempotency-Key`
//! header per iteration, the key fresh each time (a counter), so every guarded request is a
//! first request: parse the key, buffer and fingerprint the body, claim, run, buffer the response,
//! store it.
//!
//! - `bare`: the handler (`"ok"`) in an axum `Router`, served by `axum::serve`.
//! - `layer`: the same router with `IdempotencyLayer::new(MemoryStore::new())`.
//! - `replay`: the layered router, every request repeating one completed key (the stored
//!   response, the handler not run).
//!
//! **Harness.** One multi-thread tokio runtime (2 workers) holds the servers and the client, a
//! hyper-util legacy client whose pool keeps one connection per server alive: the requests go one
//! after another, so a request's time is its latency and the rate is its inverse. `iter_custom`
//! times a plain loop of requests inside the runtime and also keeps each request's latency; after
//! the group, the median and 99th percentile of every measured request are printed beside the
//! bare handler's.
//!
//! **Steady state.** The layered store completes records with a 1 s TTL: at the rates measured
//! (tens of thousands of requests a second) that keeps far fewer records live than
//! `MemoryStore`'s 100,000 bound, so no claim is refused for room (24 h records would fill it in
//! seconds); each shard sweeps its expired records when full, as it does in service.

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jobguard::MemoryStore;
use jobguard::http::IdempotencyLayer;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn ok() -> &'static str {
    "ok"
}

fn router() -> Router {
    Router::new().route("/charge/{order_id}", post(ok))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, app).into_future());
    addr
}

/// One request; panics unless it is answered `200 ok`.
async fn charge(client: &HttpClient, addr: SocketAddr, key: &str) -> bool {
    let request = http::Request::post(format!("http://{addr}/charge/order-A"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = client.request(request).await.expect("the server answers");
    let replayed = response.headers().contains_key("idempotent-replayed");
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    replayed
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn http(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let layer = IdempotencyLayer::new(MemoryStore::new()).ttl(Duration::from_secs(1));
    let bare = rt.block_on(serve(router()));
    let guarded = rt.block_on(serve(router().layer(layer)));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let next = Arc::new(AtomicU64::new(0));

    // Check: a fresh key runs; its repeat is the replay.
    rt.block_on(async {
        assert!(!charge(&client, guarded, "check").await);
        assert!(charge(&client, guarded, "check").await);
        assert!(!charge(&client, bare, "check").await);
    });
    // The replay contender's key, completed with the 1 s TTL: kept alive by a request before
    // each sample (outside the timing) would be needed past a second, so it gets its own server
    // with a long TTL.
    let replay_layer = IdempotencyLayer::new(MemoryStore::new());
    let replay = rt.block_on(serve(router().layer(replay_layer)));
    rt.block_on(async { assert!(!charge(&client, replay, "replayed-key").await) });

    let latencies: Arc<Mutex<Vec<(&str, Vec<Duration>)>>> = Arc::default();
    let mut group = c.benchmark_group("http");
    group.throughput(Throughput::Elements(1));
    for (name, addr, fresh) in [
        ("bare", bare, true),
        ("layer", guarded, true),
        ("replay", replay, false),
    ] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        latencies.lock().unwrap().push((name, Vec::new()));
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let client = client.clone();
                let next = next.clone();
                let seen = seen.clone();
                async move {
                    let mut each = Vec::with_capacity(iters as usize);
                    let mut key = String::with_capacity(24);
                    let start = Instant::now();
                    for _ in 0..iters {
                        key.clear();
                        if fresh {
                            use std::fmt::Write;
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            write!(key, "k-{n}").unwrap();
                        } else {
                            key.push_str("replayed-key");
                        }
                        let t = Instant::now();
                        let replayed = charge(&client, addr, &key).await;
                        each.push(t.elapsed());
                        debug_assert_eq!(replayed, !fresh && name == "replay");
                    }
                    let total = start.elapsed();
                    seen.lock().unwrap().extend(each);
                    total
                }
            });
        });
        latencies.lock().unwrap().last_mut().unwrap().1 =
            std::mem::take(&mut *seen.lock().unwrap());
    }
    group.finish();

    let mut all = latencies.lock().unwrap();
    let mut bare_p = (Duration::ZERO, Duration::ZERO);
    for (name, each) in all.iter_mut() {
        each.sort_unstable();
        let (p50, p99) = (percentile(each, 0.50), percentile(each, 0.99));
        if *name == "bare" {
            bare_p = (p50, p99);
        }
        println!(
            "http/{name}: {} requests, p50 {p50:?}, p99 {p99:?}; added over bare: p50 {:?}, p99 {:?}",
            each.len(),
            p50.saturating_sub(bare_p.0),
            p99.saturating_sub(bare_p.1),
        );
    }
}

criterion_group!(benches, http);
criterion_main!(benches);
