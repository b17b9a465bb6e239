//! A request dropped while its handler runs (the server cancels it, as when the connection
//! closes) releases its claim, so the key is free again.

mod http_support;

use http_support::{Handler, app, charge_request, ready};
use jobguard::http::IdempotencyLayer;
use jobguard::{Claim, MemoryStore, Store, StoreKey};
use std::time::Duration;
use tower::Service;

#[tokio::test]
async fn a_request_dropped_mid_handler_releases_its_claim() {
    let store = MemoryStore::new();
    let (handler, _gate) = Handler::gated();
    let mut service = app(handler.clone(), IdempotencyLayer::new(store.clone()));
    ready(&mut service).await;
    let request = charge_request("k");
    // Polled here, not spawned, so that dropping it below is the cancellation, with nothing
    // run in between.
    let mut running = Box::pin(service.call(request));
    tokio::select! {
        done = &mut running => panic!("the gated handler answered: {done:?}"),
        () = handler.entered.notified() => {}
    }
    assert_eq!(store.len(), 1, "the key is claimed while the handler runs");
    // The layer's key in the store: its default scope, the header's value.
    let key = StoreKey {
        scope: "http",
        key: "k",
    };
    let lease = Duration::from_secs(30);
    assert!(matches!(
        store.claim(key, "probe", None, lease).await,
        Ok(Claim::InProgress { .. })
    ));

    drop(running);
    // The embedded store answers at once, so the claim is released as the request is dropped:
    // the key is free with nothing run in between. (A released key keeps a small record of its
    // history, so the store is not empty; the key is free.)
    assert_eq!(
        store.claim(key, "probe", None, lease).await,
        Ok(Claim::Acquired),
        "the claim was released"
    );
}
