//! Support shared by the workspace's integration tests, examples and benchmarks. Not published.
#![warn(missing_docs)]

pub mod prometheus;
pub mod redis;
pub mod scenario;
