//! A circuit breaker's success path, check + record on a closed breaker, for jobguard's
//! `CircuitBreaker` beside `failsafe` and `recloser`, in one run.
//!
//! ```text
//! cargo bench -p jobguard-suite --bench breaker -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Each breaker is configured the way its crate's docs start: jobguard and failsafe open after
//! consecutive failures; recloser (and jobguard's `failure_rate`) keep a sliding window of calls.

use criterion::{Criterion, criterion_group, criterion_main};
use failsafe::CircuitBreaker as _;
use std::hint::black_box;
use std::time::Duration;

static CONSECUTIVE: jobguard::CircuitBreaker =
    jobguard::CircuitBreaker::new(5, Duration::from_secs(30));
static RATE: jobguard::CircuitBreaker =
    jobguard::CircuitBreaker::failure_rate(0.5, 20, Duration::from_secs(30));

fn jobguard_check_record(breaker: &jobguard::CircuitBreaker) {
    match breaker.acquire() {
        Ok(permit) => {
            black_box(1u32);
            permit.success();
        }
        Err(retry_in) => {
            black_box(retry_in);
        }
    }
}

fn success_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("breaker_success_path");

    group.bench_function("jobguard new(5, 30s): acquire + success", |b| {
        b.iter(|| jobguard_check_record(black_box(&CONSECUTIVE)))
    });
    group.bench_function(
        "jobguard failure_rate(0.5, 20, 30s): acquire + success",
        |b| b.iter(|| jobguard_check_record(black_box(&RATE))),
    );

    let failsafe = failsafe::Config::new().build();
    group.bench_function("failsafe Config::new(): call(Ok)", |b| {
        b.iter(|| black_box(&failsafe).call(|| Ok::<u32, ()>(black_box(1))))
    });
    group.bench_function(
        "failsafe Config::new(): is_call_permitted + on_success",
        |b| {
            b.iter(|| {
                let cb = black_box(&failsafe);
                if cb.is_call_permitted() {
                    black_box(1u32);
                    cb.on_success();
                }
            })
        },
    );

    let recloser = recloser::Recloser::default();
    group.bench_function("recloser default: call(Ok)", |b| {
        b.iter(|| black_box(&recloser).call(|| Ok::<u32, ()>(black_box(1))))
    });

    group.finish();
}

criterion_group!(benches, success_path);
criterion_main!(benches);
