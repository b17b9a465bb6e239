//! `examples/retry.rs` prints the flaky call recovering with each attempt and delay as it
//! happens, and the permanent one failing fast. Run here on a paused clock, so the times are
//! exact.

#[allow(dead_code)]
#[path = "../../examples/retry.rs"]
mod example;

use std::sync::{Arc, Mutex};

#[tokio::test(start_paused = true)]
async fn the_example_prints_each_attempt_and_delay_and_the_fast_failure() {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    example::run(Arc::new(move |line| sink.lock().unwrap().push(line))).await;
    assert_eq!(
        *lines.lock().unwrap(),
        [
            "[   0ms] flaky_fetch: attempt 1",
            "[   0ms] flaky_fetch: attempt 1 failed: 503 service unavailable; retrying in 200ms",
            "[ 200ms] flaky_fetch: attempt 2",
            "[ 200ms] flaky_fetch: attempt 2 failed: 503 service unavailable; retrying in 400ms",
            "[ 600ms] flaky_fetch: attempt 3",
            "[ 600ms] flaky_fetch: succeeded after 3 attempt(s)",
            "flaky_fetch returned Ok(\"200 OK: order-A\")",
            "[ 600ms] missing_fetch: attempt 1",
            "[ 600ms] missing_fetch: gave up (permanent) after 1 attempt(s): 404 not found",
            "missing_fetch returned Err(NotFound)",
            "dead letter: missing_fetch (permanent, 1 attempt(s)): 404 not found",
        ]
    );
}
