//! A shared breaker beside a local one: the success path (no round trip) and a failure (one
//! round trip to Redis), with a bare `PING` through the same kind of connection as the round
//! trip's yardstick. One private `redis-server`, started here.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench fleet -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The yardsticks of a round trip: a `PING`, and a script of the failure script's shape (count
//! in a hash, publish on a channel), through the same kind of connection.
//!
//! The failure group runs one `#[retry(attempts = 1, breaker = ..)]` call that fails (its dead
//! letter to a sink that drops it), on a breaker whose threshold is never reached, so every
//! call is a closed breaker's failure: counted locally, or counted in Redis and waited for.

use criterion::{Criterion, criterion_group, criterion_main};
use jobguard::{CircuitBreaker, Runtime};
use jobguard_testkit::redis::RedisServer;
use std::hint::black_box;
use std::time::Duration;

static LOCAL: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));
static SHARED: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));
static LOCAL_FAILING: CircuitBreaker = CircuitBreaker::new(u32::MAX, Duration::from_secs(30));
static SHARED_FAILING: CircuitBreaker = CircuitBreaker::new(u32::MAX, Duration::from_secs(30));

fn acquire_success(breaker: &CircuitBreaker) {
    match breaker.acquire() {
        Ok(permit) => {
            black_box(1u32);
            permit.success();
        }
        Err(open) => {
            black_box(open);
        }
    }
}

#[jobguard::retry(attempts = 1, breaker = breaker)]
async fn failing(breaker: &'static CircuitBreaker) -> Result<(), jobguard::Error> {
    let _ = breaker;
    Err(jobguard::Error::Timeout)
}

fn fleet(c: &mut Criterion) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let runtime = Runtime::builder()
        .dead_letters(jobguard::from_fn(|_| async { Ok(()) }))
        .build();
    let _ = runtime.install();
    let ping = tokio.block_on(async {
        let store = jobguard::RedisStore::connect(&server.url())
            .await
            .expect("connect");
        SHARED.share(&store, "bench").await.expect("share");
        SHARED_FAILING
            .share(&store, "bench-failing")
            .await
            .expect("share");
        store.connection()
    });

    let mut group = c.benchmark_group("fleet_breaker_success_path");
    group.bench_function("local new(5, 30s): acquire + success", |b| {
        b.iter(|| acquire_success(black_box(&LOCAL)))
    });
    group.bench_function("shared new(5, 30s): acquire + success", |b| {
        b.iter(|| acquire_success(black_box(&SHARED)))
    });
    group.finish();

    let mut group = c.benchmark_group("fleet_breaker_failure");
    group.bench_function("local: one failed call", |b| {
        b.to_async(&tokio)
            .iter(|| async { black_box(failing(&LOCAL_FAILING).await) })
    });
    group.bench_function("shared: one failed call", |b| {
        b.to_async(&tokio)
            .iter(|| async { black_box(failing(&SHARED_FAILING).await) })
    });
    group.bench_function("redis-rs PING (one round trip)", |b| {
        b.to_async(&tokio).iter(|| {
            let mut ping = ping.clone();
            async move {
                let pong: String = redis::cmd("PING").query_async(&mut ping).await.unwrap();
                black_box(pong)
            }
        })
    });
    // A script of the failure script's shape: count in a hash, publish on a channel.
    let script = redis::Script::new(
        "local n = redis.call('HINCRBY', KEYS[1], 'count', 1) \
         redis.call('PUBLISH', KEYS[1], n) return n",
    );
    group.bench_function(
        "redis-rs EVALSHA: HINCRBY + PUBLISH (one round trip)",
        |b| {
            b.to_async(&tokio).iter(|| {
                let mut ping = ping.clone();
                let script = &script;
                async move {
                    let n: i64 = script
                        .key("bench:script")
                        .invoke_async(&mut ping)
                        .await
                        .unwrap();
                    black_box(n)
                }
            })
        },
    );
    group.finish();
    drop(ping);
}

criterion_group!(benches, fleet);
criterion_main!(benches);
