//! A request whose lease the heartbeat finds lost raises `LeaseLost` once, not again when the
//! response's write is refused for the same reason.

mod http_support;

use http_support::{Handler, app, charge_request, ready};
use jobguard::http::IdempotencyLayer;
use jobguard::{Event, Runtime};
use jobguard_testkit::faulty::Faulty;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::Service;

#[tokio::test(start_paused = true)]
async fn a_lease_lost_while_the_handler_ran_is_raised_once() {
    let lost = Arc::new(AtomicUsize::new(0));
    let seen = lost.clone();
    let runtime = Runtime::builder()
        .observer(move |e: &Event<'_>| {
            if matches!(e, Event::LeaseLost { .. }) {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        })
        .build();
    // The handler works past a third of the 3 s lease: the heartbeat's renewal is refused.
    let handler = Handler {
        work: Duration::from_secs(2),
        ..Handler::default()
    };
    // Every renewal and completion finds the lease lost.
    let store = Faulty::default();
    store.lose_lease.store(true, Ordering::SeqCst);
    let layer = IdempotencyLayer::new(store).lease(Duration::from_secs(3));
    let mut service = app(handler.clone(), layer);
    ready(&mut service).await;
    let request = charge_request("k");
    let response = runtime.scope(service.call(request)).await.unwrap();
    assert_eq!(response.status(), 201, "the handler's answer goes out");
    assert_eq!(handler.runs(), 1);
    assert_eq!(lost.load(Ordering::SeqCst), 1, "one lost lease, one event");
}
