//! Jitter bounds over many seeded draws: every delay lies in its range for `none`, `full` and
//! `equal`, `decorrelated` always within `[base, cap]`; one seed gives one sequence, and
//! different seeds differ. Checked through `#[retry]` and `Policy::run` with
//! `Runtime::builder().seed(..)`, and unit by unit through `Jitter::apply`.

use jobguard::{Event, Jitter, MemoryDeadLetters, Policy, Runtime, Transient};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway timeout")
    }
}

const BASE: Duration = Duration::from_millis(100);
const CAP: Duration = Duration::from_millis(1600);
/// Job calls per check; each makes `ATTEMPTS - 1` draws.
const CALLS: usize = 300;
const ATTEMPTS: u32 = 7;

#[jobguard::retry(attempts = 7, base = "100ms", cap = "1600ms", jitter = full)]
async fn full() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 7, base = "100ms", cap = "1600ms", jitter = equal)]
async fn equal() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 7, base = "100ms", cap = "1600ms", jitter = decorrelated)]
async fn decorrelated() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 7, base = "100ms", cap = "1600ms", jitter = none)]
async fn none() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

/// Every `(retry, delay)` of `CALLS` calls of `job`, one call after another, under `seed`.
async fn draws<F: Future<Output = Result<(), GatewayError>>>(
    seed: u64,
    job: impl Fn() -> F,
) -> Vec<Vec<Duration>> {
    let delays = Arc::new(Mutex::new(Vec::new()));
    let seen = delays.clone();
    let runtime = Runtime::builder()
        .seed(seed)
        .dead_letters(MemoryDeadLetters::with_capacity(1))
        .observer(move |e: &Event<'_>| {
            if let Event::Retry { delay, .. } = e {
                seen.lock().unwrap().push(*delay);
            }
        })
        .build();
    let mut calls = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        runtime.scope(job()).await.unwrap_err();
        calls.push(std::mem::take(&mut *delays.lock().unwrap()));
    }
    calls
}

/// The un-jittered delay before retry `n` (from 1).
fn curve(n: usize) -> Duration {
    Policy::new().base(BASE).cap(CAP).delay(n as u32)
}

/// The mean of `delay / curve` over every draw: near 0.5 for full, 0.75 for equal.
fn mean_ratio(calls: &[Vec<Duration>]) -> f64 {
    let ratios: Vec<f64> = calls
        .iter()
        .flat_map(|c| {
            c.iter()
                .enumerate()
                .map(|(i, d)| d.as_secs_f64() / curve(i + 1).as_secs_f64())
        })
        .collect();
    ratios.iter().sum::<f64>() / ratios.len() as f64
}

#[tokio::test(start_paused = true)]
async fn none_is_exactly_the_curve() {
    for call in draws(1, none).await {
        assert_eq!(call, (1..ATTEMPTS as usize).map(curve).collect::<Vec<_>>());
    }
}

#[tokio::test(start_paused = true)]
async fn full_jitter_lies_in_zero_to_the_curve_and_spreads_over_it() {
    let calls = draws(7, full).await;
    for call in &calls {
        assert_eq!(call.len(), ATTEMPTS as usize - 1);
        for (i, d) in call.iter().enumerate() {
            assert!(
                *d <= curve(i + 1),
                "retry {}: {d:?} > {:?}",
                i + 1,
                curve(i + 1)
            );
        }
    }
    let mean = mean_ratio(&calls);
    assert!(
        (0.45..=0.55).contains(&mean),
        "mean ratio {mean}: not uniform over [0, curve]"
    );
    let lowest = *calls.iter().flatten().min().unwrap();
    assert!(
        lowest < BASE / 10,
        "full jitter should reach near zero, lowest {lowest:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn equal_jitter_lies_in_half_the_curve_to_the_curve() {
    let calls = draws(7, equal).await;
    for call in &calls {
        for (i, d) in call.iter().enumerate() {
            let c = curve(i + 1);
            assert!(
                c / 2 <= *d && *d <= c,
                "retry {}: {d:?} outside [{:?}, {c:?}]",
                i + 1,
                c / 2
            );
        }
    }
    let mean = mean_ratio(&calls);
    assert!(
        (0.70..=0.80).contains(&mean),
        "mean ratio {mean}: not uniform over [curve/2, curve]"
    );
}

#[tokio::test(start_paused = true)]
async fn decorrelated_jitter_stays_within_base_and_cap_and_grows_from_the_previous_delay() {
    let calls = draws(7, decorrelated).await;
    let mut at_least_once_above_curve = false;
    for call in &calls {
        let mut previous = BASE;
        for (i, d) in call.iter().enumerate() {
            assert!(
                BASE <= *d && *d <= CAP,
                "retry {}: {d:?} outside [{BASE:?}, {CAP:?}]",
                i + 1
            );
            assert!(
                *d <= (previous * 3).min(CAP),
                "retry {}: {d:?} > 3 x {previous:?}",
                i + 1
            );
            at_least_once_above_curve |= *d > curve(i + 1);
            previous = *d;
        }
    }
    // Not the exponential curve in disguise: it wanders above it too.
    assert!(at_least_once_above_curve);
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_sequence() {
    assert_eq!(draws(42, full).await, draws(42, full).await);
    assert_eq!(draws(42, decorrelated).await, draws(42, decorrelated).await);
}

#[tokio::test(start_paused = true)]
async fn different_seeds_give_different_sequences() {
    let a = draws(1, full).await;
    let b = draws(2, full).await;
    assert_ne!(a, b);
    // Not merely one draw apart: most calls differ.
    let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert!(
        differing > CALLS * 9 / 10,
        "{differing} of {CALLS} calls differ"
    );
}

#[tokio::test(start_paused = true)]
async fn each_call_of_one_runtime_draws_its_own_stream() {
    let calls = draws(9, full).await;
    let distinct: std::collections::HashSet<_> = calls.iter().collect();
    assert_eq!(distinct.len(), calls.len());
}

#[tokio::test(start_paused = true)]
async fn policy_run_draws_from_the_seeded_runtime_too() {
    async fn run(seed: u64) -> Vec<Duration> {
        let delays = Arc::new(Mutex::new(Vec::new()));
        let seen = delays.clone();
        let runtime = Runtime::builder()
            .seed(seed)
            .dead_letters(MemoryDeadLetters::new())
            .observer(move |e: &Event<'_>| {
                if let Event::Retry { delay, .. } = e {
                    seen.lock().unwrap().push(*delay);
                }
            })
            .build();
        let policy = Policy::new()
            .attempts(ATTEMPTS)
            .base(BASE)
            .cap(CAP)
            .jitter(Jitter::Equal);
        for _ in 0..20 {
            let _: Result<(), _> = runtime
                .scope(policy.run("run", async |_| {
                    Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
                }))
                .await;
        }
        delays.lock().unwrap().clone()
    }
    let a = run(5).await;
    assert_eq!(a.len(), 20 * (ATTEMPTS as usize - 1));
    for (i, d) in a.iter().enumerate() {
        let c = curve(i % (ATTEMPTS as usize - 1) + 1);
        assert!(c / 2 <= *d && *d <= c, "{d:?} outside [{:?}, {c:?}]", c / 2);
    }
    assert_eq!(a, run(5).await);
    assert_ne!(a, run(6).await);
}

// Unit level: `Jitter::apply` with a seeded `SmallRng`.

const DRAWS: u32 = 20_000;

#[test]
fn apply_none_returns_the_curve() {
    let mut rng = SmallRng::seed_from_u64(1);
    for n in 1..=12 {
        let c = curve(n);
        assert_eq!(Jitter::None.apply(c, BASE, BASE, CAP, &mut rng), c);
    }
}

#[test]
fn apply_full_and_equal_stay_in_range_for_every_retry() {
    let mut rng = SmallRng::seed_from_u64(2);
    for i in 0..DRAWS {
        let c = curve((i % 12) as usize + 1);
        let f = Jitter::Full.apply(c, BASE, BASE, CAP, &mut rng);
        assert!(f <= c, "full {f:?} > {c:?}");
        let e = Jitter::Equal.apply(c, BASE, BASE, CAP, &mut rng);
        assert!(
            c / 2 <= e && e <= c,
            "equal {e:?} outside [{:?}, {c:?}]",
            c / 2
        );
    }
}

#[test]
fn apply_decorrelated_stays_within_base_and_cap_over_long_chains() {
    let mut rng = SmallRng::seed_from_u64(3);
    let mut previous = BASE;
    let mut seen_cap_region = false;
    for _ in 0..DRAWS {
        let d = Jitter::Decorrelated.apply(Duration::ZERO, previous, BASE, CAP, &mut rng);
        assert!(BASE <= d && d <= CAP, "{d:?} outside [{BASE:?}, {CAP:?}]");
        assert!(d <= (previous * 3).min(CAP));
        seen_cap_region |= d > CAP * 9 / 10;
        previous = d;
    }
    assert!(seen_cap_region, "a long chain should reach near the cap");
}

#[test]
fn apply_handles_degenerate_ranges() {
    let mut rng = SmallRng::seed_from_u64(4);
    let z = Duration::ZERO;
    assert_eq!(Jitter::Full.apply(z, z, z, z, &mut rng), z);
    assert_eq!(Jitter::Equal.apply(z, z, z, z, &mut rng), z);
    assert_eq!(Jitter::Decorrelated.apply(z, z, z, z, &mut rng), z);
    // base == cap: decorrelated has nowhere to go.
    assert_eq!(
        Jitter::Decorrelated.apply(BASE, BASE, BASE, BASE, &mut rng),
        BASE
    );
    // Huge delays do not overflow.
    let max = Duration::MAX;
    assert!(Jitter::Full.apply(max, max, max, max, &mut rng) <= max);
    let d = Jitter::Decorrelated.apply(max, max, BASE, max, &mut rng);
    assert!(d >= BASE);
}

#[test]
fn apply_with_one_seed_repeats_and_with_another_differs() {
    let seq = |seed| {
        let mut rng = SmallRng::seed_from_u64(seed);
        (1..=50)
            .map(|n| Jitter::Full.apply(curve(n % 6 + 1), BASE, BASE, CAP, &mut rng))
            .collect::<Vec<_>>()
    };
    assert_eq!(seq(11), seq(11));
    assert_ne!(seq(11), seq(12));
}
