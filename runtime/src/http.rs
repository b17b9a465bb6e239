//! The `Idempotency-Key` HTTP header as a tower layer, for axum and hyper services.
//!
//! A client that timed out on `POST /charge` cannot know whether the charge happened, so it sends
//! the request again with the same `Idempotency-Key` header. [`IdempotencyLayer`] makes that safe,
//! after the IETF draft "The Idempotency-Key HTTP Header Field" and Stripe's practice:
//!
//! * the first request with a key runs, and its status, content headers and body are stored in a
//!   [`Store`] for the TTL (default 24 hours);
//! * a repeat gets the stored response byte for byte, with `Idempotent-Replayed: true`, and the
//!   handler does not run;
//! * a repeat while the first still runs gets `409 Conflict` with `Retry-After`, also when the
//!   first's client hung up: the handler runs on, unstopped (see
//!   [a client that hangs up](#a-client-that-hangs-up));
//! * the same key with another request (method, path and query, or body) gets
//!   `422 Unprocessable Content`;
//! * a missing key where one is [required](IdempotencyLayer::required), or a malformed one, gets
//!   `400 Bad Request`; a body larger than [`max_body`](IdempotencyLayer::max_body) gets
//!   `413 Content Too Large` before the handler runs;
//! * the store unreachable gets `503 Service Unavailable`, and the handler does not run (fail
//!   closed);
//! * a `5xx`, `408` or `429` response is not stored: the claim is released so the client may try
//!   again. Other `4xx` are stored, since they would repeat.
//!
//! Every error the layer answers itself is `application/problem+json` (RFC 9457) with a `title`
//! and a `detail` that says what to do.
//!
//! ```
//! use axum::{Router, routing::post};
//! use jobguard::MemoryStore;
//! use jobguard::http::IdempotencyLayer;
//! use std::time::Duration;
//!
//! async fn charge() -> &'static str {
//!     "charged"
//! }
//!
//! let app: Router = Router::new()
//!     .route("/charge/{order_id}", post(charge))
//!     .layer(
//!         IdempotencyLayer::new(MemoryStore::new())
//!             .required(true)
//!             .ttl(Duration::from_secs(24 * 3600)),
//!     );
//! # drop(app);
//! ```
//!
//! # The key
//!
//! `Idempotency-Key` is a structured-field string (`"8e03978e-40d5"`, as the draft writes it) or a
//! bare token (`8e03978e-40d5`, as Stripe's clients send it), of 1 to 255 printable ASCII
//! characters. An empty value, a longer one, non-ASCII bytes, two headers, or a list of keys is a
//! `400` that names the fault.
//!
//! # Whose key it is
//!
//! A key belongs to its caller. Two clients of one API may well pick the same key (`order-1`, a
//! counter, a UUID from a shared library with a fixed seed); if they met, the second would get a
//! `422`, or, with a byte-identical request, the *first client's* stored response: another
//! customer's charge replayed to someone else. So keys are kept per caller, as Stripe keeps them
//! per account and the IETF draft expects them unique per client. Which caller a request comes
//! from is decided, in this order, by:
//!
//! * [`scope`](IdempotencyLayer::scope)`(fn(&Parts) -> String)`: your own name for the caller,
//!   usually the authenticated principal your auth layer put in the request's extensions. Use it
//!   whenever you have one: a caller whose token is refreshed, or who holds two tokens, keeps its
//!   keys. Keys live under the store scope `http.<name>`.
//! * [`shared_keys`](IdempotencyLayer::shared_keys)`()`: one namespace, `http`, for every caller,
//!   chosen explicitly (a service with a single trusted caller, or one that puts the tenant in
//!   the key itself).
//! * Otherwise, the default: the request's **credentials**, its `Authorization` header and, with
//!   [`credential_cookie`](IdempotencyLayer::credential_cookie)`(name)`, the value of that cookie
//!   (a session cookie). Keys live under `http-caller.<digest>`, where the digest is the first
//!   128 bits of a SHA-256 of those values, in hex: the raw credential is never written to the
//!   store, nor to a log or an [`Event`]. A new token is a new caller: a client that retries with
//!   a refreshed token runs its request again, unless `scope` maps both tokens to one principal.
//!   The digest is unsalted, so it hides a high-entropy token (a bearer token, an API key, a
//!   session id) from whoever reads the store, but not a guessable password sent with HTTP Basic
//!   auth: map such callers to their user id with `scope`.
//! * A request with neither credentials nor a `scope` (a public endpoint) is still guarded, under
//!   the one scope `http-anonymous` shared by every anonymous caller; the layer logs that once, as
//!   a warning, on the first such request. That is right when anonymous callers' requests carry
//!   nothing private (a public sign-up form whose key the browser generates at random); it is not
//!   when the response holds one caller's data: there, require credentials or name the caller
//!   with `scope`.
//!
//! ```
//! use axum::{Extension, Router, routing::post};
//! use jobguard::http::IdempotencyLayer;
//!
//! /// What the service's auth middleware puts in the request's extensions.
//! #[derive(Clone)]
//! struct Principal(String);
//!
//! fn principal(parts: &http::request::Parts) -> String {
//!     // Present on every request the auth layer let through; an empty name would be one
//!     // namespace for all, so name the case that cannot happen.
//!     parts.extensions.get::<Principal>().map_or_else(|| "unauthenticated".into(), |p| p.0.clone())
//! }
//!
//! async fn charge(Extension(who): Extension<Principal>) -> String {
//!     format!("charged for {}", who.0)
//! }
//!
//! let app: Router = Router::new()
//!     .route("/charge", post(charge))
//!     // Inside the auth layer, so that the principal is there when the scope is read.
//!     .layer(IdempotencyLayer::new(jobguard::MemoryStore::new()).scope(principal));
//! // .layer(your_auth_layer) comes after this line: it runs first.
//! # drop(app);
//! ```
//!
//! # What is stored
//!
//! The status, the body, and the headers that describe it: every `content-*` header except
//! `content-length`, and `location`. Responses are buffered for storage up to
//! [`max_response`](IdempotencyLayer::max_response) (default 1 MiB); a larger one, or one with
//! trailers, is passed through as it streams, whole, but is not stored: the claim is released
//! and an [`Event::StoreFailed`] is raised (a `WARN` event with the `tracing` feature), and a
//! repeat runs the handler again.
//!
//! # Bodies
//!
//! Guarded requests with a key are buffered (up to `max_body`) to fingerprint them, and reach the
//! service as [`RequestBody::Right`]; other requests stream through as [`RequestBody::Left`].
//! The service's response bodies must be [`Unpin`] (axum's and hyper's are).
//!
//! The lease on the key is renewed every third of [`lease`](IdempotencyLayer::lease) while the
//! handler runs. A handler that panics releases it, and the panic reaches the server as if the
//! layer were not there.
//!
//! # A server that dies
//!
//! A request holds its key in a claim session, as a job does
//! ([`idempotency`](crate::idempotency#crashes-and-poison-jobs)): the handler reads the claim's
//! generation with [`jobguard::fence()`](crate::fence) (a number that grows with each claim of
//! the key, for a downstream that refuses writes from an older one), and a claim whose lease
//! lapsed because its server died (or stalled past the lease) mid-request is taken over by the
//! next repeat and counted. The repeat that finds [`crashes`](IdempotencyLayer::crashes) of them
//! (3 by default) is answered `500` with a problem document of type
//! `tag:jobguard,2026:idempotency-key/poisoned`, at once and without running the handler, and
//! so is every later repeat until the key's TTL ends: a request that kills its server runs at
//! most that many times, instead of taking down every server its client retries on. The first
//! such answer logs the key at error level; an operator who fixed the cause runs the request
//! again by [forgiving](crate::Store::forgive) the key.
//!
//! # A client that hangs up
//!
//! From the claim on, a request runs to its end: the claim, the handler, and the buffering and
//! storing of its response. The request body was read whole before the claim, so the handler
//! no longer needs the connection. When the client hangs up (times out) mid-request, hyper drops
//! the layer's response future; the layer then hands the unfinished request to a task of its
//! own on the tokio runtime (in the [`Runtime`] scope, and with `tracing` the
//! span, it started in), and nothing else changes: the handler runs to its end, the key stays
//! held (its lease renewed) until the response is stored, and the client's repeat with the same
//! key gets `409` with `Retry-After` while the first still runs, then the stored response. This
//! is Stripe's rule, a result is saved once the endpoint began executing: a client that gives up
//! cannot tell whether the effect took place, and its repeat must not make it twice. A request
//! that is not dropped is polled in place as any future, and costs no task.
//!
//! There is no opt-out: stopping a handler because its client left is what made a repeat run
//! twice. A handler that must not run on and on needs a deadline of its own: put a timeout
//! *inside* the layer (in axum, a `.layer(timeout)` before `.layer(IdempotencyLayer)`), so that
//! the handler's `408` or `503` releases the key; a timeout outside the layer drops the
//! response future only, as a client hanging up does. The service's future and body types must
//! be `Send + 'static` (axum's and hyper's are), since they may run in a task. The layer is
//! meant to run on tokio (its lease timer needs it): a request dropped outside a tokio runtime
//! has nowhere to run on, and its claim lapses with its lease. A server whose runtime shuts
//! down mid-request ends the task too: the claim is released, or lapses with its lease.
//!
//! What the task does not carry: anything a layer *outside* this one put in a tokio
//! `task_local!` (a request id, a tracing or Sentry context of its own, an authenticated
//! user), since the task runs outside that layer's future. A handler that reads such a value
//! after its client left would fail in the task, and a panic there releases the key, so that
//! the repeat runs the handler again: put layers that set per-request context *inside*
//! `IdempotencyLayer`, or have the handler read the request's extensions instead. Nor does a
//! limit outside the layer (a concurrency limit, a load shedder, a timeout) count the task: it
//! gives its slot back when the response future is dropped, while the handler runs on, and a
//! graceful shutdown of the server does not wait for such tasks (a runtime dropped under them
//! ends them, and their claims lapse with their lease). Put limits inside the layer too.
//!
//! # Streaming responses
//!
//! A guarded response (a keyed request to a guarded method) is buffered whole before the client
//! receives anything, headers included, so that it can be stored: a streaming route, such as
//! server-sent events or a large download, sends nothing until its stream ends or passes
//! [`max_response`](IdempotencyLayer::max_response), after which the rest streams through
//! unstored. Do not guard such routes (leave their methods out of
//! [`methods`](IdempotencyLayer::methods), or put the layer on the other routes only), or
//! document that their first byte waits for the whole response.

use crate::Error;
use crate::claim::{Session, Work};
use crate::observe::{Event, log_error, log_warn};
use crate::runtime::{Current, Runtime};
use crate::store::{ClaimOptions, Claimed, DEFAULT_CRASHES, Letter, Store, StoreKey};
use ::http::request::Parts;
use ::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service};

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header that marks a replay: `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;
/// The default limit on a guarded request's body: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// The default limit on a response buffered for storage: 1 MiB.
pub const DEFAULT_MAX_RESPONSE: usize = 1 << 20;
/// The `Retry-After` of a `409` (a repeat while the first request runs) and of a `503`.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The error type of the bodies this layer passes on.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body the wrapped service receives: the client's body as it streams (`Left`) for requests
/// the layer does not guard, the buffered body (`Right`) for those it does.
pub type RequestBody<B> = Either<B, Full<Bytes>>;

type ScopeFn = dyn Fn(&Parts) -> String + Send + Sync;

/// Whose keys a request's keys are: see [whose key it is](self#whose-key-it-is).
#[derive(Clone)]
enum Owner {
    /// The request's credentials (the default).
    Credentials,
    /// The service's own name for the caller: [`IdempotencyLayer::scope`].
    Named(Arc<ScopeFn>),
    /// One namespace for every caller: [`IdempotencyLayer::shared_keys`].
    Shared,
}

/// A tower [`Layer`] that honours the `Idempotency-Key` header on a [`Store`]. See the
/// [module documentation](self) for the behaviour.
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    store: Arc<dyn Store>,
    required: bool,
    methods: Vec<Method>,
    owner: Owner,
    /// The cookie that carries a session credential, digested with `Authorization`.
    credential_cookie: Option<HeaderValue>,
    /// Set once the layer warned that anonymous callers share their keys.
    warned_anonymous: Arc<AtomicBool>,
    crashes: u32,
    ttl: Duration,
    lease: Duration,
    max_body: usize,
    max_response: usize,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("required", &c.required)
            .field("methods", &c.methods)
            .field(
                "owner",
                &match c.owner {
                    Owner::Credentials => "credentials",
                    Owner::Named(_) => "scope",
                    Owner::Shared => "shared",
                },
            )
            .field("credential_cookie", &c.credential_cookie)
            .field("ttl", &c.ttl)
            .field("lease", &c.lease)
            .field("max_body", &c.max_body)
            .field("max_response", &c.max_response)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer on `store` (a [`MemoryStore`](crate::MemoryStore) for one process, a shared store
    /// such as `RedisStore` for several): keys optional, `POST` and `PATCH` guarded, keys kept
    /// per caller by the request's `Authorization` header (see
    /// [whose key it is](self#whose-key-it-is)), 24 h TTL, 30 s lease, 1 MiB limits.
    pub fn new<S: Store + 'static>(store: S) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                store: Arc::new(store),
                required: false,
                methods: vec![Method::POST, Method::PATCH],
                owner: Owner::Credentials,
                credential_cookie: None,
                warned_anonymous: Arc::new(AtomicBool::new(false)),
                crashes: DEFAULT_CRASHES,
                ttl: crate::idempotency::DEFAULT_TTL,
                lease: crate::idempotency::DEFAULT_LEASE,
                max_body: DEFAULT_MAX_BODY,
                max_response: DEFAULT_MAX_RESPONSE,
            }),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Whether a guarded method without a key is refused with `400` (`true`) or passed through
    /// unguarded (`false`, the default).
    pub fn required(mut self, required: bool) -> Self {
        self.config().required = required;
        self
    }

    /// The methods the layer guards (default `POST` and `PATCH`); others pass through untouched.
    pub fn methods<I: IntoIterator<Item = Method>>(mut self, methods: I) -> Self {
        self.config().methods = methods.into_iter().collect();
        self
    }

    /// Names the key's owner, such as the authenticated principal, from the request head: keys
    /// are kept per owner (under the store scope `http.<owner>`), so two callers' equal keys
    /// never meet, and one caller keeps its keys across a change of token. It replaces the
    /// default, the request's credentials; see [whose key it is](self#whose-key-it-is), which
    /// also shows the principal read from the extensions an axum auth layer set.
    ///
    /// ```
    /// use jobguard::http::IdempotencyLayer;
    ///
    /// fn tenant(parts: &http::request::Parts) -> String {
    ///     parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    /// }
    /// let layer = IdempotencyLayer::new(jobguard::MemoryStore::new()).scope(tenant);
    /// # drop(layer);
    /// ```
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.config().owner = Owner::Named(Arc::new(scope));
        self
    }

    /// Keeps every caller's keys in one namespace (the store scope `http`): a key sent by one
    /// client is the same key when another sends it, and the second is replayed the first's
    /// response. Only for a service whose callers are one party, or whose keys carry the caller
    /// already; see [whose key it is](self#whose-key-it-is). It replaces [`scope`](Self::scope)
    /// and the default.
    pub fn shared_keys(mut self) -> Self {
        self.config().owner = Owner::Shared;
        self
    }

    /// Counts the cookie `name` (a session cookie) as a credential, beside the `Authorization`
    /// header, in the default per-caller scope: two browsers with different sessions keep
    /// apart, and other cookies (a tracking id, a CSRF token) do not change whose key it is. The
    /// cookie's value is digested like the header, never stored.
    ///
    /// ```
    /// use jobguard::http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(jobguard::MemoryStore::new()).credential_cookie("session");
    /// # drop(layer);
    /// ```
    ///
    /// # Panics
    ///
    /// If `name` is not a valid cookie name (empty, or with a space, `=`, `;` or a non-ASCII
    /// character): a mistake in the service's code, found where the layer is built.
    pub fn credential_cookie(mut self, name: &str) -> Self {
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
        assert!(
            valid,
            "jobguard: credential_cookie({name:?}) is not a cookie name: use letters, digits and `-_.!#$%&'*+^`|~`"
        );
        self.config().credential_cookie = HeaderValue::from_str(name).ok();
        self
    }

    /// The crash limit (default 3): a key whose claims were abandoned this many times (the
    /// server died, or stalled past the lease, while answering it) is refused with a `500`
    /// problem document (type `…/idempotency-key/poisoned`) instead of running the handler
    /// again, until the key's TTL ends or it is forgiven ([`Store::forgive`]). A request that
    /// kills its server thus runs at most this many times. `0` never refuses. See
    /// [a server that dies](self#a-server-that-dies).
    pub fn crashes(mut self, crashes: u32) -> Self {
        self.config().crashes = crashes;
        self
    }

    /// How long a stored response is replayed (default 24 hours).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config().ttl = ttl;
        self
    }

    /// The claim's lease while the handler runs (default 30 s), renewed every third of it: how
    /// long a crashed server can block a key.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config().lease = lease.max(Duration::from_millis(3));
        self
    }

    /// The largest request body, in bytes, accepted with a key (default 1 MiB); a larger one is
    /// `413` before the handler runs.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.config().max_body = bytes;
        self
    }

    /// The largest response body, in bytes, buffered for storage (default 1 MiB). A larger
    /// response is passed through whole and not stored. The client receives nothing of a guarded
    /// response, headers included, until it is buffered whole or passes this limit: see
    /// [streaming responses](self#streaming-responses).
    pub fn max_response(mut self, bytes: usize) -> Self {
        self.config().max_response = bytes;
        self
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around `S`.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

/// The future [`IdempotencyService`] returns. Dropping it once the key is claimed does not stop
/// the handler: see [a client that hangs up](self#a-client-that-hangs-up).
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, ResBody> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was driven ready serves this request; a clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(self.config.clone(), inner, request))
    }
}

/// One request through the layer.
async fn serve<S, B, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<B>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    if !config.methods.contains(request.method()) {
        return pass(inner.call(request.map(Either::Left)).await);
    }
    let key = match parse_key(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) if config.required => return Ok(Problem::MissingKey.response()),
        Ok(None) => return pass(inner.call(request.map(Either::Left)).await),
        Err(fault) => return Ok(Problem::BadKey(fault).response()),
    };

    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > config.max_body as u64) {
        return Ok(Problem::TooLarge(config.max_body).response());
    }
    let body = match Limited::new(body, config.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return Ok(Problem::TooLarge(config.max_body).response());
        }
        Err(e) => return Ok(Problem::Unreadable(e.to_string()).response()),
    };

    let fingerprint = Fingerprint::of(&parts, &body);
    let scope = store_scope(&config, &parts);
    let request = Request::from_parts(parts, Either::Right(Full::new(body)));
    // From the claim on, the request runs to its end: the server dropping this future (the
    // client hung up) hands it to a task, which runs the handler, stores its response and holds
    // the key until then, so that the client's repeat is answered `409`, then replayed.
    Detach::new(guard(config, inner, request, scope, key, fingerprint)).await
}

/// Claims the key, then runs the handler and stores its response (or releases the claim), in a
/// [claim session](crate::claim) like a job's: the handler reads the claim's
/// [`fence()`](crate::fence), and the claims of servers that died mid-request are counted.
async fn guard<S, B, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<RequestBody<B>>,
    scope: Cow<'static, str>,
    key: String,
    fingerprint: Fingerprint,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Unpin,
    ResBody::Error: Into<BoxError>,
{
    let config = &*config;
    let key = StoreKey {
        scope: &scope,
        key: &key,
    };
    let session = Session::new(
        config.store.clone(),
        Current::get().to_owned(),
        key.scope,
        key,
        config.lease,
        Work::Request,
    );
    let options = ClaimOptions::new(config.lease)
        .fingerprint(Some(fingerprint.as_str()))
        .ttl(config.ttl)
        .crashes(config.crashes);
    let (generation, attempts, steps) = match session.claim(options).await {
        Ok(Claimed::Acquired {
            generation,
            crashes,
            attempts,
            steps,
        }) => {
            if crashes > 0 {
                log_warn(format_args!(
                    "jobguard: request {}:{} runs with {crashes} crash(es) counted, of servers \
                     that died answering it (refused at {})",
                    key.scope, key.key, config.crashes
                ));
            }
            (generation, attempts, steps)
        }
        Ok(Claimed::Completed(record)) => {
            return Ok(match decode(&record) {
                Ok(stored) => {
                    session.emit(Event::Replayed {
                        scope: key.scope,
                        key: key.key,
                    });
                    stored.replay()
                }
                Err(e) => {
                    log_error(format_args!(
                        "jobguard: stored response for {}:{} cannot be read: {e}",
                        key.scope, key.key
                    ));
                    Problem::Corrupt.response()
                }
            });
        }
        Ok(Claimed::InProgress { retry_in }) => {
            session.emit(Event::InProgress {
                scope: key.scope,
                key: key.key,
                retry_in,
            });
            return Ok(Problem::InProgress.response());
        }
        Ok(Claimed::KeyReused) => return Ok(Problem::KeyReused.response()),
        Ok(Claimed::Poisoned {
            crashes, letter, ..
        }) => {
            // A request's letter is this log line.
            if letter == Letter::Yours {
                log_error(format_args!(
                    "jobguard: request {}:{} refused for good: the server died {crashes} times \
                     answering it; a repeat with this key is answered 500 until the key's TTL \
                     ends (forgive the key to run it again)",
                    key.scope, key.key
                ));
                let _ = session.store().lettered(key).await;
            }
            return Ok(Problem::Poisoned(crashes).response());
        }
        Err(e) => return Ok(Problem::StoreDown(e).response()),
    };

    let held = session.hold(generation, attempts, steps);
    let outcome = held
        .run(async {
            let response = inner.call(request).await?;
            if !storable(response.status()) {
                return Ok(Outcome::NotStorable(response));
            }
            let (head, body) = response.into_parts();
            Ok(match buffer(body, config.max_response).await {
                Buffered::Complete(bytes) => Outcome::Complete(head, bytes),
                Buffered::Partial(body) => Outcome::TooLarge(Response::from_parts(head, body)),
            })
        })
        .await;

    match outcome {
        Err(error) => {
            held.release().await;
            Err(error)
        }
        Ok(Outcome::NotStorable(response)) => {
            held.release().await;
            pass(Ok(response))
        }
        Ok(Outcome::TooLarge(response)) => {
            held.session().emit(Event::StoreFailed {
                scope: key.scope,
                key: key.key,
            });
            held.release().await;
            #[cfg(feature = "tracing")]
            ::tracing::warn!(
                target: "jobguard",
                scope = key.scope,
                key = key.key,
                limit = config.max_response,
                "response larger than the storage limit, or with trailers: passed through, not stored"
            );
            Ok(response)
        }
        Ok(Outcome::Complete(head, body)) => {
            let record = encode(head.status, &head.headers, &body);
            // The handler's response goes to the client whatever happens here: its side effect
            // took place. A write that failed is raised and logged by the session.
            let _ = held.complete(&record, config.ttl).await;
            Ok(Response::from_parts(head, ResponseBody::full(body)))
        }
    }
}

/// The claimed part of a request (claim, handler, storing), polled in place like any future, and
/// handed to a task of its own if it is dropped before it ends: a server that gives up on the
/// request (the client hung up) does not stop it. Only a drop spawns, so a request that runs to
/// its end costs no task. The task runs in the [`Runtime`] scope (and, with
/// `tracing`, the span) the request was polled in.
struct Detach<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    /// The work, until it ends.
    work: Option<Pin<Box<F>>>,
    /// The runtime scope the work was started in, if any.
    scoped: Option<Runtime>,
    #[cfg(feature = "tracing")]
    span: ::tracing::Span,
    /// Set while the work is polled: still set at a drop when the poll panicked, and the work,
    /// unwound halfway, must not be polled again.
    polling: bool,
}

impl<F: Future + Send + 'static> Detach<F>
where
    F::Output: Send + 'static,
{
    fn new(work: F) -> Self {
        Detach {
            work: Some(Box::pin(work)),
            scoped: match Current::get() {
                Current::Scoped(runtime) => Some(runtime),
                Current::Static(_) => None,
            },
            #[cfg(feature = "tracing")]
            span: ::tracing::Span::current(),
            polling: false,
        }
    }
}

impl<F: Future + Send + 'static> Future for Detach<F>
where
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let Some(work) = this.work.as_mut() else {
            // Polled after it ended: there is nothing more to give.
            return Poll::Pending;
        };
        this.polling = true;
        let poll = work.as_mut().poll(cx);
        this.polling = false;
        if poll.is_ready() {
            this.work = None;
        }
        poll
    }
}

impl<F: Future + Send + 'static> Drop for Detach<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // A panic in the handler: the work is dropped here, and releases its claim, as the panic
        // goes on. Outside a tokio runtime there is nowhere to run it: dropped, its claim lapses.
        if self.polling {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let scoped = self.scoped.take();
        let task = async move {
            match scoped {
                Some(runtime) => drop(runtime.scope(work).await),
                None => drop(work.await),
            }
        };
        #[cfg(feature = "tracing")]
        let task = ::tracing::Instrument::instrument(task, self.span.clone());
        drop(handle.spawn(task));
    }
}

/// What the handler answered, as the layer will treat it.
enum Outcome<B> {
    /// A status that is not stored (`5xx`, `408`, `429`).
    NotStorable(Response<B>),
    /// A status that is stored, with the whole body.
    Complete(::http::response::Parts, Bytes),
    /// Larger than the storage limit, or with trailers: passed on as it streams.
    TooLarge(Response<ResponseBody<B>>),
}

/// Whether a response with this status is stored and replayed. Server errors, `408` and `429`
/// say "try again", so they are not.
pub fn storable(status: StatusCode) -> bool {
    !(status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS)
}

fn pass<B, E>(result: Result<Response<B>, E>) -> Result<Response<ResponseBody<B>>, E> {
    result.map(|response| response.map(ResponseBody::stream))
}

// ---------------------------------------------------------------------------------------------
// The key, the scope and the fingerprint.

/// What is wrong with an `Idempotency-Key` header, in words for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFault {
    /// More than one `Idempotency-Key` header.
    Repeated(usize),
    /// The value is empty (or only spaces, or `""`).
    Empty,
    /// Longer than [`MAX_KEY_LEN`].
    TooLong(usize),
    /// A byte outside printable ASCII.
    NotAscii,
    /// A list of keys (`"a", "b"`).
    List,
    /// Not a structured-field string nor a bare token: the message says where.
    Malformed(&'static str),
}

impl fmt::Display for KeyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFault::Repeated(n) => write!(
                f,
                "the request carries {n} Idempotency-Key headers; send exactly one"
            ),
            KeyFault::Empty => f.write_str(
                "the Idempotency-Key header is empty; send a unique key of 1 to 255 characters, such as a UUID",
            ),
            KeyFault::TooLong(n) => write!(
                f,
                "the Idempotency-Key is {n} characters long; the limit is {MAX_KEY_LEN}"
            ),
            KeyFault::NotAscii => f.write_str(
                "the Idempotency-Key contains characters outside printable ASCII; use letters, digits and punctuation only, such as a UUID",
            ),
            KeyFault::List => f.write_str(
                "the Idempotency-Key header holds a list of keys; send one key, as a quoted string (\"abc\") or a bare token (abc)",
            ),
            KeyFault::Malformed(why) => write!(
                f,
                "the Idempotency-Key is not a quoted string (\"abc\") nor a bare token (abc): {why}"
            ),
        }
    }
}

/// Reads the `Idempotency-Key` header: `None` when there is none.
///
/// The value is a structured-field string (`"abc"`, with `\"` and `\\` escapes) or a bare token
/// (`abc`: printable ASCII without spaces, `"`, `,`, `;` or `\`), of 1 to [`MAX_KEY_LEN`]
/// characters.
///
/// ```
/// use http::HeaderMap;
/// use jobguard::http::{KeyFault, parse_key};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("idempotency-key", "\"8e03978e-40d5\"".parse().unwrap());
/// assert_eq!(parse_key(&headers), Ok(Some("8e03978e-40d5".to_owned())));
/// headers.insert("idempotency-key", "\"a\", \"b\"".parse().unwrap());
/// assert_eq!(parse_key(&headers), Err(KeyFault::List));
/// ```
pub fn parse_key(headers: &HeaderMap) -> Result<Option<String>, KeyFault> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let more = values.count();
    if more > 0 {
        return Err(KeyFault::Repeated(more + 1));
    }
    parse_value(value).map(Some)
}

fn parse_value(value: &HeaderValue) -> Result<String, KeyFault> {
    let bytes = value.as_bytes();
    if bytes
        .iter()
        .any(|b| !(0x20..0x7f).contains(b) && *b != b'\t')
    {
        return Err(KeyFault::NotAscii);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| KeyFault::NotAscii)?;
    let text = text.trim_matches([' ', '\t']);
    let key = match text.strip_prefix('"') {
        Some(quoted) => parse_string(quoted)?,
        None => parse_token(text)?,
    };
    match key.len() {
        0 => Err(KeyFault::Empty),
        n if n > MAX_KEY_LEN => Err(KeyFault::TooLong(n)),
        _ => Ok(key),
    }
}

/// A structured-field string after its opening quote (RFC 9651 section 4.2.5).
fn parse_string(rest: &str) -> Result<String, KeyFault> {
    let mut key = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    loop {
        match chars.next() {
            None => return Err(KeyFault::Malformed("the closing quote is missing")),
            Some('\\') => match chars.next() {
                Some(c @ ('"' | '\\')) => key.push(c),
                _ => {
                    return Err(KeyFault::Malformed(
                        "a backslash may only escape `\"` or `\\`",
                    ));
                }
            },
            Some('"') => break,
            Some(c) => key.push(c),
        }
    }
    let after = chars.as_str().trim_start_matches([' ', '\t']);
    match after.chars().next() {
        None => Ok(key),
        Some(',') => Err(KeyFault::List),
        Some(';') => Err(KeyFault::Malformed(
            "parameters after the key are not accepted",
        )),
        Some(_) => Err(KeyFault::Malformed(
            "there are characters after the closing quote",
        )),
    }
}

fn parse_token(text: &str) -> Result<String, KeyFault> {
    if text.contains(',') {
        return Err(KeyFault::List);
    }
    if text.contains([' ', '\t']) {
        return Err(KeyFault::Malformed("a bare key cannot contain spaces"));
    }
    if text.contains(['"', ';', '\\']) {
        return Err(KeyFault::Malformed(
            "a bare key cannot contain `\"`, `;` or `\\`; quote it instead",
        ));
    }
    Ok(text.to_owned())
}

/// The store scope of a request's keys (a store scope never contains `:`):
/// * `http.<owner>` with [`scope`](IdempotencyLayer::scope), `:` and `%` percent-encoded;
/// * `http` with [`shared_keys`](IdempotencyLayer::shared_keys);
/// * `http-caller.<digest>` by default, for a request with credentials;
/// * `http-anonymous` by default, for a request without.
///
/// No owner a service names can be written like the last two, which start `http-`.
fn store_scope(config: &Config, parts: &Parts) -> Cow<'static, str> {
    match &config.owner {
        Owner::Shared => Cow::Borrowed("http"),
        Owner::Named(scope) => {
            let owner = scope(parts);
            let mut out = String::with_capacity(5 + owner.len());
            out.push_str("http.");
            for c in owner.chars() {
                match c {
                    '%' => out.push_str("%25"),
                    ':' => out.push_str("%3A"),
                    c => out.push(c),
                }
            }
            Cow::Owned(out)
        }
        Owner::Credentials => match credentials_digest(parts, config.credential_cookie.as_ref()) {
            Some(digest) => Cow::Owned(format!("http-caller.{digest}")),
            None => {
                if !config.warned_anonymous.swap(true, Ordering::Relaxed) {
                    log_warn(format_args!(
                        "jobguard: a request with an Idempotency-Key came without credentials{}: keys of anonymous callers share one scope, `http-anonymous`, so one anonymous client can be replayed another's response; that is safe only if such responses hold nothing private. Name the caller with IdempotencyLayer::scope, or require credentials (this is said once per layer)",
                        match &config.credential_cookie {
                            Some(name) => format!(
                                " (no Authorization header, no `{}` cookie)",
                                String::from_utf8_lossy(name.as_bytes())
                            ),
                            None => " (no Authorization header)".to_owned(),
                        }
                    ));
                }
                Cow::Borrowed("http-anonymous")
            }
        },
    }
}

/// The first 128 bits of a SHA-256 over the request's credentials, in hex: every `Authorization`
/// header in order, then the named cookie's value, each behind a tag and its length so that no
/// two sets of values hash alike. `None` when the request carries neither.
fn credentials_digest(parts: &Parts, cookie: Option<&HeaderValue>) -> Option<String> {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new().chain_update(b"jobguard http credentials v1");
    let mut any = false;
    let mut add = |tag: &[u8], value: &[u8]| {
        any = true;
        hash.update(tag);
        hash.update((value.len() as u64).to_be_bytes());
        hash.update(value);
    };
    for value in parts.headers.get_all(header::AUTHORIZATION) {
        add(b"A", value.as_bytes());
    }
    if let Some(name) = cookie {
        for value in cookie_values(&parts.headers, name.as_bytes()) {
            add(b"C", value);
        }
    }
    if !any {
        return None;
    }
    let digest = hash.finalize();
    let mut out = String::with_capacity(32);
    for b in &digest[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    Some(out)
}

/// The values of the cookie `name` in the request's `Cookie` headers (RFC 6265: `a=1; b=2`),
/// quotes included as sent.
fn cookie_values<'a>(headers: &'a HeaderMap, name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
        .filter_map(move |pair| {
            let pair = pair.trim_ascii();
            let at = pair.iter().position(|&b| b == b'=')?;
            (pair[..at].trim_ascii() == name).then(|| pair[at + 1..].trim_ascii())
        })
}

/// SHA-256 over the method, the path and query, and the body, in hex. Method and target cannot
/// contain a NUL byte, so the NULs between them keep the fields apart.
struct Fingerprint([u8; 64]);

impl Fingerprint {
    fn of(parts: &Parts, body: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let digest = Sha256::new()
            .chain_update(parts.method.as_str())
            .chain_update([0])
            .chain_update(target)
            .chain_update([0])
            .chain_update(body)
            .finalize();
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0; 64];
        for (i, b) in digest.iter().enumerate() {
            out[2 * i] = HEX[usize::from(b >> 4)];
            out[2 * i + 1] = HEX[usize::from(b & 15)];
        }
        Fingerprint(out)
    }

    fn as_str(&self) -> &str {
        // Hex digits only: always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// The stored response.

/// The format tag of a stored response.
const MAGIC: &[u8; 4] = b"JGH1";

/// Whether a response header is stored with the body.
fn kept(name: &HeaderName) -> bool {
    (name.as_str().starts_with("content-") && name != header::CONTENT_LENGTH)
        || name == header::LOCATION
}

/// `JGH1`, the status (u16), the number of headers (u16), each header as name length (u16),
/// name, value length (u32), value; then the body to the end. All integers big-endian.
fn encode(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let (mut count, mut size) = (0u16, 0usize);
    for (name, value) in headers.iter().filter(|(name, _)| kept(name)) {
        count += 1;
        size += 6 + name.as_str().len() + value.len();
    }
    let mut out = Vec::with_capacity(8 + size + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in headers.iter().filter(|(name, _)| kept(name)) {
        out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// A response read back from the store.
struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Stored {
    fn replay<B>(self) -> Response<ResponseBody<B>> {
        let mut response = Response::new(ResponseBody::full(self.body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        response
    }
}

fn decode(record: &[u8]) -> Result<Stored, Error> {
    fn corrupt(what: &str) -> Error {
        Error::Corrupt(format!("stored HTTP response: {what}"))
    }
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], Error> {
        if rest.len() < n {
            return Err(corrupt("truncated"));
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Ok(head)
    }
    fn u16_at(rest: &mut &[u8]) -> Result<u16, Error> {
        let b = take(rest, 2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    let mut rest = record;
    if take(&mut rest, 4)? != MAGIC {
        return Err(corrupt("not a jobguard HTTP record"));
    }
    let status = StatusCode::from_u16(u16_at(&mut rest)?).map_err(|_| corrupt("bad status"))?;
    let count = u16_at(&mut rest)?;
    let mut headers = HeaderMap::with_capacity(usize::from(count) + 1);
    for _ in 0..count {
        let len = usize::from(u16_at(&mut rest)?);
        let name = HeaderName::from_bytes(take(&mut rest, len)?)
            .map_err(|_| corrupt("bad header name"))?;
        let b = take(&mut rest, 4)?;
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let value = HeaderValue::from_bytes(take(&mut rest, len)?)
            .map_err(|_| corrupt("bad header value"))?;
        headers.append(name, value);
    }
    Ok(Stored {
        status,
        headers,
        body: Bytes::copy_from_slice(rest),
    })
}

// ---------------------------------------------------------------------------------------------
// Response bodies.

/// A response body buffered for storage, or what was read of it before it turned out too large
/// (or to end in trailers or an error), followed by the rest.
enum Buffered<B> {
    Complete(Bytes),
    Partial(ResponseBody<B>),
}

async fn buffer<B>(mut body: B, limit: usize) -> Buffered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > limit as u64 {
        return Buffered::Partial(ResponseBody::stream(body));
    }
    // One frame is kept as it is; only a body in several frames is copied together.
    let mut first: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    let mut len = 0usize;
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(error)) => {
                let head = joined_bytes(first, joined);
                return Buffered::Partial(ResponseBody {
                    head: Some(head),
                    tail: Tail::Error(error.into()),
                    rest: None,
                });
            }
        };
        match frame.into_data() {
            Ok(data) => {
                len += data.len();
                if len > limit {
                    let mut head = joined_bytes(first, joined);
                    if head.is_empty() {
                        head = data;
                    } else {
                        let mut both = BytesMut::from(head);
                        both.extend_from_slice(&data);
                        head = both.freeze();
                    }
                    return Buffered::Partial(ResponseBody {
                        head: Some(head),
                        tail: Tail::None,
                        rest: Some(body),
                    });
                }
                match first.take() {
                    None if joined.is_empty() => first = Some(data),
                    None => joined.extend_from_slice(&data),
                    Some(one) => {
                        joined.extend_from_slice(&one);
                        joined.extend_from_slice(&data);
                    }
                }
            }
            Err(frame) => {
                let head = joined_bytes(first, joined);
                let tail = match frame.into_trailers() {
                    Ok(trailers) => Tail::Trailers(trailers),
                    Err(_) => Tail::None,
                };
                return Buffered::Partial(ResponseBody {
                    head: Some(head),
                    tail,
                    rest: Some(body),
                });
            }
        }
    }
    Buffered::Complete(joined_bytes(first, joined))
}

fn joined_bytes(first: Option<Bytes>, joined: BytesMut) -> Bytes {
    first.unwrap_or_else(|| joined.freeze())
}

/// What a [`ResponseBody`] yields after its buffered head, before the rest of the inner body.
enum Tail {
    None,
    Trailers(HeaderMap),
    Error(BoxError),
}

/// The body of a response that went through [`IdempotencyLayer`]: the handler's body as it
/// streams, a replayed or buffered body, or a problem document.
pub struct ResponseBody<B> {
    /// Data already read, yielded first.
    head: Option<Bytes>,
    /// Trailers or an error read after the head, yielded next.
    tail: Tail,
    /// The rest of the handler's body.
    rest: Option<B>,
}

impl<B> ResponseBody<B> {
    fn full(data: Bytes) -> Self {
        ResponseBody {
            head: Some(data),
            tail: Tail::None,
            rest: None,
        }
    }

    fn stream(body: B) -> Self {
        ResponseBody {
            head: None,
            tail: Tail::None,
            rest: Some(body),
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("buffered", &self.head.as_ref().map_or(0, Bytes::len))
            .field("streaming", &self.rest.is_some())
            .finish()
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(data) = this.head.take()
            && !data.is_empty()
        {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match std::mem::replace(&mut this.tail, Tail::None) {
            Tail::None => {}
            Tail::Trailers(trailers) => return Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Tail::Error(error) => {
                this.rest = None;
                return Poll::Ready(Some(Err(error)));
            }
        }
        match this.rest.as_mut() {
            Some(rest) => Pin::new(rest)
                .poll_frame(cx)
                .map(|frame| frame.map(|r| r.map_err(Into::into))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.head.as_ref().is_none_or(Bytes::is_empty)
            && matches!(self.tail, Tail::None)
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, Bytes::len) as u64;
        match &self.rest {
            None => SizeHint::with_exact(head),
            Some(rest) => {
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower() + head);
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper + head);
                }
                sum
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Problem documents (RFC 9457).

/// The answers the layer gives itself.
enum Problem {
    MissingKey,
    BadKey(KeyFault),
    TooLarge(usize),
    Unreadable(String),
    InProgress,
    KeyReused,
    StoreDown(Error),
    Corrupt,
    Poisoned(u32),
}

impl Problem {
    fn response<B>(self) -> Response<ResponseBody<B>> {
        let (status, kind, title, detail) = match self {
            Problem::MissingKey => (
                StatusCode::BAD_REQUEST,
                "missing",
                "Idempotency-Key is missing",
                "This operation requires an Idempotency-Key header. Send a unique key (such as a \
                 UUID) with the request, and send the same key when you repeat it."
                    .to_owned(),
            ),
            Problem::BadKey(fault) => (
                StatusCode::BAD_REQUEST,
                "malformed",
                "Idempotency-Key is malformed",
                format!("{fault}. The request was not processed."),
            ),
            Problem::TooLarge(limit) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!(
                    "A request with an Idempotency-Key may carry at most {limit} bytes. The \
                     request was not processed."
                ),
            ),
            Problem::Unreadable(why) => (
                StatusCode::BAD_REQUEST,
                "body-unreadable",
                "Request body could not be read",
                format!(
                    "The request body ended with an error ({why}). The request was not \
                     processed; send it again with the same Idempotency-Key."
                ),
            ),
            Problem::InProgress => (
                StatusCode::CONFLICT,
                "in-progress",
                "A request with this Idempotency-Key is in progress",
                format!(
                    "The first request with this key is still being processed. Retry after {} \
                     second(s) with the same key to receive its response.",
                    RETRY_AFTER.as_secs()
                ),
            ),
            Problem::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency-Key reused with a different request",
                "This key was already used with a different method, path, query or body. Use a \
                 new key for a new request, or repeat the original request exactly."
                    .to_owned(),
            ),
            Problem::StoreDown(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                format!(
                    "The server could not check the Idempotency-Key ({e}), so the request was \
                     not processed. Retry later with the same key."
                ),
            ),
            Problem::Corrupt => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "record-unreadable",
                "Stored response unreadable",
                "A response is stored for this Idempotency-Key but cannot be read back. The \
                 request was not processed again; contact the operator of this service."
                    .to_owned(),
            ),
            Problem::Poisoned(crashes) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "poisoned",
                "Requests with this Idempotency-Key crashed the server",
                format!(
                    "The server stopped {crashes} times while processing a request with this \
                     key, so it is not processed again with this key. Do not repeat it; \
                     contact the operator of this service, who can find the key in the \
                     server's log."
                ),
            ),
        };
        #[derive(serde::Serialize)]
        struct Document<'a> {
            r#type: String,
            title: &'a str,
            status: u16,
            detail: String,
        }
        let document = Document {
            r#type: format!("tag:jobguard,2026:idempotency-key/{kind}"),
            title,
            status: status.as_u16(),
            detail,
        };
        let body = serde_json::to_vec(&document).unwrap_or_default();
        let mut response = Response::new(ResponseBody::full(Bytes::from(body)));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if matches!(
            status,
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
        ) {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(RETRY_AFTER.as_secs()),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &[u8]) -> Result<Option<String>, KeyFault> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_bytes(value).unwrap());
        parse_key(&headers)
    }

    fn head(headers: &[(&str, &str)]) -> Parts {
        let mut request = Request::post("/charge");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_caller_is_its_credentials_digested() {
        let session = HeaderValue::from_static("session");
        let digest = |headers: &[(&str, &str)]| credentials_digest(&head(headers), Some(&session));
        let alice = digest(&[("authorization", "Bearer alice-secret-token")]).unwrap();
        assert_eq!(alice.len(), 32);
        assert!(alice.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!alice.contains("alice"));
        assert_eq!(
            digest(&[("authorization", "Bearer alice-secret-token")]),
            Some(alice.clone()),
            "stable"
        );
        assert_ne!(
            digest(&[("authorization", "Bearer bob")]),
            Some(alice.clone())
        );
        assert_eq!(digest(&[]), None);
        assert_eq!(
            digest(&[("cookie", "theme=dark; csrf=1")]),
            None,
            "other cookies"
        );
        // The session cookie, wherever it stands, and not the cookies around it.
        let s1 = digest(&[("cookie", "theme=dark; session=s1; csrf=9")]).unwrap();
        assert_eq!(digest(&[("cookie", "session=s1")]), Some(s1.clone()));
        assert_eq!(
            digest(&[("cookie", "csrf=2"), ("cookie", " session = s1 ")]),
            Some(s1.clone())
        );
        assert_ne!(digest(&[("cookie", "session=s2")]), Some(s1.clone()));
        assert_ne!(digest(&[("cookie", "xsession=s1")]), Some(s1.clone()));
        // A cookie's value is not a header's: the two are told apart.
        assert_ne!(digest(&[("authorization", "s1")]), Some(s1));
    }

    #[test]
    fn scopes_by_owner() {
        let layer = IdempotencyLayer::new(crate::MemoryStore::new());
        let bearer = head(&[("authorization", "Bearer t")]);
        let scope = store_scope(&layer.config, &bearer);
        assert!(scope.starts_with("http-caller."), "{scope}");
        assert_eq!(store_scope(&layer.config, &head(&[])), "http-anonymous");
        let shared = layer.clone().shared_keys();
        assert_eq!(store_scope(&shared.config, &bearer), "http");
        let named = layer.scope(|_: &Parts| "acme:eu%".to_owned());
        assert_eq!(store_scope(&named.config, &bearer), "http.acme%3Aeu%25");
    }

    #[test]
    #[should_panic(expected = "is not a cookie name")]
    fn a_cookie_name_is_checked_where_the_layer_is_built() {
        let _ = IdempotencyLayer::new(crate::MemoryStore::new()).credential_cookie("my session");
    }

    #[test]
    fn keys_as_strings_and_tokens() {
        assert_eq!(key(b"\"abc\""), Ok(Some("abc".into())));
        assert_eq!(key(b"abc"), Ok(Some("abc".into())));
        assert_eq!(key(b" abc "), Ok(Some("abc".into())));
        assert_eq!(key(b"\"a\\\"b\""), Ok(Some("a\"b".into())));
        assert_eq!(key(b"\"with space\""), Ok(Some("with space".into())));
        assert_eq!(
            key(b"8e03978e-40d5-43e8-bc93-6894a57f9324"),
            Ok(Some("8e03978e-40d5-43e8-bc93-6894a57f9324".into()))
        );
        assert_eq!(key(&[b'k'; 255]), Ok(Some("k".repeat(255))));
    }

    #[test]
    fn malformed_keys_are_named() {
        assert_eq!(key(b""), Err(KeyFault::Empty));
        assert_eq!(key(b"\"\""), Err(KeyFault::Empty));
        assert_eq!(key(&[b'k'; 256]), Err(KeyFault::TooLong(256)));
        assert_eq!(key("clé".as_bytes()), Err(KeyFault::NotAscii));
        assert_eq!(key(b"\"a\", \"b\""), Err(KeyFault::List));
        assert_eq!(key(b"a, b"), Err(KeyFault::List));
        assert!(matches!(key(b"\"abc"), Err(KeyFault::Malformed(_))));
        assert!(matches!(key(b"\"abc\";p=1"), Err(KeyFault::Malformed(_))));
        assert!(matches!(key(b"a b"), Err(KeyFault::Malformed(_))));
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("b"));
        assert_eq!(parse_key(&headers), Err(KeyFault::Repeated(2)));
        for fault in [KeyFault::Empty, KeyFault::List, KeyFault::TooLong(300)] {
            assert!(fault.to_string().contains("Idempotency-Key"), "{fault}");
        }
    }

    #[test]
    fn records_round_trip() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        headers.insert(header::LOCATION, HeaderValue::from_static("/charges/1"));
        headers.insert(header::SERVER, HeaderValue::from_static("x"));
        let record = encode(StatusCode::CREATED, &headers, b"hello");
        let stored = decode(&record).unwrap();
        assert_eq!(stored.status, StatusCode::CREATED);
        assert_eq!(&stored.body[..], b"hello");
        assert_eq!(stored.headers.len(), 2);
        assert_eq!(stored.headers[header::CONTENT_TYPE], "text/plain");
        assert_eq!(stored.headers[header::LOCATION], "/charges/1");
        for cut in 0..record.len() - 5 {
            assert!(decode(&record[..cut]).is_err(), "{cut}");
        }
        assert!(decode(b"{\"v\":1}").is_err());
    }

    #[test]
    fn what_is_stored() {
        for code in [200, 201, 204, 301, 400, 404, 409, 422] {
            assert!(storable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(!storable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }
}
