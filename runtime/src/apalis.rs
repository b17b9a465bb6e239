//! Durable jobs on [apalis](https://docs.rs/apalis) 1.x (feature `apalis`).
//!
//! apalis delivers every task at least once: its Redis storage re-enqueues the tasks of a worker
//! that stopped heartbeating, and a task whose handler returned `Err` is delivered again later.
//! [`GuardLayer`] tells jobguard which delivery of its task a handler runs in: it reads the
//! task's attempt counter and attempt limit, and puts a [`Delivery`] in scope for the handler's
//! future, where `#[idempotent]` and `#[retry]` read it.
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
//!         .install();
//!
//!     let config = apalis_redis::Config::default()
//!         .queue("charges")
//!         .heartbeat_interval(Duration::from_secs(1))
//!         .missed_heartbeats(2);
//!     let storage = RedisStorage::<Charge>::new(apalis_redis::connect(url).await?)
//!         .with_config(config);
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
//! stored with the task and grows by one each time a handler starts on it. A task that fails is
//! delivered again until the counter reaches its limit. [`GuardLayer`] reads the counter when a
//! delivery starts, so [`Delivery::number`] is 1 on the first one, and [`Delivery::last`] is set
//! when `number` reaches the limit:
//!
//! * [`GuardLayer::deliveries`], when set;
//! * else the task's `max_attempts` (apalis-redis stores 25 unless the producer set another);
//! * else 1: the task is delivered once (apalis's `MemoryStorage` never redelivers).
//!
//! apalis-redis 1.0 re-enqueues a failed task until its counter reaches 25, whatever the task's
//! `max_attempts` says; push tasks with the default `max_attempts`, or set
//! `GuardLayer::new().deliveries(25)`.
//!
//! A worker that dies mid-task does not count: the broker re-enqueues the task with the counter
//! it had, so the next worker sees the same `number`. The idempotency store counts those crashes.
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
