//! An operator console (feature `console`): dead letters, idempotency keys and circuit
//! breakers a human can see and act on, as HTML pages and a JSON API in one axum [`Router`].
//!
//! ```no_run
//! use jobguard::console::Console;
//! use jobguard::{CircuitBreaker, DeadLetter, MemoryDeadLetters, MemoryStore};
//! use std::time::Duration;
//!
//! static GATEWAY: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30)).named("gateway");
//!
//! async fn charge_again(letter: DeadLetter) -> Result<(), std::io::Error> {
//!     println!("charging {:?} again", letter.payload);
//!     Ok(())
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let letters = MemoryDeadLetters::new();
//! let store = MemoryStore::new();
//! let console = Console::new()
//!     .dead_letters(letters.clone())
//!     .store(store.clone())
//!     .breaker("gateway", &GATEWAY)
//!     .redrive("payments.charge", charge_again);
//! // Behind your own authentication: the console has none.
//! let app = axum::Router::new().nest("/jobguard", console.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! # No authentication of its own
//!
//! Whoever reaches the router can redrive and delete letters, forgive and forget keys and reset
//! breakers. Nest it behind your own authentication layer, or serve it on loopback only, or make
//! it [`read_only`](Console::read_only). Your layer names the operator for the audit trail by
//! inserting an [`Actor`] into the request's extensions; failing that, the console takes the
//! `x-jobguard-actor` header, which is what the client says it is: trust it only behind a
//! layer that sets or strips it. Forms are refused when the browser says they come from another
//! site (`Sec-Fetch-Site: cross-site`), so that a page elsewhere cannot post to the console
//! from an operator's browser.
//!
//! # Pages
//!
//! Rendered on the server (maud), with no script: `dead-letters` (newest first, paginated,
//! filtered by job, reason, key and error text, the filters in the query string so that a view
//! can be linked), `dead-letters/{id}` (the error, its history, attempts, first and last
//! attempt, payload; redrive or delete), a confirmation page that shows how many letters match
//! before a bulk redrive or delete acts on them, `keys` (a key's state; forgive, forget) and
//! `breakers` (state, failures; reset).
//!
//! # The JSON API
//!
//! Under the same router, for scripts (paths relative to where it is nested):
//!
//! | route | answers |
//! |---|---|
//! | `GET api/dead-letters?job=&reason=&key=&q=&limit=&cursor=` | `{"letters": [{"id", "job", "key", "reason", "attempts", "error", "history", "first_attempt", "last_attempt", "payload"}], "next": cursor or null}`, newest first; a letter that does not decode is `{"id", "corrupt": why}` in its place |
//! | `GET api/dead-letters/{id}` | one letter, as above |
//! | `DELETE api/dead-letters/{id}` | `{"deleted": true}` |
//! | `POST api/dead-letters/{id}/redrive` | `{"redriven": true}`, or `502` whose `error` is the job's error (the letter is kept) |
//! | `POST api/dead-letters/redrive`, `POST api/dead-letters/delete` | the filter in the query, `{"expect": N}` in the body: `409` with the `count` when N is not how many match now; else `{"redriven" or "deleted": n, "failed": [{"id", "error"}]}` |
//! | `GET api/keys/{scope}/{key}` | `{"scope", "key", "state": "free" \| "claimed" \| "completed" \| "poisoned", "generation", "crashes", "lease_ends", "result"}` |
//! | `POST api/keys/{scope}/{key}/forgive`, `.../forget` | `{"forgiven": bool}`, `{"forgotten": bool}` |
//! | `GET api/breakers` | `[{"name", "state", "failures", "retry_in_ms"}]` |
//! | `POST api/breakers/{name}/reset` | `{"reset": true}` |
//!
//! Times are RFC 3339 in UTC. Errors are `application/problem+json` (RFC 9457) with a `type`
//! (`tag:jobguard,2026:console/...`), a `title` and a `detail`: an unknown letter, key scope or
//! breaker is `404`; a malformed cursor, limit, reason or unknown query parameter `400`; an
//! action on a [`read_only`](Console::read_only) console `403`; a sink or store out of reach
//! `503`. A key's `result` is its stored record as JSON when it is JSON, else a string of its
//! bytes.
//!
//! # Redrive
//!
//! A letter is redriven by the handler registered for its job with
//! [`redrive`](Console::redrive): an async function of the letter, which runs the job again
//! (from the letter's [`payload`](DeadLetter::payload) and [`key`](DeadLetter::key)) or, for a
//! job of a runner, puts it back on its queue (see [`requeue`] for apalis). The letter is
//! removed only when the handler succeeds; a handler that fails leaves it in place and the
//! answer shows the job's error. As with
//! [`RedisDeadLetters::redrive`](crate::RedisDeadLetters::redrive) (feature `redis`), the
//! letter's own job giving up again inside the handler writes no second letter, and a
//! `crashed` letter's key is forgiven once so that the job runs. A letter of a job without a
//! handler is not redriven (`422`).
//!
//! A bulk action walks the letters that match, newest first, one batch of
//! [`BATCH`] at a time (never the whole set in memory), and stops after the `expect`ed number:
//! letters that arrive while it runs are newer than the first batch, and are not touched.
//!
//! # Audit
//!
//! Every action raises [`Event::ConsoleAction`] on the runtime
//! given to [`runtime`](Console::runtime) (else the runtime current when the action runs): what
//! was done, to which letters, key or breaker, by whom and how it went; a bulk action once a
//! batch.

use crate::Error;
use crate::breaker::CircuitBreaker;
use crate::dead_letter::{Browse, DeadLetter, Filter, GiveUp, Page};
use crate::observe::Event;
use crate::runtime::Runtime;
use crate::store::{KeyInfo, Store, StoreKey};
use axum::Router;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod api;
mod pages;

/// Letters acted on per batch by a bulk redrive or delete (one page read, then one action per
/// letter, then one [`Event::ConsoleAction`]).
pub const BATCH: usize = 200;

/// The most letters one page shows; `limit` above it is `400`.
pub const MAX_LIMIT: usize = 500;

/// The letters a page shows unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 50;

/// The future a redrive handler returns, its error in words.
type RedriveFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
type Handler = Arc<dyn Fn(DeadLetter) -> RedriveFuture + Send + Sync>;

/// Who acts, for the audit trail: put it in the request's extensions from your authentication
/// layer (`request.extensions_mut().insert(Actor("ada".into()))`); it wins over the
/// `x-jobguard-actor` header.
///
/// ```
/// use jobguard::console::Actor;
///
/// let mut request = axum::http::Request::new(());
/// request.extensions_mut().insert(Actor("ada@example.com".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub String);

/// The console: what it shows and how it acts. Build it, then call [`router`](Console::router).
///
/// ```
/// use jobguard::console::Console;
/// use jobguard::{MemoryDeadLetters, MemoryStore};
///
/// let router: axum::Router = Console::new()
///     .dead_letters(MemoryDeadLetters::new())
///     .store(MemoryStore::new())
///     .read_only(true)
///     .router();
/// # drop(router);
/// ```
#[derive(Clone, Default)]
pub struct Console {
    letters: Option<Arc<dyn Browse>>,
    store: Option<Arc<dyn Store>>,
    breakers: Vec<(String, &'static CircuitBreaker)>,
    handlers: BTreeMap<String, Handler>,
    read_only: bool,
    runtime: Option<Runtime>,
}

impl fmt::Debug for Console {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Console")
            .field("dead_letters", &self.letters.is_some())
            .field("store", &self.store.is_some())
            .field(
                "breakers",
                &self.breakers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("redrive", &self.handlers.keys().collect::<Vec<_>>())
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl Console {
    /// A console that shows nothing yet: add the sinks, store and breakers to show.
    pub fn new() -> Self {
        Self::default()
    }

    /// The dead letters to show: a [`MemoryDeadLetters`](crate::MemoryDeadLetters),
    /// [`RedisDeadLetters`](crate::RedisDeadLetters) (feature `redis`),
    /// [`PgDeadLetters`](crate::dead_letter::postgres::PgDeadLetters) (feature `postgres`), or
    /// any [`Browse`].
    pub fn dead_letters(mut self, sink: impl Browse + 'static) -> Self {
        self.letters = Some(Arc::new(sink));
        self
    }

    /// The idempotency store whose keys to look up, forgive and forget.
    pub fn store(mut self, store: impl Store + 'static) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A breaker to show and reset, under `name` (a path segment: the JSON API's
    /// `api/breakers/{name}/reset`).
    pub fn breaker(mut self, name: impl Into<String>, breaker: &'static CircuitBreaker) -> Self {
        self.breakers.push((name.into(), breaker));
        self
    }

    /// How to redrive letters of `job` (the letter's [`job`](DeadLetter::job), as written):
    /// `handler` runs the job again from the letter, or puts it back on its queue. The letter
    /// is removed when it succeeds, and kept, with its error shown, when it fails.
    pub fn redrive<F, Fut, T, E>(mut self, job: impl Into<String>, handler: F) -> Self
    where
        F: Fn(DeadLetter) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: fmt::Display,
    {
        let handler: Handler = Arc::new(move |letter| {
            let run = handler(letter);
            Box::pin(async move { run.await.map(drop).map_err(|e| e.to_string()) })
        });
        self.handlers.insert(job.into(), handler);
        self
    }

    /// A read-only console shows everything and answers every action with `403`.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// The runtime whose observer (and `metrics`, `tracing` views) hear the console's
    /// [`Event::ConsoleAction`]s; by default the runtime current
    /// when an action runs.
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The pages and the JSON API, for the caller to nest under a path of their choosing
    /// (`Router::new().nest("/jobguard", console.router())`) behind their own authentication.
    pub fn router(self) -> Router {
        let console = Arc::new(self);
        Router::new()
            .merge(api::routes())
            .merge(pages::routes())
            .with_state(console)
            .layer(axum::middleware::from_fn(same_site))
    }

    fn emit(&self, action: &str, targets: &[String], actor: Option<&str>, outcome: &str) {
        let event = Event::ConsoleAction {
            action,
            targets,
            actor,
            outcome,
        };
        match &self.runtime {
            Some(runtime) => runtime.emit(&event),
            None => Runtime::current().emit(&event),
        }
    }

    fn letters(&self) -> Result<&dyn Browse, Problem> {
        self.letters.as_deref().ok_or_else(|| {
            Problem::new(
                404,
                "no-dead-letters",
                "No dead letters here",
                "This console was built without a dead-letter sink: give one to Console::dead_letters.",
            )
        })
    }

    fn key_store(&self) -> Result<&dyn Store, Problem> {
        self.store.as_deref().ok_or_else(|| {
            Problem::new(
                404,
                "no-store",
                "No idempotency store here",
                "This console was built without a store: give one to Console::store.",
            )
        })
    }

    fn writable(&self) -> Result<(), Problem> {
        if self.read_only {
            return Err(Problem::new(
                403,
                "read-only",
                "This console is read-only",
                "It shows dead letters, keys and breakers but does not act on them.",
            ));
        }
        Ok(())
    }

    /// A page of letters, the cursor checked.
    async fn page(&self, query: &Query) -> Result<Page, Problem> {
        let letters = self.letters()?;
        if let Some(cursor) = &query.cursor
            && !letters.is_id(cursor)
        {
            return Err(Problem::new(
                400,
                "bad-cursor",
                "Malformed cursor",
                format!("`{cursor}` is not a cursor of this sink: pass the `next` of a page."),
            ));
        }
        Ok(letters
            .page(&query.filter, query.cursor.as_deref(), query.limit)
            .await?)
    }

    /// The entry `id`, or `404`.
    async fn entry(&self, id: &str) -> Result<Result<DeadLetter, Error>, Problem> {
        self.letters()?
            .get(id)
            .await?
            .ok_or_else(|| Problem::not_found("letter", id))
    }

    /// Redrives one letter through its job's handler; the letter goes when it succeeds.
    async fn redrive_letter(&self, id: &str, letter: DeadLetter) -> Result<(), Failed> {
        let Some(handler) = self.handlers.get(&letter.job) else {
            return Err(Failed::NoHandler(letter.job));
        };
        let (job, key, reason) = (letter.job.clone(), letter.key.clone(), letter.reason);
        crate::dead_letter::redriving(job, key, reason, handler(letter))
            .await
            .map_err(Failed::Job)?;
        self.letters()
            .map_err(|p| Failed::Sink(p.detail))?
            .remove(id)
            .await
            .map_err(|e| Failed::Sink(e.to_string()))?;
        Ok(())
    }

    /// One letter redriven, as an action.
    async fn redrive_one(&self, id: &str, actor: Option<&str>) -> Result<(), Problem> {
        self.writable()?;
        let letter = self.entry(id).await?.map_err(|e| {
            Problem::new(
                422,
                "corrupt",
                "This letter cannot be read",
                format!("{e}; it cannot be redriven, only deleted."),
            )
        })?;
        let outcome = self.redrive_letter(id, letter).await;
        let said = match &outcome {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string(),
        };
        self.emit("redrive", &[id.to_owned()], actor, &said);
        outcome.map_err(Failed::into_problem)
    }

    /// One letter deleted, as an action.
    async fn delete_one(&self, id: &str, actor: Option<&str>) -> Result<(), Problem> {
        self.writable()?;
        let letters = self.letters()?;
        if !letters.remove(id).await? {
            return Err(Problem::not_found("letter", id));
        }
        self.emit("delete", &[id.to_owned()], actor, "ok");
        Ok(())
    }

    /// Every letter that matches `filter`, `expect` of them, redriven or deleted a batch at a
    /// time; `409` when `expect` is not how many match now.
    async fn bulk(
        &self,
        action: Bulk,
        filter: &Filter,
        expect: u64,
        actor: Option<&str>,
    ) -> Result<BulkOutcome, Problem> {
        self.writable()?;
        let letters = self.letters()?;
        let count = letters.count(filter).await?;
        if count != expect {
            return Err(Problem::new(
                409,
                "stale-count",
                "The count has changed",
                format!(
                    "{count} letters match this filter now, not {expect}: look at them again and \
                     confirm {count}."
                ),
            )
            .with("count", count.into()));
        }
        let mut outcome = BulkOutcome::default();
        let (mut cursor, mut acted) = (None::<String>, 0u64);
        while acted < expect {
            let page = letters.page(filter, cursor.as_deref(), BATCH).await?;
            let mut done = Vec::new();
            let mut failures = 0;
            for (id, entry) in page.entries {
                if acted == expect {
                    break;
                }
                acted += 1;
                let result = match (action, entry) {
                    (Bulk::Delete, _) => match letters.remove(&id).await {
                        Ok(true) => Ok(()),
                        Ok(false) => Err("already gone".to_owned()),
                        Err(e) => Err(e.to_string()),
                    },
                    (Bulk::Redrive, Ok(letter)) => self
                        .redrive_letter(&id, letter)
                        .await
                        .map_err(|e| e.to_string()),
                    (Bulk::Redrive, Err(corrupt)) => Err(corrupt.to_string()),
                };
                match result {
                    Ok(()) => done.push(id),
                    Err(error) => {
                        failures += 1;
                        outcome.failed_count += 1;
                        if outcome.failed.len() < 100 {
                            outcome.failed.push((id, error));
                        }
                    }
                }
            }
            outcome.done += done.len() as u64;
            let said = match failures {
                0 => "ok".to_owned(),
                n => format!("{n} failed"),
            };
            if !done.is_empty() || failures > 0 {
                self.emit(action.as_str(), &done, actor, &said);
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(outcome)
    }

    /// A key's state.
    async fn key(&self, scope: &str, key: &str) -> Result<KeyInfo, Problem> {
        Ok(self.key_store()?.inspect(StoreKey { scope, key }).await?)
    }

    /// Forgives or forgets a key, as an action: whether there was something to do.
    async fn key_action(
        &self,
        action: KeyAction,
        scope: &str,
        key: &str,
        actor: Option<&str>,
    ) -> Result<bool, Problem> {
        self.writable()?;
        let store = self.key_store()?;
        let key_ref = StoreKey { scope, key };
        let done = match action {
            KeyAction::Forgive => store.forgive(key_ref).await?,
            KeyAction::Forget => store.forget(key_ref).await?,
        };
        let outcome = if done { "ok" } else { "nothing to do" };
        self.emit(action.as_str(), &[format!("{scope}/{key}")], actor, outcome);
        Ok(done)
    }

    fn breaker_named(&self, name: &str) -> Result<&'static CircuitBreaker, Problem> {
        self.breakers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| *b)
            .ok_or_else(|| Problem::not_found("breaker", name))
    }

    fn reset_breaker(&self, name: &str, actor: Option<&str>) -> Result<(), Problem> {
        self.writable()?;
        self.breaker_named(name)?.reset();
        self.emit("reset", &[name.to_owned()], actor, "ok");
        Ok(())
    }
}

/// Refuses an action a browser says comes from another site (`Sec-Fetch-Site: cross-site`): a
/// page elsewhere posting a form to the console from an operator's browser.
async fn same_site(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let safe = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let cross = request
        .headers()
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site");
    if !safe && cross {
        return Problem::new(
            403,
            "cross-site",
            "Refused: the request came from another site",
            "The browser says this action was sent by a page of another site; act from the \
             console's own pages.",
        )
        .into_response();
    }
    next.run(request).await
}

/// A bulk action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bulk {
    Redrive,
    Delete,
}

impl Bulk {
    fn as_str(self) -> &'static str {
        match self {
            Bulk::Redrive => "redrive",
            Bulk::Delete => "delete",
        }
    }
}

/// What a bulk action did.
#[derive(Debug, Default)]
struct BulkOutcome {
    done: u64,
    failed_count: u64,
    /// The first 100 failures.
    failed: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy)]
enum KeyAction {
    Forgive,
    Forget,
}

impl KeyAction {
    fn as_str(self) -> &'static str {
        match self {
            KeyAction::Forgive => "forgive",
            KeyAction::Forget => "forget",
        }
    }
}

/// Why a redrive did not remove its letter.
enum Failed {
    NoHandler(String),
    Job(String),
    Sink(String),
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failed::NoHandler(job) => write!(f, "no redrive handler for job {job}"),
            Failed::Job(e) => write!(f, "the job failed again: {e}"),
            Failed::Sink(e) => write!(f, "the job ran, but the letter was not removed: {e}"),
        }
    }
}

impl Failed {
    fn into_problem(self) -> Problem {
        match self {
            Failed::NoHandler(job) => Problem::new(
                422,
                "no-handler",
                "No redrive handler for this job",
                format!(
                    "Letters of job {job} cannot be redriven from here: register one with \
                     Console::redrive(\"{job}\", handler)."
                ),
            ),
            Failed::Job(error) => Problem::new(
                502,
                "redrive-failed",
                "The job failed again",
                "The redriven job failed; the letter is kept.",
            )
            .with("error", error.into()),
            Failed::Sink(error) => Problem::new(
                503,
                "unavailable",
                "The letter was not removed",
                format!("The job ran, but its letter could not be removed: {error}"),
            ),
        }
    }
}

/// A problem document (RFC 9457), as the API answers and the pages show.
#[derive(Debug)]
struct Problem {
    status: u16,
    kind: &'static str,
    title: &'static str,
    detail: String,
    extra: Vec<(&'static str, serde_json::Value)>,
}

impl Problem {
    fn new(
        status: u16,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            status,
            kind,
            title,
            detail: detail.into(),
            extra: Vec::new(),
        }
    }

    fn not_found(what: &'static str, id: &str) -> Self {
        Problem::new(
            404,
            "not-found",
            "No such letter, key or breaker",
            format!(
                "There is no {what} `{id}` here: it may have gone already (redriven, deleted, reset)."
            ),
        )
    }

    fn with(mut self, name: &'static str, value: serde_json::Value) -> Self {
        self.extra.push((name, value));
        self
    }

    fn document(&self) -> serde_json::Value {
        let mut doc = serde_json::json!({
            "type": format!("tag:jobguard,2026:console/{}", self.kind),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        });
        if let Some(map) = doc.as_object_mut() {
            for (name, value) in &self.extra {
                map.insert((*name).to_owned(), value.clone());
            }
        }
        doc
    }
}

impl From<Error> for Problem {
    fn from(e: Error) -> Self {
        match e {
            Error::Store(_) => Problem::new(
                503,
                "unavailable",
                "The store is out of reach",
                format!("{e}; nothing was changed by this request. Try again."),
            ),
            Error::Corrupt(_) => {
                Problem::new(500, "corrupt", "A record cannot be read", e.to_string())
            }
            Error::Config(_) => {
                Problem::new(501, "unsupported", "Not supported here", e.to_string())
            }
            other => Problem::new(500, "error", "The console failed", other.to_string()),
        }
    }
}

/// A list's query: the filter, the cursor, the page's size.
#[derive(Debug, Default, Clone)]
struct Query {
    filter: Filter,
    cursor: Option<String>,
    limit: usize,
}

impl Query {
    /// Reads `job`, `reason`, `key`, `q`, `cursor`, `limit` (and any of `allowed`, left for the
    /// caller); an empty value is no value. Anything else, a repeated name, an unknown reason
    /// or a limit out of 1..=[`MAX_LIMIT`] is `400`.
    fn parse(
        pairs: &[(String, String)],
        allowed: &[&str],
    ) -> Result<(Query, Vec<(String, String)>), Problem> {
        let bad = |detail: String| Problem::new(400, "bad-query", "Malformed query", detail);
        let mut query = Query {
            limit: DEFAULT_LIMIT,
            ..Query::default()
        };
        let mut seen = std::collections::BTreeSet::new();
        let mut rest = Vec::new();
        for (name, value) in pairs {
            if !seen.insert(name.as_str()) {
                return Err(bad(format!(
                    "`{name}` is given twice: give each parameter once."
                )));
            }
            let value = value.trim();
            if allowed.contains(&name.as_str()) {
                rest.push((name.clone(), value.to_owned()));
                continue;
            }
            let given = (!value.is_empty()).then(|| value.to_owned());
            match name.as_str() {
                "job" => query.filter.job = given,
                "key" => query.filter.key = given,
                "q" => query.filter.text = given,
                "cursor" => query.cursor = given,
                "reason" => {
                    query.filter.reason = match given {
                        None => None,
                        Some(reason) => Some(parse_reason(&reason).ok_or_else(|| {
                            bad(format!(
                                "`{reason}` is not a reason: use one of exhausted, permanent, \
                                 budget, circuit_open, retry_budget, crashed."
                            ))
                        })?),
                    }
                }
                "limit" => {
                    if let Some(limit) = given {
                        query.limit = limit
                            .parse::<usize>()
                            .ok()
                            .filter(|n| (1..=MAX_LIMIT).contains(n))
                            .ok_or_else(|| {
                                bad(format!(
                                    "`limit={limit}` is not a page size: give a number from 1 to {MAX_LIMIT}."
                                ))
                            })?;
                    }
                }
                other => {
                    return Err(bad(format!(
                        "unknown parameter `{other}`: the filters are job, reason, key and q, with \
                         cursor and limit."
                    )));
                }
            }
        }
        Ok((query, rest))
    }

    /// The filter and limit (not the cursor) as a query string, for links.
    fn filter_string(&self) -> String {
        let mut parts = Vec::new();
        let f = &self.filter;
        for (name, value) in [
            ("job", f.job.as_deref()),
            ("reason", f.reason.map(GiveUp::as_str)),
            ("key", f.key.as_deref()),
            ("q", f.text.as_deref()),
        ] {
            if let Some(value) = value {
                parts.push(format!("{name}={}", encode_component(value)));
            }
        }
        if self.limit != DEFAULT_LIMIT {
            parts.push(format!("limit={}", self.limit));
        }
        parts.join("&")
    }
}

fn parse_reason(s: &str) -> Option<GiveUp> {
    [
        GiveUp::Exhausted,
        GiveUp::Permanent,
        GiveUp::Budget,
        GiveUp::CircuitOpen,
        GiveUp::RetryBudget,
        GiveUp::Crashed,
    ]
    .into_iter()
    .find(|r| r.as_str() == s)
}

/// Percent-encodes all but unreserved characters (RFC 3986), for a query value or a path
/// segment.
fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The actor of a request: its [`Actor`] extension, else its `x-jobguard-actor` header.
fn actor_of(parts: &axum::http::request::Parts) -> Option<String> {
    if let Some(Actor(actor)) = parts.extensions.get::<Actor>() {
        return Some(actor.clone());
    }
    parts
        .headers
        .get("x-jobguard-actor")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// A letter as the API shows it.
fn letter_json(id: &str, entry: &Result<DeadLetter, Error>) -> serde_json::Value {
    match entry {
        Ok(l) => serde_json::json!({
            "id": id,
            "job": l.job,
            "key": l.key,
            "reason": l.reason.as_str(),
            "attempts": l.attempts,
            "error": l.error,
            "history": l.history,
            "first_attempt": rfc3339(l.first_attempt),
            "last_attempt": rfc3339(l.last_attempt),
            "payload": l.payload,
        }),
        Err(e) => serde_json::json!({"id": id, "corrupt": e.to_string()}),
    }
}

/// A key's state as the API shows it.
fn key_json(scope: &str, key: &str, info: &KeyInfo) -> serde_json::Value {
    serde_json::json!({
        "scope": scope,
        "key": key,
        "state": info.state.as_str(),
        "generation": info.generation,
        "crashes": info.crashes,
        "lease_ends": info.lease_left.map(|left| rfc3339(SystemTime::now() + left)),
        "result": info.result.as_deref().map(result_json),
    })
}

/// A stored result: its JSON when it is JSON, else its bytes as text.
fn result_json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2026-12-06T07:15:03.123Z`; a time before the
/// epoch is the epoch.
fn rfc3339(t: SystemTime) -> String {
    let since = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// A redrive handler for apalis jobs (features `console` and `apalis`): decodes the letter's
/// [`payload`](DeadLetter::payload) as the task's arguments `T` and pushes it back onto the
/// queue behind `sink` (an apalis storage: `RedisStorage`, a `MemoryStorage`'s sink, ...),
/// where a worker runs it again. A letter without a payload, or one that does not decode as
/// `T`, fails the redrive and is kept. Give the job its payload with
/// `#[retry(payload = job)]`, so that its letter carries the task.
///
/// The letter is removed once the task is on the queue: should the job fail again, its
/// worker writes a new letter. A `crashed` letter's key stays poisoned, and the worker would
/// refuse the task: forgive the key first (the console's keys page, or
/// [`idempotency::forgive`](crate::idempotency::forgive)), once the cause is fixed.
#[cfg(feature = "apalis")]
#[cfg_attr(docsrs, doc(cfg(feature = "apalis")))]
pub fn requeue<T, S, K>(
    sink: S,
) -> impl Fn(DeadLetter) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send>> + Send + Sync + 'static
where
    T: serde::de::DeserializeOwned + Send + 'static,
    S: apalis_core::backend::TaskSink<T, K> + Clone + Send + Sync + 'static,
    S::Error: fmt::Display,
{
    move |letter: DeadLetter| {
        let mut sink = sink.clone();
        Box::pin(async move {
            let task: T = letter.payload_as().ok_or_else(|| {
                Error::Corrupt(format!(
                    "the letter of {} has no payload to push back (give the job \
                     #[retry(payload = ...)])",
                    letter.job
                ))
            })??;
            sink.push(task).await.map_err(|e| {
                Error::Store(format!("the task was not pushed back onto its queue: {e}"))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_733_468_103_123);
        assert_eq!(rfc3339(t), "2024-12-06T06:55:03.123Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn queries_parse_or_say_what_is_wrong() {
        let pairs = |s: &[(&str, &str)]| -> Vec<(String, String)> {
            s.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let (q, _) = Query::parse(
            &pairs(&[("job", "a"), ("reason", "crashed"), ("q", "")]),
            &[],
        )
        .unwrap();
        assert_eq!(q.filter.job.as_deref(), Some("a"));
        assert_eq!(q.filter.reason, Some(GiveUp::Crashed));
        assert_eq!(q.filter.text, None);
        assert_eq!(q.limit, DEFAULT_LIMIT);
        for bad in [
            pairs(&[("reason", "tired")]),
            pairs(&[("limit", "0")]),
            pairs(&[("limit", "x")]),
            pairs(&[("jobb", "a")]),
            pairs(&[("job", "a"), ("job", "b")]),
        ] {
            let e = Query::parse(&bad, &[]).unwrap_err();
            assert_eq!(e.status, 400, "{bad:?}");
        }
    }

    #[test]
    fn components_are_percent_encoded() {
        assert_eq!(encode_component("a b/c?é"), "a%20b%2Fc%3F%C3%A9");
    }
}
