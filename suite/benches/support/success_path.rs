//! The success path's contenders, shared by `benches/retry.rs` (criterion) and
//! `benches/retry_calls.rs` (a plain loop, for a profiler or a CPU-time clock), so that both
//! measure the same code.
//! Included with `#[path]`.

use backon::{ExponentialBuilder, Retryable};
use jobguard::{CircuitBreaker, Policy};
use std::hint::black_box;
use std::io;
use std::time::Duration;
use tokio_retry::strategy::ExponentialBackoff;

/// The success path's work: as small as the peers' examples.
pub async fn answer(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

/// The "bare call": the work behind one plain `async fn`.
pub async fn answer_bare(n: u64) -> Result<u64, io::Error> {
    answer(n).await
}

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s")]
pub async fn answer_retry(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

pub static BREAKER: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));

#[jobguard::retry(attempts = 5, base = "500ms", cap = "8s", breaker = BREAKER)]
pub async fn answer_breaker(n: u64) -> Result<u64, io::Error> {
    Ok(black_box(n) + 1)
}

const CURVE: Policy = Policy::new()
    .attempts(5)
    .base(Duration::from_millis(500))
    .cap(Duration::from_secs(8));

pub async fn answer_policy_run(n: u64) -> Result<u64, io::Error> {
    CURVE.run("bench::answer", async |_| answer(n).await).await
}

pub async fn answer_backon(n: u64) -> Result<u64, io::Error> {
    let curve = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(8))
        .with_max_times(4)
        .with_jitter();
    (|| answer(n)).retry(curve).await
}

pub async fn answer_tokio_retry(n: u64) -> Result<u64, io::Error> {
    let curve = ExponentialBackoff::from_millis(2)
        .factor(250)
        .max_delay(Duration::from_secs(8))
        .map(tokio_retry::strategy::jitter)
        .take(4);
    tokio_retry::Retry::start(curve, || answer(n)).await
}

/// About the least a wrapper that keeps what `#[retry]`'s success path must do can cost: one
/// load of a process-wide "is anyone observing" flag, decided once per call, and the attempt's
/// number in a thread-local word for `attempt()` to read during each poll of the body
/// (set before, the outer value put back after), then the `Ok` handed straight out. Not a retry
/// (an `Err` is returned as it is): a measure of what is left for the engine, not a contender.
mod floor {
    use std::cell::Cell;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll};

    /// Stands for the engine's flag: read as it reads its own, never set here.
    pub static OBSERVED: AtomicBool = AtomicBool::new(false);

    thread_local! {
        static CURRENT: Cell<u64> = const { Cell::new(0) };
    }

    pin_project_lite::pin_project! {
        /// `body` as attempt 1 of a call nobody observes.
        pub struct First<F> {
            observed: bool,
            #[pin]
            body: F,
        }
    }

    /// `body` as attempt 1, the observation decided now.
    #[inline]
    pub fn run<F>(body: F) -> First<F> {
        First {
            observed: OBSERVED.load(Ordering::Relaxed),
            body,
        }
    }

    impl<T, E, F: Future<Output = Result<T, E>>> Future for First<F> {
        /// `None` when someone observes (the engine's slow path would take the call).
        type Output = Option<Result<T, E>>;

        #[inline]
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            /// Puts the outer word back, also when the body panics (as the engine does).
            struct Restore(u64);
            impl Drop for Restore {
                #[inline(always)]
                fn drop(&mut self) {
                    CURRENT.set(self.0);
                }
            }
            let this = self.project();
            if *this.observed {
                return Poll::Ready(None);
            }
            let outer = CURRENT.replace(1);
            // The engine's sign test: an attempt outside that shares its start goes out of line.
            if outer & (1 << 63) != 0 {
                return Poll::Ready(None);
            }
            let restore = Restore(outer);
            let polled = this.body.poll(cx);
            drop(restore);
            polled.map(Some)
        }
    }
}

pub async fn answer_floor(n: u64) -> Result<u64, io::Error> {
    match floor::run(async { Ok(black_box(n) + 1) }).await {
        Some(done) => done,
        None => Err(io::ErrorKind::Other.into()),
    }
}
