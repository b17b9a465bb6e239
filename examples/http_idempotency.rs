//! A charge endpoint behind `IdempotencyLayer`: `POST /charge/{order_id}` with an
//! `Idempotency-Key` header charges once per key, however often the client repeats it.
//!
//! ```text
//! cargo run --example http_idempotency                 # in-memory store, 127.0.0.1:3000
//! cargo run --example http_idempotency -- --redis URL  # keys in Redis, shared by processes
//! ```
//!
//! The README's `curl` session runs against it. The charge takes two seconds (a slow payment
//! gateway), long enough to send a repeat while it runs and see the `409`. `PORT` picks another
//! port.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use jobguard::http::IdempotencyLayer;
use jobguard::{MemoryStore, RedisStore, Store};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a charge request carries.
#[derive(Deserialize)]
struct ChargeRequest {
    amount: u64,
}

/// The receipt of one charge.
#[derive(Serialize)]
struct Receipt {
    charge_id: String,
    order_id: String,
    amount: u64,
}

/// The payment gateway: numbers each charge it makes.
#[derive(Clone)]
struct Gateway {
    charges: Arc<AtomicU64>,
    latency: Duration,
}

async fn charge(
    State(gateway): State<Gateway>,
    Path(order_id): Path<String>,
    Json(request): Json<ChargeRequest>,
) -> impl IntoResponse {
    tokio::time::sleep(gateway.latency).await;
    let n = gateway.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let receipt = Receipt {
        charge_id: format!("ch_{n}"),
        order_id,
        amount: request.amount,
    };
    (StatusCode::CREATED, Json(receipt))
}

/// The app: the charge route, keys required, on `store`; `latency` is the gateway's.
pub fn app<S: Store + 'static>(store: S, latency: Duration) -> Router {
    let gateway = Gateway {
        charges: Arc::default(),
        latency,
    };
    Router::new()
        .route("/charge/{order_id}", post(charge))
        .with_state(gateway)
        .layer(
            // Keys are kept per caller, by the request's `Authorization` header; behind an
            // auth layer, `.scope(..)` names the principal instead. The curl session below sends
            // none, so it is the one anonymous caller, and the layer warns about that once.
            IdempotencyLayer::new(store)
                .required(true)
                .ttl(Duration::from_secs(24 * 3600))
                .max_body(64 * 1024),
        )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let latency = Duration::from_secs(2);
    let app = match args.iter().position(|a| a == "--redis") {
        Some(i) => {
            let url = args
                .get(i + 1)
                .ok_or("--redis needs a URL, such as redis://127.0.0.1:6379")?;
            app(RedisStore::connect(url).await?, latency)
        }
        None => app(MemoryStore::new(), latency),
    };
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
