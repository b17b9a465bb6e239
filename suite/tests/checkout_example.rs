//! `cargo run --example checkout`, as a test against a private `redis-server`: the mail server
//! is down for the receipt's first two sends, `#[retry]` around the job runs it three times, and
//! the recorded capture and reservation are replayed: the payment is captured once, the stock
//! reserved once, the receipt sent once.

#[allow(dead_code)]
#[path = "../../examples/checkout.rs"]
mod example;

use example::Effects;
use jobguard_testkit::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receipt_fails_twice_and_each_effect_happens_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let effects = example::run(&server.url(), "order-1", 2).await.unwrap();
    assert_eq!(
        effects,
        Effects {
            captured: 1,
            reserved: 1,
            receipts: 1,
            mail_tries: 3,
        }
    );
}
