//! The JSON API: the same operations as the pages, for scripts.

use super::{Bulk, Console, KeyAction, Problem, Query, actor_of, key_json, letter_json};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query as QueryPairs, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::Arc;

type Shared = State<Arc<Console>>;
type Pairs = Result<QueryPairs<Vec<(String, String)>>, QueryRejection>;
type Id = Result<Path<String>, PathRejection>;
type KeyPath = Result<Path<(String, String)>, PathRejection>;

pub(super) fn routes() -> Router<Arc<Console>> {
    Router::new()
        .route("/api/dead-letters", get(list))
        .route("/api/dead-letters/redrive", post(redrive_all))
        .route("/api/dead-letters/delete", post(delete_all))
        .route("/api/dead-letters/{id}", get(detail).delete(delete))
        .route("/api/dead-letters/{id}/redrive", post(redrive))
        .route("/api/keys/{scope}/{key}", get(key))
        .route("/api/keys/{scope}/{key}/forgive", post(forgive))
        .route("/api/keys/{scope}/{key}/forget", post(forget))
        .route("/api/breakers", get(breakers))
        .route("/api/breakers/{name}/reset", post(reset))
}

/// A JSON answer, or a problem document.
type Answer = Result<axum::Json<Value>, Problem>;

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, self.document().to_string()).into_response();
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

pub(super) fn pairs(query: Pairs) -> Result<Vec<(String, String)>, Problem> {
    query
        .map(|QueryPairs(p)| p)
        .map_err(|e| Problem::new(400, "bad-query", "Malformed query", e.body_text()))
}

pub(super) fn path<T>(path: Result<Path<T>, PathRejection>) -> Result<T, Problem> {
    path.map(|Path(p)| p)
        .map_err(|e| Problem::new(400, "bad-path", "Malformed path", e.body_text()))
}

async fn list(State(console): Shared, query: Pairs) -> Answer {
    let (query, _) = Query::parse(&pairs(query)?, &[])?;
    let page = console.page(&query).await?;
    let letters: Vec<Value> = page
        .entries
        .iter()
        .map(|(id, entry)| letter_json(id, entry))
        .collect();
    Ok(axum::Json(json!({"letters": letters, "next": page.next})))
}

async fn detail(State(console): Shared, id: Id) -> Answer {
    let id = path(id)?;
    let entry = console.entry(&id).await?;
    Ok(axum::Json(letter_json(&id, &entry)))
}

async fn delete(State(console): Shared, parts: Parts, id: Id) -> Answer {
    let id = path(id)?;
    console.delete_one(&id, actor_of(&parts).as_deref()).await?;
    Ok(axum::Json(json!({"deleted": true})))
}

async fn redrive(State(console): Shared, parts: Parts, id: Id) -> Answer {
    let id = path(id)?;
    console
        .redrive_one(&id, actor_of(&parts).as_deref())
        .await?;
    Ok(axum::Json(json!({"redriven": true})))
}

async fn redrive_all(State(console): Shared, parts: Parts, query: Pairs, body: Bytes) -> Answer {
    bulk(&console, Bulk::Redrive, &parts, query, &body).await
}

async fn delete_all(State(console): Shared, parts: Parts, query: Pairs, body: Bytes) -> Answer {
    bulk(&console, Bulk::Delete, &parts, query, &body).await
}

async fn bulk(console: &Console, action: Bulk, parts: &Parts, query: Pairs, body: &[u8]) -> Answer {
    let (query, _) = Query::parse(&pairs(query)?, &[])?;
    if query.cursor.is_some() {
        return Err(Problem::new(
            400,
            "bad-query",
            "Malformed query",
            "A bulk action acts on every letter that matches the filter: it takes no cursor.",
        ));
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Expect {
        expect: u64,
    }
    let Expect { expect } = serde_json::from_slice(body).map_err(|e| {
        Problem::new(
            400,
            "bad-body",
            "Malformed body",
            format!(
                "Send {{\"expect\": N}}, N being how many letters match the filter as you saw \
                 it: {e}"
            ),
        )
    })?;
    let outcome = console
        .bulk(action, &query.filter, expect, actor_of(parts).as_deref())
        .await?;
    let failed: Vec<Value> = outcome
        .failed
        .iter()
        .map(|(id, error)| json!({"id": id, "error": error}))
        .collect();
    let mut body = json!({"failed_count": outcome.failed_count, "failed": failed});
    let done = match action {
        Bulk::Redrive => "redriven",
        Bulk::Delete => "deleted",
    };
    body[done] = outcome.done.into();
    Ok(axum::Json(body))
}

async fn key(State(console): Shared, key: KeyPath) -> Answer {
    let (scope, key) = path(key)?;
    let info = console.key(&scope, &key).await?;
    Ok(axum::Json(key_json(&scope, &key, &info)))
}

async fn forgive(State(console): Shared, parts: Parts, key: KeyPath) -> Answer {
    let (scope, key) = path(key)?;
    let done = console
        .key_action(
            KeyAction::Forgive,
            &scope,
            &key,
            actor_of(&parts).as_deref(),
        )
        .await?;
    Ok(axum::Json(json!({"forgiven": done})))
}

async fn forget(State(console): Shared, parts: Parts, key: KeyPath) -> Answer {
    let (scope, key) = path(key)?;
    let done = console
        .key_action(KeyAction::Forget, &scope, &key, actor_of(&parts).as_deref())
        .await?;
    Ok(axum::Json(json!({"forgotten": done})))
}

async fn breakers(State(console): Shared) -> Answer {
    let list: Vec<Value> = console
        .breakers
        .iter()
        .map(|(name, breaker)| {
            json!({
                "name": name,
                "state": breaker.state().as_str(),
                "failures": breaker.failures(),
                "retry_in_ms": u64::try_from(breaker.retry_in().as_millis()).unwrap_or(u64::MAX),
            })
        })
        .collect();
    Ok(axum::Json(Value::Array(list)))
}

async fn reset(State(console): Shared, parts: Parts, name: Id) -> Answer {
    let name = path(name)?;
    console.reset_breaker(&name, actor_of(&parts).as_deref())?;
    Ok(axum::Json(json!({"reset": true})))
}
