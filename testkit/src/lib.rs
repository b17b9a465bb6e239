//! What jobguard's integration tests and benchmarks share, and nothing a user copies: a private
//! `redis-server` per test on a free loopback port ([`redis`]) and a reader of the Prometheus
//! text format ([`prometheus`]). Not published.
#![warn(missing_docs)]

pub mod prometheus;
pub mod redis;
