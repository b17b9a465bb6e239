//! Durable steps beside a job that records nothing, in one run: an `#[idempotent]` job whose
//! body makes 10 calls, bare, as steps recorded by this run, and as steps replayed from an
//! earlier run, on `MemoryStore` and on a private `redis-server`. A step's cost is the
//! difference from the bare job, divided by 10.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench steps
//! ```
//!
//! The replayed job's keys are made before the timing: each key's first run records the 10
//! steps and fails, so its claim is released; the timed run claims the key again (the claim
//! brings the steps back) and replays them. On Redis the bench also counts round trips (script
//! calls in the server's `INFO commandstats`) for one job of each kind and prints them.

use criterion::{Criterion, criterion_group, criterion_main};
use jobguard::{MemoryStore, RedisStore, Runtime};
use jobguard_testkit::redis::{RedisServer, script_calls};
use redis::aio::ConnectionManager;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Calls in each job's body.
const CALLS: u32 = 10;

/// The call a job makes: a little arithmetic, as a cheap effect.
async fn work(n: u32) -> Result<u64, jobguard::Error> {
    Ok(black_box(u64::from(n) * 3))
}

#[jobguard::step]
async fn effect(n: u32) -> Result<u64, jobguard::Error> {
    work(n).await
}

/// How a job's body makes its calls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Calls {
    Bare,
    Steps,
}

#[jobguard::idempotent(key = key, scope = "bench.steps")]
async fn job(key: u64, calls: Calls, fail: bool) -> Result<u64, jobguard::Error> {
    let mut sum = 0;
    for n in 0..CALLS {
        sum += match calls {
            Calls::Bare => work(n).await?,
            Calls::Steps => effect(n).await?,
        };
    }
    if fail {
        return Err(jobguard::Error::Timeout);
    }
    Ok(sum)
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// Times `iters` jobs of `calls` under `runtime`, each on a fresh key; with `replayed`, each
/// key's steps were recorded (by a failed run) before the timing starts.
async fn time(runtime: &Runtime, iters: u64, calls: Calls, replayed: bool) -> Duration {
    let first = NEXT.fetch_add(iters, Ordering::Relaxed);
    let keys = first..first + iters;
    if replayed {
        for key in keys.clone() {
            let _ = runtime.scope(job(key, Calls::Steps, true)).await;
        }
    }
    let start = Instant::now();
    for key in keys {
        black_box(runtime.scope(job(key, calls, false)).await.unwrap());
    }
    start.elapsed()
}

/// The three jobs of the comparison under `runtime`, as the criterion group `name`.
fn group(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, runtime: &Runtime) {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    for (name, calls, replayed) in [
        ("job, 10 bare calls", Calls::Bare, false),
        ("job, 10 steps recorded", Calls::Steps, false),
        ("job, 10 steps replayed", Calls::Steps, true),
    ] {
        group.bench_function(name, |b| {
            b.to_async(rt)
                .iter_custom(|iters| time(runtime, iters, calls, replayed))
        });
    }
    group.finish();
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let memory = Runtime::builder()
        .store(MemoryStore::builder().min_retention(Duration::ZERO).build())
        .build();
    group(c, &rt, "steps/memory", &memory);

    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let (redis, mut counter) = rt.block_on(async {
        let store = RedisStore::connect(&url).await.unwrap();
        let counter = ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
            .await
            .unwrap();
        (Runtime::builder().store(store).build(), counter)
    });
    group(c, &rt, "steps/redis", &redis);

    // Round trips of one job of each kind.
    rt.block_on(async {
        println!("\n| job (10 calls) on Redis | round trips |");
        println!("|---|---|");
        for (name, calls, replayed) in [
            ("bare calls", Calls::Bare, false),
            ("steps recorded", Calls::Steps, false),
            ("steps replayed", Calls::Steps, true),
        ] {
            let key = NEXT.fetch_add(1, Ordering::Relaxed);
            if replayed {
                let _ = redis.scope(job(key, Calls::Steps, true)).await;
            }
            let before = script_calls(&mut counter).await;
            redis.scope(job(key, calls, false)).await.unwrap();
            let trips = script_calls(&mut counter).await - before;
            println!("| {name} | {trips} |");
        }
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
