//! What jobguard's integration tests and benchmarks share, and nothing a user copies: a private
//! `redis-server` per test on a free loopback port ([`redis`]), the machine's RabbitMQ and NATS
//! under names of a test's own ([`broker`]), a private 6-node Redis Cluster
//! ([`cluster`]), a private `postgres` ([`postgres`]) and what its tests' jobs share
//! ([`pg_job`]), one conformance suite for every idempotency store ([`conformance`]), a reader
//! of the Prometheus text format ([`prometheus`]), a counting allocator ([`alloc`]), a
//! `MemoryStore` whose operations can be made to fail ([`faulty`]), the error of a job
//! against a flaky gateway ([`gateway`]) and a headless Chromium over WebDriver ([`chromium`]).
//! Not published.
#![warn(missing_docs)]

pub mod alloc;
pub mod broker;
pub mod chromium;
pub mod cluster;
pub mod conformance;
pub mod faulty;
pub mod gateway;
pub mod pg_job;
pub mod postgres;
mod process;
pub mod prometheus;
pub mod redis;
