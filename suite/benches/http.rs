//! Requests per second of a trivial axum handler with and without `IdempotencyLayer` on
//! `MemoryStore`, over a real loopback socket with a keep-alive client, in one run; and the
//! latency each request adds, at the median and the 99th percentile.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench http -- --warm-up-time 1 --measurement-time 3
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
//! - `paired`: one `bare`, one `layer` and one `bare_body` request per iteration, in turn: all
//!   see the same machine, so their latency percentiles and mean rates compare fairly on a loaded
//!   box. The p99 added by the layer is read here. `bare_body` is the bare handler reading its
//!   body (`Bytes` extractor) as a real `POST` handler does; the layer reads it too.
//!
//! **Harness.** One current-thread tokio runtime holds the servers and the client (on a loaded
//! 2-core box, a multi-thread runtime measures the scheduler's cross-thread wake-ups, which vary
//! from run to run far more than the service does), with a hyper-util
//! legacy client whose pool keeps one connection per server alive, `TCP_NODELAY` on both ends as
//! curl and browsers set it. The requests go one after another, so a request's time is its
//! latency and the rate is its inverse. `iter_custom` times a plain loop of requests inside the
//! runtime and also keeps each request's latency; after each contender, the median and 99th
//! percentile of every request it sent (warm-up included) are printed, and for `paired` the
//! differences.
//!
//! **Steady state.** The layered store completes records with a 1 s TTL: at the rates measured
//! (tens of thousands of requests a second) that keeps the live records few, so the figures
//! measure the layer, not a store that grows for the whole run and then gives up old records
//! at its bound, as it would with 24 h records.

use axum::Router;
use axum::routing::post;
use axum::serve::ListenerExt;
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

/// A server a contender sends to: its name, its address, and whether each request carries a
/// fresh key (else the one completed key).
type Target = (&'static str, SocketAddr, bool);

async fn ok() -> &'static str {
    "ok"
}

/// The same, reading the request body first, as a handler with a `Json` or `Bytes` extractor
/// does (the layer reads it too, to fingerprint it).
async fn ok_body(_body: Bytes) -> &'static str {
    "ok"
}

fn router() -> Router {
    Router::new().route("/charge/{order_id}", post(ok))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.tap_io(|stream| stream.set_nodelay(true).unwrap());
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let layer = IdempotencyLayer::new(MemoryStore::new()).ttl(Duration::from_secs(1));
    let bare = rt.block_on(serve(router()));
    let bare_body = rt.block_on(serve(
        Router::new().route("/charge/{order_id}", post(ok_body)),
    ));
    let guarded = rt.block_on(serve(router().layer(layer)));
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
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

    // Each contender sends, per iteration, one request to each of its targets in turn; every
    // request's latency is kept per target.
    let contenders: [(&str, &[Target]); 4] = [
        ("bare", &[("bare", bare, true)]),
        ("layer", &[("layer", guarded, true)]),
        ("replay", &[("replay", replay, false)]),
        (
            "paired",
            &[
                ("bare", bare, true),
                ("layer", guarded, true),
                ("bare_body", bare_body, true),
            ],
        ),
    ];
    let mut group = c.benchmark_group("http");
    for (name, targets) in contenders {
        group.throughput(Throughput::Elements(targets.len() as u64));
        let seen: Arc<Mutex<Vec<Vec<Duration>>>> =
            Arc::new(Mutex::new(vec![Vec::new(); targets.len()]));
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let client = client.clone();
                let next = next.clone();
                let seen = seen.clone();
                async move {
                    let mut each = vec![Vec::with_capacity(iters as usize); targets.len()];
                    let mut key = String::with_capacity(24);
                    let start = Instant::now();
                    for _ in 0..iters {
                        for (i, &(_, addr, fresh)) in targets.iter().enumerate() {
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
                            each[i].push(t.elapsed());
                            debug_assert_eq!(replayed, !fresh);
                        }
                    }
                    let total = start.elapsed();
                    for (all, these) in seen.lock().unwrap().iter_mut().zip(each) {
                        all.extend(these);
                    }
                    total
                }
            });
        });
        let mut seen = seen.lock().unwrap();
        if seen[0].is_empty() {
            continue; // filtered out on the command line
        }
        let mut line = format!("latency http/{name}:");
        for (each, (target, _, _)) in seen.iter_mut().zip(targets) {
            each.sort_unstable();
            let (p50, p99) = (percentile(each, 0.50), percentile(each, 0.99));
            line += &format!(
                " {target} p50 {p50:.1?} p99 {p99:.1?} ({} requests);",
                each.len()
            );
        }
        if let [bare, layer, bare_body] = &seen[..] {
            let mean = |each: &[Duration]| {
                each.iter().map(Duration::as_secs_f64).sum::<f64>() / each.len() as f64
            };
            for (name, base) in [("bare", bare), ("bare_body", bare_body)] {
                let added = |p| {
                    (percentile(layer, p).as_secs_f64() - percentile(base, p).as_secs_f64()) * 1e6
                };
                line += &format!(
                    " layer over {name}: p50 +{:.1} µs, p99 +{:.1} µs, rate {:.0}% (mean latencies);",
                    added(0.50),
                    added(0.99),
                    100.0 * mean(base) / mean(layer),
                );
            }
        }
        println!("{line}");
    }
    group.finish();
}

criterion_group!(benches, http);
criterion_main!(benches);
