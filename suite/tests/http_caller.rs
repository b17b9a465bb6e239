//! Keys belong to their caller by default: two clients with different credentials that send the
//! same key and the same request each run the handler once and each get their own response, on
//! `MemoryStore`, a private `redis-server` and a private `postgres`; no raw credential reaches a
//! store or the log. A new token is a new caller unless `.scope` names the principal; a cookie
//! session counts as a credential; `.shared_keys()` is one namespace, chosen explicitly; anonymous
//! callers share one scope, and the layer says so once.

mod http_support;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::Full;
use http_support::{Client, Handler, Reply, app, serve};
use jobguard::http::IdempotencyLayer;
use jobguard::store::postgres::PgStore;
use jobguard::{MemoryStore, RedisStore, Store, StoreKey};
use jobguard_testkit::postgres::PgServer;
use jobguard_testkit::redis::RedisServer;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const ALICE: &str = "Bearer alice-7f3c-secret";
const BOB: &str = "Bearer bob-91d2-secret";

/// Every event and span the process logs while it is set, as text.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

struct Text<'a>(&'a mut String);

impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl<S: Subscriber> Layer<S> for Log {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut line = attrs.metadata().name().to_owned();
        attrs.record(&mut Text(&mut line));
        self.0.lock().unwrap().push(line);
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Text(&mut line));
        self.0.lock().unwrap().push(line);
    }
}

impl Log {
    /// Captures this thread's events until the guard drops (the tests run on one thread).
    fn capture() -> (Log, tracing::subscriber::DefaultGuard) {
        let log = Log::default();
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(log.clone()));
        (log, guard)
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// `POST /charge/order-A` with `Idempotency-Key: idem-1`, the same body, and these headers.
async fn charge(client: &Client, headers: &[(&str, &str)]) -> Reply {
    let mut request = http::Request::post("/charge/order-A").header("idempotency-key", "idem-1");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    client
        .send_request(request.body(Full::from("{\"amount\":100}")).unwrap())
        .await
}

/// The receipt's run number: which run of the handler answered.
fn run(reply: &Reply) -> u64 {
    assert_eq!(reply.status.as_u16(), 201, "{reply:?}");
    reply.json()["run"].as_u64().expect("a run number")
}

/// Alice and Bob send the same key and the same request: each runs the handler once and gets
/// its own response; a repeat from either replays its own. Returns the log of the run.
async fn two_callers(store: impl Store + 'static) -> Vec<String> {
    let (log, _guard) = Log::capture();
    let handler = Handler::default();
    let client = Client::new(serve(app(handler.clone(), IdempotencyLayer::new(store))).await);

    let alice = charge(&client, &[("authorization", ALICE)]).await;
    let bob = charge(&client, &[("authorization", BOB)]).await;
    assert!(!alice.replayed() && !bob.replayed(), "{alice:?} {bob:?}");
    assert_eq!((run(&alice), run(&bob)), (1, 2), "each ran its own");
    assert_eq!(handler.runs(), 2);

    let alice_again = charge(&client, &[("authorization", ALICE)]).await;
    let bob_again = charge(&client, &[("authorization", BOB)]).await;
    assert!(alice_again.replayed() && bob_again.replayed());
    assert_eq!(alice_again.body, alice.body, "Alice is replayed her own");
    assert_eq!(bob_again.body, bob.body, "Bob is replayed his own");
    assert_eq!(handler.runs(), 2);

    let lines = log.lines();
    assert!(
        lines.iter().any(|line| line.contains("http-caller.")),
        "the log names the caller's scope: {lines:#?}"
    );
    lines
}

/// Neither token, nor its secret part, in any of `texts`.
fn assert_no_credential<'a>(what: &str, texts: impl IntoIterator<Item = &'a str>) {
    let mut seen = 0;
    for text in texts {
        seen += 1;
        for secret in ["alice-7f3c-secret", "bob-91d2-secret"] {
            assert!(
                !text.contains(secret),
                "{what} holds a raw credential: {text}"
            );
        }
    }
    assert!(seen > 0, "{what}: nothing to look at");
}

#[tokio::test]
async fn two_callers_with_one_key_each_run_once_in_memory() {
    let store = MemoryStore::new();
    let log = two_callers(store.clone()).await;
    assert_no_credential("the log", log.iter().map(String::as_str));
    assert!(
        store
            .completed(StoreKey {
                scope: "http-anonymous",
                key: "idem-1"
            })
            .is_none()
    );
}

#[tokio::test]
async fn two_callers_with_one_key_each_run_once_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let log = two_callers(RedisStore::connect(&server.url()).await.unwrap()).await;
    assert_no_credential("the log", log.iter().map(String::as_str));

    // Every key and every value the server holds.
    let client = redis::Client::open(server.url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(keys.len(), 2, "one record a caller: {keys:?}");
    let mut texts = keys.clone();
    for key in &keys {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut redis)
            .await
            .unwrap();
        texts.push(String::from_utf8_lossy(&value).into_owned());
    }
    assert!(keys.iter().all(|k| k.contains("http-caller.")), "{keys:?}");
    assert_no_credential("redis", texts.iter().map(String::as_str));
}

#[tokio::test]
async fn two_callers_with_one_key_each_run_once_on_postgres() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = PgStore::connect(&server.url()).await.unwrap();
    store.migrate().await.unwrap();
    let log = two_callers(store.clone()).await;
    assert_no_credential("the log", log.iter().map(String::as_str));

    // Every row of every table, as text.
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(tables.iter().any(|t| t == "jobguard_keys"), "{tables:?}");
    let mut rows = Vec::new();
    for table in &tables {
        let text: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT t::text FROM \"{table}\" t"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        rows.extend(text);
    }
    assert_eq!(
        rows.iter().filter(|r| r.contains("http-caller.")).count(),
        2,
        "one row a caller: {rows:#?}"
    );
    assert_no_credential("postgres", rows.iter().map(String::as_str));
}

/// What an auth layer puts in the extensions: the principal a token belongs to.
#[derive(Clone)]
struct Principal(String);

/// Both of Alice's tokens are Alice.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let who = if token.starts_with("Bearer alice-") {
        "alice"
    } else {
        "someone-else"
    };
    request.extensions_mut().insert(Principal(who.to_owned()));
    next.run(request).await
}

fn principal(parts: &http::request::Parts) -> String {
    parts
        .extensions
        .get::<Principal>()
        .map_or_else(|| "unauthenticated".to_owned(), |p| p.0.clone())
}

#[tokio::test]
async fn a_caller_replays_its_retries_and_a_new_token_is_a_new_caller_unless_scoped() {
    let handler = Handler::default();
    let client = Client::new(
        serve(app(
            handler.clone(),
            IdempotencyLayer::new(MemoryStore::new()),
        ))
        .await,
    );
    let first = charge(&client, &[("authorization", ALICE)]).await;
    let retry = charge(&client, &[("authorization", ALICE)]).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    // A refreshed token: by default another caller, so the request runs again.
    let refreshed = charge(&client, &[("authorization", "Bearer alice-refreshed")]).await;
    assert!(!refreshed.replayed());
    assert_eq!(run(&refreshed), 2);

    // With the principal as the scope, both tokens are Alice.
    let handler = Handler::default();
    let scoped = app(
        handler.clone(),
        IdempotencyLayer::new(MemoryStore::new()).scope(principal),
    )
    .layer(axum::middleware::from_fn(authenticate));
    let client = Client::new(serve(scoped).await);
    let first = charge(&client, &[("authorization", ALICE)]).await;
    let refreshed = charge(&client, &[("authorization", "Bearer alice-refreshed")]).await;
    assert!(refreshed.replayed(), "{refreshed:?}");
    assert_eq!(refreshed.body, first.body);
    let bob = charge(&client, &[("authorization", BOB)]).await;
    assert!(!bob.replayed());
    assert_eq!(handler.runs(), 2);
}

#[tokio::test]
async fn a_session_cookie_is_a_credential_and_other_cookies_are_not() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::new(MemoryStore::new()).credential_cookie("session");
    let client = Client::new(serve(app(handler.clone(), layer)).await);
    let one = charge(&client, &[("cookie", "theme=dark; session=s-1")]).await;
    let two = charge(&client, &[("cookie", "theme=dark; session=s-2")]).await;
    assert_eq!((run(&one), run(&two)), (1, 2), "two sessions, two callers");
    let one_again = charge(&client, &[("cookie", "session=s-1; theme=light; csrf=x")]).await;
    assert!(one_again.replayed());
    assert_eq!(one_again.body, one.body);
    assert_eq!(handler.runs(), 2);
}

#[tokio::test]
async fn shared_keys_are_one_namespace_for_every_caller() {
    let handler = Handler::default();
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(store.clone()).shared_keys();
    let client = Client::new(serve(app(handler.clone(), layer)).await);
    let alice = charge(&client, &[("authorization", ALICE)]).await;
    let bob = charge(&client, &[("authorization", BOB)]).await;
    assert!(bob.replayed(), "chosen explicitly: one namespace");
    assert_eq!(bob.body, alice.body);
    assert_eq!(handler.runs(), 1);
    assert!(
        store
            .completed(StoreKey {
                scope: "http",
                key: "idem-1"
            })
            .is_some()
    );
}

#[tokio::test]
async fn anonymous_callers_share_one_scope_and_the_layer_says_so_once() {
    let (log, _guard) = Log::capture();
    let handler = Handler::default();
    let store = MemoryStore::new();
    let client =
        Client::new(serve(app(handler.clone(), IdempotencyLayer::new(store.clone()))).await);
    let first = charge(&client, &[]).await;
    let second = charge(&client, &[]).await;
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert!(
        store
            .completed(StoreKey {
                scope: "http-anonymous",
                key: "idem-1"
            })
            .is_some()
    );
    // An authenticated caller is not anonymous, and says nothing.
    charge(&client, &[("authorization", ALICE)]).await;
    let warnings: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|line| line.starts_with("WARN") && line.contains("anonymous"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains("IdempotencyLayer::scope"),
        "{}",
        warnings[0]
    );
}
