//! `Policy::run` with nobody watching (a test binary of its own: a runtime with an observer,
//! which `tests/policy_run.rs` builds, marks the whole process as watched): the call starts with
//! its first attempt alone, as `#[retry]` does, and calls its closure once per attempt.

use jobguard::{Jitter, Policy};
use jobguard_testkit::gateway::GatewayError;
use std::time::Duration;

const POLICY: Policy = Policy::new()
    .attempts(5)
    .base(Duration::from_millis(500))
    .cap(Duration::from_secs(8))
    .jitter(Jitter::None);

/// With nobody watching, a call starts with its first attempt alone, as `#[retry]` does; a
/// closure that does work before its `async` part still does it once per attempt.
#[tokio::test(start_paused = true)]
async fn a_call_nobody_watches_calls_its_closure_once_per_attempt() {
    let calls = std::cell::Cell::new(0u32);
    let eager = |attempt: u32| {
        calls.set(calls.get() + 1);
        async move {
            assert_eq!(jobguard::attempt().map(|a| a.number), Some(attempt));
            if attempt < 3 {
                Err(GatewayError::Timeout)
            } else {
                Ok(attempt)
            }
        }
    };
    assert_eq!(POLICY.run("eager", eager).await, Ok(3));
    assert_eq!(calls.get(), 3);

    calls.set(0);
    let declined = |_: u32| {
        calls.set(calls.get() + 1);
        async { Err::<u32, _>(GatewayError::Declined) }
    };
    assert_eq!(
        POLICY.run("declined", declined).await,
        Err(GatewayError::Declined)
    );
    assert_eq!(calls.get(), 1, "a permanent failure is not tried again");

    calls.set(0);
    let at_once = |attempt: u32| {
        calls.set(calls.get() + 1);
        async move { Ok::<u32, GatewayError>(attempt) }
    };
    assert_eq!(POLICY.run("at_once", at_once).await, Ok(1));
    assert_eq!(calls.get(), 1);
}
