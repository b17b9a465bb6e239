//! The in-memory store. Placeholder: being written.
