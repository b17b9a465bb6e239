//! What jobguard's integration tests and benchmarks share, and nothing a user copies: a private
//! `redis-server` per test on a free loopback port ([`redis`]), a reader of the Prometheus text
//! format ([`prometheus`]) and a counting allocator ([`alloc`]). Not published.
#![warn(missing_docs)]

pub mod alloc;
pub mod prometheus;
pub mod redis;
