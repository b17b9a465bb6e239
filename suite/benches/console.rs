//! The operator console's JSON API over 100,000 stored letters, in a Redis stream and in a
//! Postgres table, each on a private server, through a real HTTP client on a loopback socket:
//!
//! * a page of 50 letters (`GET api/dead-letters?limit=50`), from the newest and from a random
//!   cursor anywhere in the 100,000, unfiltered and filtered by job (one letter in ten):
//!   p50, p99 and the slowest of the requests;
//! * a filtered bulk redrive of 10,000 of them (`POST api/dead-letters/redrive?job=mail.send`
//!   with `{"expect": 10000}`): its time, and the most heap it held at once above what the
//!   process held before it (a tracking allocator), beside the bytes of the 10,000 letters'
//!   records: the walk reads one batch at a time, so the peak stays near one batch's.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench console
//! ```
//!
//! A timed harness, not criterion: a page is a network round trip to a server that this
//! process also runs, and the figure asked of it is a tail (p99), so each request is timed on
//! its own. `JOBGUARD_BENCH_QUICK=1` times a tenth of the requests.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jobguard::console::Console;
use jobguard::dead_letter::encode;
use jobguard::dead_letter::postgres::PgDeadLetters;
use jobguard::{DeadLetter, GiveUp, PgStore, RedisDeadLetters};
use jobguard_testkit::postgres::PgServer;
use jobguard_testkit::redis::RedisServer;
use rand::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Live heap bytes, and the most held at once since the last [`Tracking::reset_peak`].
struct Tracking;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl Tracking {
    fn reset_peak() -> usize {
        let live = LIVE.load(Ordering::Relaxed);
        PEAK.store(live, Ordering::Relaxed);
        live
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are atomics.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                + (new_size - layout.size());
            PEAK.fetch_max(live, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

const STORED: usize = 100_000;
/// Every tenth letter is `mail.send`: 10,000 of them.
const MAIL_EVERY: usize = 10;

fn letter(i: usize) -> DeadLetter {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + i as u64);
    let job = if i.is_multiple_of(MAIL_EVERY) {
        "mail.send"
    } else {
        "payments.charge"
    };
    DeadLetter::new(
        job,
        Some(format!("order-{i:06}")),
        GiveUp::Exhausted,
        5,
        format!("gateway timeout on order-{i:06} (attempt 5)"),
        t,
        t,
    )
    .with_history(vec![format!("gateway timeout on order-{i:06}"); 5])
    .with_payload(Some(serde_json::json!([format!("order-{i:06}"), 100])))
}

type Http = Client<HttpConnector, Full<Bytes>>;

async fn request(
    client: &Http,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Bytes) {
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::from(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.expect("the console answers");
    let status = response.status().as_u16();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Times pages of 50 from the newest and from random cursors, unfiltered and by job; then a
/// bulk redrive of the 10,000 `mail.send` letters. Prints one table row per measure.
async fn measure(backend: &str, console: Console, ids: &[String], quick: bool) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().nest("/jobguard", console.router());
    tokio::spawn(axum::serve(listener, app).into_future());
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let requests = if quick { 100 } else { 1000 };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    // Warm the connection and the server's caches.
    for _ in 0..20 {
        request(
            &client,
            addr,
            "GET",
            "/jobguard/api/dead-letters?limit=50",
            "",
        )
        .await;
    }
    for (label, filter) in [
        ("page of 50", ""),
        ("page of 50, job filter (1 in 10)", "&job=mail.send"),
    ] {
        let mut times = Vec::with_capacity(requests);
        for n in 0..requests {
            let cursor = if n % 2 == 0 {
                String::new()
            } else {
                // Anywhere but the last 500, so that every page is full.
                format!("&cursor={}", ids[rng.random_range(5_000..ids.len())])
            };
            let path = format!("/jobguard/api/dead-letters?limit=50{filter}{cursor}");
            let started = Instant::now();
            let (status, body) = request(&client, addr, "GET", &path, "").await;
            times.push(started.elapsed());
            assert_eq!(status, 200, "{path}: {body:?}");
            let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(page["letters"].as_array().unwrap().len(), 50, "{path}");
        }
        times.sort();
        println!(
            "| {backend} | {label} | {requests} | {} | {} | {} |",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            ms(*times.last().unwrap()),
        );
    }
    // The bulk redrive.
    let records: usize = (0..STORED)
        .step_by(MAIL_EVERY)
        .map(|i| encode(&letter(i)).len())
        .sum();
    let before = Tracking::reset_peak();
    let started = Instant::now();
    let (status, body) = request(
        &client,
        addr,
        "POST",
        "/jobguard/api/dead-letters/redrive?job=mail.send",
        &format!(r#"{{"expect": {}}}"#, STORED / MAIL_EVERY),
    )
    .await;
    let took = started.elapsed();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    assert_eq!(status, 200, "{body:?}");
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["redriven"], STORED / MAIL_EVERY, "{answer}");
    println!(
        "| {backend} | bulk redrive of 10,000 (job filter) | 1 | {:.2} s total, {:.0} letters/s | peak heap +{:.0} KiB | records {:.0} KiB |",
        took.as_secs_f64(),
        (STORED / MAIL_EVERY) as f64 / took.as_secs_f64(),
        peak as f64 / 1024.0,
        records as f64 / 1024.0,
    );
}

fn console(letters: impl jobguard::dead_letter::Browse + 'static) -> Console {
    Console::new()
        .dead_letters(letters)
        .redrive("mail.send", |_letter: DeadLetter| async {
            Ok::<(), std::io::Error>(())
        })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var("JOBGUARD_BENCH_QUICK").as_deref() == Ok("1");
    println!("| store | what | requests | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");

    if let Some(server) = RedisServer::start() {
        const STREAM: &str = "bench:console:letters";
        let letters = RedisDeadLetters::connect(&server.url(), STREAM)
            .await
            .unwrap()
            .max_len(1_000_000);
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut ids = Vec::with_capacity(STORED);
        for chunk in (0..STORED).collect::<Vec<_>>().chunks(1000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                pipe.cmd("XADD")
                    .arg(STREAM)
                    .arg("*")
                    .arg("letter")
                    .arg(encode(&letter(*i)));
            }
            let added: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
            ids.extend(added);
        }
        measure("Redis", console(letters), &ids, quick).await;
    }

    if let Some(server) = PgServer::start() {
        let store = PgStore::connect(&server.url()).await.unwrap();
        store.migrate().await.unwrap();
        for chunk in (0..STORED).collect::<Vec<_>>().chunks(1000) {
            let mut q = sqlx::QueryBuilder::new(
                "INSERT INTO jobguard_dead_letters (job, key, reason, error, record) ",
            );
            q.push_values(chunk, |mut row, i| {
                let l = letter(*i);
                row.push_bind(l.job.clone())
                    .push_bind(l.key.clone())
                    .push_bind(l.reason.as_str())
                    .push_bind(l.error.clone())
                    .push_bind(encode(&l));
            });
            q.build().execute(store.pool()).await.unwrap();
        }
        sqlx::query("ANALYZE jobguard_dead_letters")
            .execute(store.pool())
            .await
            .unwrap();
        let ids: Vec<String> = (1..=STORED).map(|i| i.to_string()).collect();
        measure(
            "Postgres",
            console(PgDeadLetters::new(store.pool().clone())),
            &ids,
            quick,
        )
        .await;
    }
}
