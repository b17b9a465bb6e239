//! The Redis store (feature `redis`). Placeholder: being written.
