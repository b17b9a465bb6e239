//! `RedisStore::connect` warns, once per process, when the server's `maxmemory-policy` can evict
//! a live claim, and says nothing under `noeviction`. Against a private `redis-server`; the
//! warning is seen by a capturing `tracing` subscriber.

use jobguard::store::redis::RedisStore;
use jobguard_testkit::redis::RedisServer;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The messages of the `WARN` events with target `jobguard`.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() == Level::WARN && meta.target() == "jobguard" {
            let mut message = String::new();
            event.record(&mut Message(&mut message));
            self.0.lock().unwrap().push(message);
        }
    }
}

async fn set(server: &RedisServer, name: &str, value: &str) {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn connect_warns_once_when_the_server_can_evict_claims() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    // No maxmemory: nothing is evicted, nothing said, whatever the policy.
    set(&server, "maxmemory-policy", "allkeys-lru").await;
    RedisStore::connect(&server.url()).await.unwrap();
    // noeviction with a limit: safe.
    set(&server, "maxmemory", "100mb").await;
    set(&server, "maxmemory-policy", "noeviction").await;
    RedisStore::connect(&server.url()).await.unwrap();
    assert!(warnings.0.lock().unwrap().is_empty());

    // A limit and a policy that evicts any key: one warning, naming both.
    set(&server, "maxmemory-policy", "allkeys-lru").await;
    RedisStore::connect(&server.url()).await.unwrap();
    RedisStore::connect(&server.url()).await.unwrap();
    let seen = warnings.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("allkeys-lru"), "{}", seen[0]);
    assert!(seen[0].contains("noeviction"), "{}", seen[0]);
    assert!(seen[0].contains("live claims"), "{}", seen[0]);
}
