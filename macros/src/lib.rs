//! Attribute macros for [jobguard](https://docs.rs/jobguard). Depend on `jobguard`, which
//! re-exports them and documents them; the expansions call `jobguard`'s private support module,
//! so the two crates move in lockstep.
//!
//! Each macro is one line here; the work is in `args` (parsing), `validate` (checking the
//! function), `expand` (the expansion) and `transient` (the derive), all on `proc_macro2` so
//! they can be unit-tested.

mod args;
mod duration;
mod expand;
mod transient;
mod validate;

#[cfg(test)]
mod snapshot;

use proc_macro::TokenStream;

/// Retries an `async fn` returning `Result` on failures that can succeed on a second try.
/// Documented on `jobguard::retry`.
#[proc_macro_attribute]
pub fn retry(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::attribute(expand::Kind::Retry, args.into(), item.into()).into()
}

/// Makes an `async fn` safe to run twice: the second run replays the first one's result.
/// Documented on `jobguard::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::attribute(expand::Kind::Idempotent, args.into(), item.into()).into()
}

/// Records an `async fn`'s `Ok` value as a durable step of the job it runs in, and replays it on
/// every later run of that job. Documented on `jobguard::step`.
#[proc_macro_attribute]
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::attribute(expand::Kind::Step, args.into(), item.into()).into()
}

/// Derives `jobguard::Transient` for an error enum. Documented on `jobguard::Transient`.
#[proc_macro_derive(Transient, attributes(transient))]
pub fn derive_transient(input: TokenStream) -> TokenStream {
    transient::derive(input.into()).into()
}
