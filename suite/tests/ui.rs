//! The compile-time suite: every misuse of `#[retry]`, `#[idempotent]` (the `idempotent_*`
//! cases, alone and beside `#[retry]`), `#[step]` (the `step_*` cases) and
//! `#[derive(Transient)]` is an error in words on the span that is wrong (`tests/ui/fail`, each
//! with the `.stderr` it must print), and every supported shape of function and of `key`
//! compiles and runs (`tests/ui/pass`).
//!
//! Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p jobguard-suite --all-features --test ui`, then read the
//! diff: each must show jobguard's own message on the user's tokens.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
