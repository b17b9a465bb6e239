//! Durable jobs on the machine's RabbitMQ, with real worker processes (this test binary run
//! again, see `brokers/mod.rs`) on a quorum queue of each test's own, and a private
//! `redis-server` as the store the workers share: the crash scenarios of `brokers/crash.rs`.
//! On RabbitMQ, the dead worker's unacknowledged delivery comes back when its connection
//! closes; a job is handed back with `basic.reject` (requeue), settled with an ack, and
//! RabbitMQ's own dead-letter route (the parked queue) stays empty.
//!
//! Without RabbitMQ or `redis-server` the tests skip, unless `JOBGUARD_REQUIRE_RABBITMQ=1` /
//! `JOBGUARD_REQUIRE_REDIS=1`.

mod brokers;

use brokers::crash;
use brokers::rabbitmq::Queue;

/// The worker role: runs only when a test below starts this binary as a worker.
#[test]
fn worker() {
    brokers::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_stored_result_and_before_the_ack_is_replayed_on_redelivery() {
    crash::killed_before_the_ack::<Queue>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_kills_its_worker_every_time_is_dead_lettered_once_after_three_crashes() {
    crash::poisoned::<Queue>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_on_every_delivery_is_handed_back_until_the_last_then_dead_lettered_once() {
    crash::failing_on_every_delivery::<Queue>().await;
}
