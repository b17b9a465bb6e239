//! Durable jobs on the machine's NATS JetStream, with real worker processes (this test binary
//! run again, see `brokers/mod.rs`) on a work-queue stream and durable pull consumer of each
//! test's own (`ack_wait` 2 s), and a private `redis-server` as the store the workers share: the
//! crash scenarios of `brokers/crash.rs`. On JetStream, the dead worker's delivery comes back
//! once `ack_wait` lapses; a job is handed back with `-NAK`, and settled by an ack or `+TERM`,
//! which drops it from the work queue.
//!
//! Without NATS or `redis-server` the tests skip, unless `JOBGUARD_REQUIRE_NATS=1` /
//! `JOBGUARD_REQUIRE_REDIS=1`.

mod brokers;

use brokers::crash;
use brokers::nats::Stream;

/// The worker role: runs only when a test below starts this binary as a worker.
#[test]
fn worker() {
    brokers::worker_if_asked();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_stored_result_and_before_the_ack_is_replayed_on_redelivery() {
    crash::killed_before_the_ack::<Stream>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_kills_its_worker_every_time_is_dead_lettered_once_after_three_crashes() {
    crash::poisoned::<Stream>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_on_every_delivery_is_handed_back_until_the_last_then_dead_lettered_once() {
    crash::failing_on_every_delivery::<Stream>().await;
}
