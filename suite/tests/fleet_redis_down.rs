//! The fleet's Redis killed under two worker processes sharing a breaker and a retry budget: no
//! worker panics, each raises `Event::Shared { shared: false }` for both and goes on with its
//! own breaker (which opens on its own failures, and only its own); with Redis started again on
//! the same port, each rejoins (`shared: true`), and the breaker is the fleet's again: failures
//! on one worker open it on the other.

mod fleet;

use fleet::{Fleet, THRESHOLD, last_shared};
use std::time::Duration;

/// The worker role: runs only when the test below starts this binary as a worker.
#[test]
fn worker() {
    fleet::worker_if_asked();
}

const WITHIN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_fall_back_to_their_own_breaker_and_share_again_when_redis_is_back() {
    let Some(mut fleet) = Fleet::start(2, "breaker,budget").await else {
        return;
    };
    fleet.gateway("down").await;

    fleet.redis.stop();
    for id in 0..2 {
        fleet
            .ask_until(id, "events", WITHIN, |e| {
                last_shared(e, "breaker", false) && last_shared(e, "retry_budget", false)
            })
            .await;
    }
    // On their own: worker 0's failures open worker 0's breaker, and not worker 1's.
    let calls = format!("calls {THRESHOLD}");
    assert_eq!(fleet.ask(0, &calls).await, "done open");
    assert_eq!(fleet.ask(1, "state").await, "closed");

    // The gateway recovers while Redis is down; Redis comes back on the same port.
    fleet.gateway("up").await;
    fleet.redis.restart();
    for id in 0..2 {
        fleet
            .ask_until(id, "events", WITHIN, |e| {
                last_shared(e, "breaker", true) && last_shared(e, "retry_budget", true)
            })
            .await;
    }
    // Worker 0 may have rejoined while still open, opening the fleet's breaker for the rest of
    // its cooldown; calls close it again (a probe gets through).
    for id in 0..2 {
        fleet
            .ask_until(id, "calls 1", WITHIN, |s| s == "done closed")
            .await;
    }
    // Shared again: failures on worker 1 open the breaker on worker 0.
    fleet.gateway("down").await;
    assert_eq!(fleet.ask(1, &calls).await, "done open");
    fleet.ask_until(0, "state", WITHIN, |s| s == "open").await;
}
