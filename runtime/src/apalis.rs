//! Durable jobs on [apalis](https://docs.rs/apalis) 1.x (feature `apalis`).
//!
//! apalis delivers every task at least once: its Redis storage re-enqueues the tasks of a worker
//! that stopped heartbeating, and a task whose handler returned `Err` is delivered again later.
//! [`GuardLayer`] tells jobguard which delivery of its task a handler runs in: it reads the
//! task's attempt counter and attempt limit, and puts a [`Delivery`] in scope for the handler's
//! future, where `#[idempotent]` and `#[retry]` read it. With it, a job that keeps failing is
//! retried by `#[retry]` within each delivery, handed back to apalis for the next one, and
//! dead-lettered once, on its last delivery ([below](#one-job-one-dead-letter)).
//!
//! # A worker
//!
#![cfg_attr(all(feature = "redis", feature = "macros"), doc = "```no_run")]
#![cfg_attr(not(all(feature = "redis", feature = "macros")), doc = "```ignore")]
//! use apalis::prelude::*;
//! use apalis_redis::RedisStorage;
//! use jobguard::apalis::GuardLayer;
//! use jobguard::{RedisDeadLetters, RedisStore, Runtime, Transient};
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! #[derive(Debug, Clone, Serialize, Deserialize)]
//! struct Charge {
//!     order_id: String,
//!     amount: u64,
//! }
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Receipt {
//!     order_id: String,
//!     amount: u64,
//! }
//!
//! #[derive(Debug, Transient)]
//! enum GatewayError {
//!     #[transient]
//!     Unavailable,
//!     Declined,
//!     #[transient(from)]
//!     Jobguard(jobguard::Error),
//! }
//! impl std::fmt::Display for GatewayError {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         write!(f, "{self:?}")
//!     }
//! }
//! impl std::error::Error for GatewayError {}
//! impl From<jobguard::Error> for GatewayError {
//!     fn from(e: jobguard::Error) -> Self {
//!         GatewayError::Jobguard(e)
//!     }
//! }
//!
//! // Runs once per order, however often apalis delivers the task.
//! #[jobguard::idempotent(key = job.order_id, scope = "payments.charge", lease = "10s")]
//! #[jobguard::retry(attempts = 3, base = "200ms", cap = "2s")]
//! async fn charge(job: Charge) -> Result<Receipt, GatewayError> {
//!     // the gateway call goes here
//!     Ok(Receipt { order_id: job.order_id.clone(), amount: job.amount })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let url = "redis://127.0.0.1:6379/";
//!     Runtime::builder()
//!         .store(RedisStore::connect(url).await?)
//!         .dead_letters(RedisDeadLetters::connect(url, "jobguard:dead").await?)
//!         .build()
//!         .install()
//!         .map_err(|_| "a jobguard runtime was installed already")?;
//!
//!     let config = apalis_redis::Config::default()
//!         .queue("charges")
//!         .batch_size(1)
//!         .heartbeat_interval(Duration::from_secs(1))
//!         .missed_heartbeats(10);
//!     let mut storage = RedisStorage::<Charge>::new(apalis_redis::connect(url).await?)
//!         .with_config(config);
//!
//!     // The producer's side: each charge is delivered three times at most, then dead-lettered.
//!     let job = Charge { order_id: "order-A".into(), amount: 100 };
//!     storage.push_task(TaskBuilder::new(job).max_attempts(3).build()).await?;
//!
//!     WorkerBuilder::new("charge-worker")
//!         .backend(storage)
//!         .layer(GuardLayer::new())
//!         .build(charge)
//!         .run()
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! # Which delivery is the last
//!
//! apalis counts the attempts of a task (`Task::attempt`) across deliveries: the counter is
//! stored with the task and grows by one each time a handler starts on it. [`GuardLayer`] reads
//! the counter when a delivery starts, so [`Delivery::number`] is 1 on the first one, and
//! [`Delivery::last`] is set when `number` reaches the limit:
//!
//! * [`GuardLayer::deliveries`], when set;
//! * else the task's `max_attempts` (set by the producer with
//!   `TaskBuilder::new(job).max_attempts(3)`; apalis-redis stores 25 when the producer set none);
//! * else 1: the task is delivered once (apalis's `MemoryStorage` never redelivers).
//!
//! apalis-redis 1.0 re-enqueues a failed task until its counter reaches 25, whatever the task's
//! `max_attempts` says; the layer stops it earlier (below). A limit above 25 is never reached
//! there: no delivery would be the last, and no dead letter would be written.
//!
//! A worker that dies mid-task does not count: the broker re-enqueues the task with the counter
//! it had, so the next worker sees the same `number`. The idempotency store counts those crashes.
//!
//! apalis-postgres 1.0 counts differently, and the layer reads it as it is: the task's row keeps
//! `attempts` and `max_attempts` (25 unless the producer sets it); a `Failed` task is fetched
//! again at once while `attempts` is below `max_attempts`; a `Killed` one never; and the tasks
//! of a worker whose heartbeat stopped (`Config::heartbeat_interval` × `missed_heartbeats`) are
//! re-enqueued with `attempts + 1`, so there a crash spends a delivery. Keep `max_attempts`
//! above `crashes` (3 by default), so that the delivery after the last crash is still made and
//! dead-letters the job `crashed`. jobguard's `PgStore` can live in the same database
//! (`PostgresStorage::setup` and `PgStore::migrate` side by side); the repository's
//! `apalis_postgres_durable` test runs the crash, poison and last-delivery cases on it.
//!
//! # One job, one dead letter
//!
//! Under the layer, the give-up of a `#[retry]` (or [`Policy::run`](crate::Policy::run)) depends
//! on the delivery:
//!
//! * on a delivery that is not the last, a give-up that a later delivery could get past (the
//!   attempts ran out, the budget ran out, the breaker was open) writes **no** dead letter: it
//!   raises [`Event::HandedBack`](crate::Event::HandedBack) (`jobguard_handed_back_total`) and
//!   returns the last error, which the handler returns to apalis, and apalis delivers the job
//!   again (apalis-redis: `attempt` seconds later, so 1 s, then 2 s, ...);
//! * on the last delivery, or for a permanent failure on any delivery, it writes the job's one
//!   letter, as it does outside a runner. When the handler then returns an error, the layer sets
//!   the task's status to `Killed`, which apalis retries no more: its retry layer stops, and
//!   apalis-redis puts the task in its dead set instead of re-enqueueing it. So a
//!   dead-lettered job is not delivered again, whatever the broker's own limit;
//! * a refusal that no redelivery can change while the key's record stands
//!   ([`Error::KeyReused`](crate::Error::KeyReused) against a completed record,
//!   [`Error::Unreplayable`](crate::Error::Unreplayable)) writes no letter, and the layer sets
//!   the task `Killed` too: apalis keeps it, with its error, and does not deliver it again.
//!
//! A handler therefore returns the job's error as it is (the worker above has no handler of its
//! own). An error that wrote no letter on the last delivery (jobguard's own: the key
//! `InProgress` on a worker that died, the store out of reach) keeps apalis's `Failed`, and
//! apalis-redis delivers the job again; that delivery, past the limit, is the last one too.
//!
//! # The letter's attempts
//!
//! The letter's `attempts` counts every attempt of every delivery, in the key's record: with
//! `#[idempotent]` outside `#[retry]` (the recommended order), the claim that acquires the key
//! counts the delivery's first attempt, and each retry is counted in the record before it
//! starts ([`Store::attempted`](crate::Store::attempted), one round trip a retry, none on the
//! success path). A delivery cut short by a crash, by the end of a graceful stop's grace, by
//! the budget or the breaker counts what it made; a worker killed between an attempt's count
//! and its first effect leaves one attempt counted that did nothing.
//!
//! Without a claim around the retries (no `#[idempotent]`, or `#[retry]` outside it, where each
//! attempt is a claim of its own), jobguard infers the count from the delivery, since apalis
//! 1.0 keeps nothing per task that could carry one from a delivery to the next:
//! `(number - 1) × policy attempts + this delivery's attempts`, exact only when each earlier
//! delivery made all of the policy's attempts.
//!
//! The letter's `first_attempt` is the first attempt of the last delivery.
//!
//! # Who retries what
//!
//! `#[retry]` retries inside one delivery and inside one claim: the blips a few seconds of
//! backoff ride out (a timeout, a 503, a reset connection), invisible to the broker. The broker's
//! redeliveries handle what one process cannot: a worker that died (its tasks come back once
//! its heartbeat lapses), and failures that outlast one delivery's retries. The recommended
//! configuration:
//!
//! * `#[idempotent(lease = "10s")]` outside `#[retry(attempts = 5, base = "500ms", cap = "8s")]`,
//!   with `RedisStore`: a redelivery replays a finished job, and a dead worker's claim lapses
//!   within seconds (a delivery that finds it still live waits out the rest of its lease, then
//!   takes it over, rather than being handed back with `InProgress`);
//! * the producer pushes tasks with `max_attempts(3)` (or the workers set
//!   `GuardLayer::new().deliveries(3)`, when the producer is not yours): three deliveries of five
//!   attempts, one letter;
//! * no apalis `.retry(..)` layer: `#[retry]` is the in-process retry;
//! * apalis-redis `Config::batch_size(concurrency).heartbeat_interval(1s).missed_heartbeats(10)`:
//!   a worker fetches no more tasks than it runs, so a backlog spreads over the workers, and a
//!   busy worker whose beat is late is not declared dead (its tasks re-enqueued to others while
//!   it still runs them, and the worker itself stopped with "worker not registered"); a dead
//!   worker's tasks come back after about 10 s, about the claim's lease;
//! * the handler returns the job's error to apalis;
//! * on SIGTERM, the worker stops taking tasks (`Worker::run_until`), gives those in flight a
//!   grace period, drops what still runs, and awaits
//!   [`Runtime::shutdown`](crate::Runtime::shutdown) before the process exits: a dropped job's
//!   claim is released (it runs again on another delivery, and no crash is counted).
//!   `examples/worker.rs` does this.
//!
//! # Where the layer goes
//!
//! Add `GuardLayer` after apalis's own `.retry(..)`, if any, so that it sits inside it and each of
//! apalis's in-process retries is a delivery with its own number. The recommended configuration
//! has no apalis retry at all: `#[retry]` handles the blips a few seconds of backoff can ride out,
//! inside one claim, and the broker's redeliveries handle crashes and outages longer than that.
pub use crate::Delivery;

use apalis_core::task::Task;
use apalis_core::task::status::Status;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// The future of a [`GuardService`]: the handler's, with its delivery in scope.
pub type GuardFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// A tower [`Layer`] for apalis's `WorkerBuilder::layer` that puts each task's [`Delivery`] in
/// scope for its handler ([`Delivery::scope`]): `jobguard::attempt()` inside the handler carries
/// it. See the [module docs](self) for a worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuardLayer {
    deliveries: Option<u32>,
}

impl GuardLayer {
    /// A layer that takes the number of deliveries from each task's `max_attempts` (1 when the
    /// task has none).
    pub const fn new() -> Self {
        GuardLayer { deliveries: None }
    }

    /// How many times the runner delivers a task that keeps failing, whatever the task says.
    /// Values below 1 count as 1.
    pub const fn deliveries(mut self, deliveries: u32) -> Self {
        self.deliveries = Some(if deliveries == 0 { 1 } else { deliveries });
        self
    }

    /// The delivery that a handler starting on `task` now runs in.
    pub fn delivery<Args>(&self, task: &Task<Args>) -> Delivery {
        // The counter grows when the handler's future is first polled, inside the worker's
        // innermost layer: here it still holds the deliveries before this one.
        let before = u32::try_from(task.attempt()).unwrap_or(u32::MAX);
        let number = before.saturating_add(1);
        let limit = self.deliveries.unwrap_or_else(|| {
            task.max_attempts()
                .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX).max(1))
        });
        Delivery {
            number,
            last: number >= limit,
        }
    }
}

impl<S> Layer<S> for GuardLayer {
    type Service = GuardService<S>;

    fn layer(&self, inner: S) -> GuardService<S> {
        GuardService {
            inner,
            layer: *self,
        }
    }
}

/// The service [`GuardLayer`] wraps around a worker's handler.
#[derive(Debug, Clone)]
pub struct GuardService<S> {
    inner: S,
    layer: GuardLayer,
}

impl<S, Args> Service<Task<Args>> for GuardService<S>
where
    S: Service<Task<Args>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = GuardFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, task: Task<Args>) -> Self::Future {
        let delivery = self.layer.delivery(&task);
        let status = task.raw_status().clone();
        let handled = delivery.scope_settled(self.inner.call(task));
        Box::pin(async move {
            let (result, dead_lettered) = handled.await;
            if dead_lettered && result.is_err() {
                // The job's one dead letter is written: the runner must not deliver it again.
                // apalis retries nothing `Killed` (its retry layer, apalis-redis's re-enqueue).
                status.store(Status::Killed);
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apalis_core::task::builder::TaskBuilder;

    fn task(attempt: usize, max_attempts: Option<usize>) -> Task<()> {
        let mut builder = TaskBuilder::new(()).attempt(attempt);
        if let Some(max) = max_attempts {
            builder = builder.max_attempts(max);
        }
        builder.build()
    }

    #[test]
    fn a_task_without_a_limit_is_delivered_once() {
        let d = GuardLayer::new().delivery(&task(0, None));
        assert_eq!(
            d,
            Delivery {
                number: 1,
                last: true
            }
        );
    }

    #[test]
    fn the_tasks_limit_decides_the_last_delivery() {
        let layer = GuardLayer::new();
        assert_eq!(
            layer.delivery(&task(0, Some(3))),
            Delivery {
                number: 1,
                last: false
            }
        );
        assert_eq!(
            layer.delivery(&task(1, Some(3))),
            Delivery {
                number: 2,
                last: false
            }
        );
        assert_eq!(
            layer.delivery(&task(2, Some(3))),
            Delivery {
                number: 3,
                last: true
            }
        );
        // A task delivered past its limit is on its last delivery too.
        assert_eq!(
            layer.delivery(&task(7, Some(3))),
            Delivery {
                number: 8,
                last: true
            }
        );
    }

    #[test]
    fn the_layers_limit_overrides_the_tasks() {
        let layer = GuardLayer::new().deliveries(25);
        assert!(!layer.delivery(&task(2, Some(3))).last);
        assert!(layer.delivery(&task(24, Some(3))).last);
        assert!(
            GuardLayer::new()
                .deliveries(0)
                .delivery(&task(0, Some(5)))
                .last
        );
    }

    #[tokio::test]
    async fn the_handler_sees_its_delivery_and_nothing_outside_it() {
        let handler = tower_service_fn(|_task: Task<()>| async { Delivery::current() });
        let mut service = GuardLayer::new().layer(handler);
        let seen = service.call(task(1, Some(3))).await.unwrap();
        assert_eq!(
            seen,
            Some(Delivery {
                number: 2,
                last: false
            })
        );
        assert_eq!(Delivery::current(), None);
    }

    /// A handler whose `#[retry]` loop (here [`crate::Policy::run`]) fails every attempt.
    fn failing_service() -> TryServiceFn {
        TryServiceFn
    }

    struct TryServiceFn;

    impl Service<Task<()>> for TryServiceFn {
        type Response = ();
        type Error = std::io::Error;
        type Future = Pin<Box<dyn Future<Output = Result<(), std::io::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Task<()>) -> Self::Future {
            Box::pin(async {
                crate::Policy::new()
                    .attempts(2)
                    .jitter(crate::Jitter::None)
                    .run("job", async |_| {
                        Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
                    })
                    .await
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_whose_delivery_wrote_its_letter_is_killed_and_one_handed_back_is_not() {
        use apalis_core::task::status::Status;
        let letters = crate::MemoryDeadLetters::new();
        let runtime = crate::Runtime::builder()
            .dead_letters(letters.clone())
            .build();
        let mut service = GuardLayer::new().layer(failing_service());
        // Delivery 2 of 3: handed back, the runner may deliver it again.
        let second = task(1, Some(3));
        let status = second.raw_status().clone();
        status.store(Status::Failed);
        assert!(runtime.scope(service.call(second)).await.is_err());
        assert_eq!(status.load(), Status::Failed);
        assert!(letters.is_empty());
        // Delivery 3 of 3: the letter, and the runner must not deliver it again.
        let third = task(2, Some(3));
        let status = third.raw_status().clone();
        status.store(Status::Failed);
        assert!(runtime.scope(service.call(third)).await.is_err());
        assert_eq!(status.load(), Status::Killed);
        let letters = letters.letters();
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].attempts, 3 * 2);
    }

    /// A service from a closure, without tower's `util` feature.
    fn tower_service_fn<F, Fut>(f: F) -> ServiceFn<F>
    where
        F: FnMut(Task<()>) -> Fut,
        Fut: Future,
    {
        ServiceFn(f)
    }

    struct ServiceFn<F>(F);

    impl<F, Fut> Service<Task<()>> for ServiceFn<F>
    where
        F: FnMut(Task<()>) -> Fut,
        Fut: Future,
    {
        type Response = Fut::Output;
        type Error = std::convert::Infallible;
        type Future = OkFuture<Fut>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, task: Task<()>) -> Self::Future {
            OkFuture(Box::pin((self.0)(task)))
        }
    }

    struct OkFuture<Fut>(std::pin::Pin<Box<Fut>>);

    impl<Fut: Future> Future for OkFuture<Fut> {
        type Output = Result<Fut::Output, std::convert::Infallible>;
        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            self.0.as_mut().poll(cx).map(Ok)
        }
    }
}
