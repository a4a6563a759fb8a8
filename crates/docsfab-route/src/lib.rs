//! The composition route behind `docsfab route serve`. The CLI resolves the provider from the
//! host configuration and the composition, then calls [`serve`].
//!
//! A loopback HTTP server that speaks the client's API (`POST /v1/chat/completions`,
//! `POST /v1/messages`) and forwards each request to the composition's provider:
//!
//! 1. [`rewrite`] (pure) checks the request and sets the composition's selected model;
//! 2. the provider crate's replay driver sends it, with the host's effective replay limits and the
//!    composition's `timeoutMs` as the deadline, exactly as a step's turn would (CLS-7);
//! 3. a 200 body, buffered whole, goes through the response boundary (BND-1) and is then either
//!    forwarded verbatim or replaced by an error in the client's API shape ([`Reply`]);
//! 4. a failure the replay gave up on becomes a sanitized error ([`failure_reply`], pure), except
//!    a 200 stream that ended on a structured error event and was read to its end: that body
//!    goes through the boundary and, when it passes, to the client as it came (BND-2).
//!
//! The layer here is thin on purpose: the decisions are in the pure functions below, the
//! boundary crate and the replay policy. docs/route.md describes the behaviour for operators.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use docsfab_boundary::{BoundaryConfig, Redactor, Refusal, Secret, Verdict};
use docsfab_policy::replay::{ReplayLimits, StopReason};
use docsfab_provider::driver::{DriverEvent, Gate, run_turn_gated};
use docsfab_provider::{ApiKey, HttpConfig, HttpTransport, Payload, TransportFailure, TurnEnd};
use docsfab_record::{Api, FaultKind, ProviderErrorClass};
use docsfab_throttle::Throttle;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http_server::{BodyRefusal, read_body};

pub mod http_server;

pub use http_server::ServerLimits;

/// Largest client request body accepted (axum's default of 2 MiB is too small for long prompts).
pub const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;

/// Why the route did not start: bad input or configuration (the CLI exits 2), or a failure of
/// the machine (exit 1). The message is one sentence for stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    BadInput(String),
    Failed(String),
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteError::BadInput(m) | RouteError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for RouteError {}

/// The provider the route forwards to, as the CLI resolved it from the host configuration and
/// the composition.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The provider's name in host.yaml, for messages.
    pub provider_name: String,
    /// Where host.yaml was read from, for messages.
    pub host_path: String,
    pub api: Api,
    pub base_url: String,
    /// The composition's selected model.
    pub model: String,
    /// The environment variable the key came from, for messages and the boundary's secret list.
    pub key_env: String,
    /// The key itself; empty when the variable is not set.
    pub key: String,
    /// The host's effective replay limits.
    pub limits: ReplayLimits,
    /// The composition's `limits.timeoutMs`.
    pub timeout: Duration,
    /// The shared provider throttle: the route sends with the host's key, so it shares the
    /// hold and the in-flight cap with every run on the same DOCSFAB_HOME. `None` sends at once.
    pub throttle: Option<Throttle>,
}

/// The route holds the host's key and answers anyone who can connect: never off the host.
/// Checked before anything else is read, so the refusal does not depend on the configuration.
pub fn check_listen(listen: SocketAddr) -> Result<(), RouteError> {
    if listen.ip().is_loopback() {
        Ok(())
    } else {
        Err(RouteError::BadInput(format!(
            "the route listens on loopback only, and {listen} is not a loopback address; use 127.0.0.1:PORT or [::1]:PORT."
        )))
    }
}

/// `docsfab route serve`: sets up the boundary and the transport for `upstream`, then serves on
/// `listen` until Ctrl-C or SIGTERM. Prints `listening on http://ADDR/v1` on stdout first.
pub fn serve(
    listen: SocketAddr,
    upstream: Upstream,
    server: ServerLimits,
) -> Result<(), RouteError> {
    check_listen(listen)?;
    let Upstream {
        provider_name,
        host_path,
        api,
        base_url,
        model,
        key_env: var,
        key,
        limits,
        timeout,
        throttle,
    } = upstream;
    if key.is_empty() {
        return Err(RouteError::BadInput(format!(
            "provider {provider_name:?} reads its API key from the environment variable {var}, which is not set; export it before starting the route."
        )));
    }
    let secrets: Vec<Secret> = match Secret::new(&var, &key) {
        Ok(s) => vec![s],
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "warning: the key in {var} is shorter than 8 bytes, so the boundary cannot look for it in responses (it still looks for every known key shape)."
            );
            Vec::new()
        }
    };
    let boundary = BoundaryConfig::new(api, &model, &secrets).map_err(|e| {
        RouteError::BadInput(format!("the response boundary cannot be set up: {e}."))
    })?;
    let http = HttpConfig {
        keep_raw_body: true,
        ..HttpConfig::new(api, base_url, Some(ApiKey::new(key.clone())))
    };
    let transport = HttpTransport::new(http)
        .map_err(|e| {
            RouteError::BadInput(format!("provider {provider_name:?} in {host_path}: {e}."))
        })?
        .with_boundary(boundary.clone());
    let route = Arc::new(Route {
        api,
        model,
        transport,
        limits,
        timeout,
        boundary,
        key: ApiKey::new(key),
        cancel: CancellationToken::new(),
        requests: AtomicU64::new(0),
        body_timeout: server.body_timeout,
        throttle,
        provider_name,
    });
    let rt = tokio::runtime::Runtime::new()
        .map_err(|e| RouteError::Failed(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(run(listen, route, server))
}

async fn run(
    listen: SocketAddr,
    route: Arc<Route>,
    limits: ServerLimits,
) -> Result<(), RouteError> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        RouteError::BadInput(format!(
            "cannot listen on {listen} ({e}); pick another port or 0 for a free one."
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| RouteError::Failed(format!("cannot read the listening address: {e}")))?;
    let shutdown = shutdown_signal()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}/v1")
            .and_then(|()| out.flush())
            .map_err(|e| RouteError::Failed(format!("cannot write to standard output ({e}).")))?;
    }
    let _ = writeln!(
        std::io::stderr(),
        "route: {} model={} (OpenAI clients: base URL http://{addr}/v1; Anthropic clients: http://{addr})",
        route.api,
        route.model
    );
    let cancel = route.cancel.clone();
    let app = router(route);
    let stopped = http_server::serve(listener, app, limits, busy_body(), shutdown, move || {
        // Ends turns and body reads in flight (their clients get a 503) so shutdown does not
        // wait on them.
        cancel.cancel();
    })
    .await;
    let _ = if !stopped.drained {
        writeln!(
            std::io::stderr(),
            "route: stopped; connections still open after the {} ms shutdown grace were closed",
            limits.shutdown_grace.as_millis()
        )
    } else {
        writeln!(std::io::stderr(), "route: stopped")
    };
    Ok(())
}

/// The 503 past the connection cap. It is sent before the request is read, so its body has
/// both APIs' shapes at once: OpenAI clients read `error.message/type/code`, Anthropic clients
/// read `type: "error"` and `error.type/message`.
fn busy_body() -> Bytes {
    let v = json!({
        "type": "error",
        "error": {
            "type": "overloaded_error",
            "code": "route-busy",
            "message": "the composition route is serving as many connections as it allows (--max-connections); retry shortly (route-busy)",
        }
    });
    Bytes::from(v.to_string())
}

/// Resolves on Ctrl-C or SIGTERM. Installed before the `listening on` line so a supervisor that
/// signals as soon as it reads it still gets a clean stop.
fn shutdown_signal() -> Result<impl Future<Output = ()>, RouteError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())
            .map_err(|e| RouteError::Failed(format!("cannot install the signal handler: {e}")))?;
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| RouteError::Failed(format!("cannot install the signal handler: {e}")))?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

fn router(route: Arc<Route>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(|State(r): State<Arc<Route>>, req: Request| async move {
                r.receive(Api::OpenaiChat, req.into_body()).await
            }),
        )
        .route(
            "/v1/messages",
            post(|State(r): State<Arc<Route>>, req: Request| async move {
                r.receive(Api::AnthropicMessages, req.into_body()).await
            }),
        )
        .method_not_allowed_fallback(|uri: Uri| async move {
            Reply::error(
                api_of_path(uri.path()),
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method-not-allowed",
                "the composition route serves POST /v1/chat/completions and POST /v1/messages only",
            )
        })
        .fallback(|uri: Uri| async move {
            Reply::error(
                api_of_path(uri.path()),
                StatusCode::NOT_FOUND,
                "not_found_error",
                "not-found",
                "the composition route serves POST /v1/chat/completions and POST /v1/messages only",
            )
        })
        .with_state(route)
}

/// Whose error shape a refusal takes when the path is not one the route serves: Anthropic's
/// for paths under its endpoint, OpenAI's otherwise.
fn api_of_path(path: &str) -> Api {
    if path.starts_with("/v1/messages") {
        Api::AnthropicMessages
    } else {
        Api::OpenaiChat
    }
}

/// A request body the route did not read whole, as an error in the client's API shape. The
/// connection closes after it: the rest of the request is not worth waiting for.
fn body_refusal_reply(api: Api, refusal: BodyRefusal) -> Reply {
    match refusal {
        BodyRefusal::TooLarge { limit } => Reply::error(
            api,
            StatusCode::PAYLOAD_TOO_LARGE,
            match api {
                Api::OpenaiChat => "invalid_request_error",
                Api::AnthropicMessages => "request_too_large",
            },
            "request-too-large",
            &format!(
                "the request body is larger than the composition route accepts ({limit} bytes); shorten the prompt or split the work"
            ),
        ),
        BodyRefusal::TooSlow { timeout } => Reply::error(
            api,
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            "request-body-timeout",
            &format!(
                "the request body did not arrive in full within {} ms of its head (--body-timeout-ms); send the whole body at once",
                timeout.as_millis()
            ),
        ),
        BodyRefusal::Cancelled => Reply::error(
            api,
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "route-shutting-down",
            "the composition route is shutting down",
        ),
        BodyRefusal::Broken => Reply::error(
            api,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "request-body-broken",
            "the request body broke off before its end",
        ),
    }
}

/// Everything a request needs, shared by all of them.
struct Route {
    /// The provider's API.
    api: Api,
    /// The composition's selected model.
    model: String,
    transport: HttpTransport,
    limits: ReplayLimits,
    /// The composition's `limits.timeoutMs`: no request waits past it.
    timeout: Duration,
    boundary: BoundaryConfig,
    /// Only to scrub it from any text we send or log, should a provider echo it.
    key: ApiKey,
    cancel: CancellationToken,
    requests: AtomicU64,
    /// How long a request body may take to arrive after its head.
    body_timeout: Duration,
    throttle: Option<Throttle>,
    /// host.yaml's name of the provider: the throttle's key.
    provider_name: String,
}

impl Route {
    /// Reads the body (capped and timed), then [`Route::handle`]s it.
    async fn receive(&self, client_api: Api, body: Body) -> Response {
        match read_body(body, MAX_REQUEST_BYTES, self.body_timeout, &self.cancel).await {
            Ok(bytes) => self.handle(client_api, bytes).await.into_response(),
            Err(refusal) => {
                let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
                let reply = body_refusal_reply(client_api, refusal);
                let path = docsfab_provider::endpoint_path(client_api);
                self.log(n, path, &format!("{} (nothing sent)", reply.summary()));
                let mut response = reply.into_response();
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
        }
    }

    async fn handle(&self, client_api: Api, body: Bytes) -> Reply {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let path = docsfab_provider::endpoint_path(client_api);
        let bytes = match rewrite(client_api, self.api, &self.model, &body) {
            Ok(b) => b,
            Err(refused) => {
                self.log(n, path, &format!("400 {} (nothing sent)", refused.code));
                return refused.reply(client_api);
            }
        };
        let payload = Payload::from_bytes(self.api, bytes);
        let deadline = Instant::now() + self.timeout;
        let mut on_event = |e: DriverEvent<'_>| match e {
            DriverEvent::Replay(e) => self.log(
                n,
                path,
                &format!(
                    "{} ({}), replaying in {} ms",
                    e.cause, e.provider_error_class, e.wait_ms
                ),
            ),
            DriverEvent::Held { held_ms, reason } => self.log(
                n,
                path,
                &format!(
                    "held {held_ms} ms by the provider throttle ({})",
                    reason.map_or("hold", |r| r.as_str())
                ),
            ),
            DriverEvent::ThrottleUnavailable(why) => {
                self.log(n, path, &format!("{why}; sent unthrottled"));
            }
        };
        let gate = self.throttle.as_ref().map(|throttle| Gate {
            throttle,
            provider: &self.provider_name,
            first_patience: None,
        });
        let result = run_turn_gated(
            &self.transport,
            &self.limits,
            &payload,
            &self.cancel,
            Some(deadline),
            gate,
            // The route forwards a client's own request; the client keeps its own budget.
            None,
            &mut on_event,
        )
        .await;
        let requests = result.record.requests;
        let reply = self.reply_for(client_api, result.end, requests);
        let reply = reply.scrubbed(self.key.expose());
        self.log(
            n,
            path,
            &format!("{} ({requests} request(s) upstream)", reply.summary()),
        );
        reply
    }

    /// What the client is answered for how the turn ended after `requests` upstream requests.
    fn reply_for(&self, client_api: Api, end: TurnEnd, requests: u32) -> Reply {
        match end {
            TurnEnd::Completed(outcome) => {
                // The transport judged the body as it read it (one parse per line).
                let verdict = outcome.verdict_under(&self.boundary);
                let raw = outcome.raw_body.unwrap_or_default();
                let verdict = verdict.unwrap_or_else(|| self.boundary.check(&raw));
                self.judged(client_api, raw, verdict)
            }
            TurnEnd::Failed { failure, stop } => match verbatim_error_stream(&failure) {
                // BND-2: the provider's own error-event stream, judged like any 200 body, so the
                // client's SDK classifies the provider's event rather than our rebuilt one.
                Some(raw) => self.check(client_api, raw),
                None => match failure_reply(client_api, &failure, stop, requests) {
                    // A synthesized stream is a 200 body too: it passes the boundary like any.
                    Reply::Stream(body) => self.check(client_api, body),
                    other => other,
                },
            },
            TurnEnd::DeadlineReached { last_failure } => Reply::error(
                client_api,
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                "route-deadline",
                &format!(
                    "the composition's timeoutMs ({} ms) passed before the provider answered after {requests} request(s){}",
                    self.timeout.as_millis(),
                    last_failure
                        .map(|f| format!("; the last failure: {}", f.detail))
                        .unwrap_or_default()
                ),
            ),
            TurnEnd::DigestMismatch { .. } => Reply::error(
                client_api,
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "replay-digest-mismatch",
                "a replay would not have sent the same bytes as the first request, so nothing was sent",
            ),
            TurnEnd::BudgetExhausted(e) => Reply::error(
                client_api,
                StatusCode::TOO_MANY_REQUESTS,
                "api_error",
                e.bound,
                &e.message,
            ),
            TurnEnd::Cancelled => Reply::error(
                client_api,
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                "route-shutting-down",
                "the composition route is shutting down",
            ),
        }
    }

    /// BND-1: the whole 200 body is judged before any byte of it is sent.
    fn check(&self, client_api: Api, body: Bytes) -> Reply {
        let verdict = self.boundary.check(&body);
        self.judged(client_api, body, verdict)
    }

    /// [`Route::check`] with the verdict on `body` already reached.
    fn judged(&self, client_api: Api, body: Bytes, verdict: Verdict) -> Reply {
        match verdict {
            Verdict::Pass(_) => Reply::Stream(body),
            Verdict::Refuse(refusal) => refusal_reply(client_api, &refusal),
        }
    }

    fn log(&self, n: u64, path: &str, what: &str) {
        let line = format!("#{n} POST /v1{path} -> {what}");
        let _ = writeln!(std::io::stderr(), "{}", scrub(&line, self.key.expose()));
    }
}

/// What the route answers.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// A 200 event stream, sent verbatim.
    Stream(Bytes),
    /// An error in the client's API shape.
    Error {
        status: StatusCode,
        body: Vec<u8>,
        retry_after_ms: Option<u64>,
        /// For the log line: the code the body names.
        code: String,
    },
}

impl Reply {
    fn error(api: Api, status: StatusCode, kind: &str, code: &str, message: &str) -> Reply {
        Reply::Error {
            status,
            body: error_body(api, kind, code, message),
            retry_after_ms: None,
            code: code.to_owned(),
        }
    }

    fn summary(&self) -> String {
        match self {
            Reply::Stream(b) => format!("200 stream passed the boundary ({} bytes)", b.len()),
            Reply::Error { status, code, .. } => format!("{} {code}", status.as_u16()),
        }
    }

    /// Belt and braces: every text we build is from statuses, types and codes, already redacted
    /// by the transport, but a provider that echoes the key (or a piece of it) in an error type
    /// must not get it past us. Each string of the JSON body goes through the shared redactor.
    fn scrubbed(self, key: &str) -> Reply {
        match self {
            Reply::Error {
                status,
                body,
                retry_after_ms,
                code,
            } => Reply::Error {
                status,
                body: scrub_json(&body, key),
                retry_after_ms,
                code,
            },
            other => other,
        }
    }
}

/// The error body with every string redacted, still the same JSON shape; the same bytes when
/// nothing needed it.
fn scrub_json(body: &[u8], key: &str) -> Vec<u8> {
    fn walk(v: &mut Value, r: &Redactor) -> bool {
        match v {
            Value::String(s) if !r.is_clean(s) => {
                *s = r.line_capped(s, BODY_STRING_MAX_CHARS);
                true
            }
            Value::Array(items) => items.iter_mut().fold(false, |c, i| walk(i, r) | c),
            Value::Object(map) => map.values_mut().fold(false, |c, i| walk(i, r) | c),
            _ => false,
        }
    }
    let r = Redactor::new(&[key]);
    match serde_json::from_slice::<Value>(body) {
        Ok(mut v) => {
            if walk(&mut v, &r) {
                serde_json::to_vec(&v).unwrap_or_default()
            } else {
                body.to_vec()
            }
        }
        Err(_) => r.line(&String::from_utf8_lossy(body)).into_bytes(),
    }
}

/// Room for a message that quotes a provider's (already capped) detail.
const BODY_STRING_MAX_CHARS: usize = 4096;

/// The shared redaction path (docsfab-boundary's `redact`): key and key pieces, key shapes,
/// control characters, one line, capped.
fn scrub(text: &str, key: &str) -> String {
    Redactor::new(&[key]).line(text)
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Stream(body) => (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "text/event-stream"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                Body::from(body),
            )
                .into_response(),
            Reply::Error {
                status,
                body,
                retry_after_ms,
                ..
            } => {
                let mut response = (
                    status,
                    [(header::CONTENT_TYPE, "application/json")],
                    Body::from(body),
                )
                    .into_response();
                if let Some(ms) = retry_after_ms {
                    // Both spellings: clients read one or the other (REP-8 on their side).
                    let headers = response.headers_mut();
                    headers.insert("retry-after-ms", HeaderValue::from(ms));
                    headers.insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000)));
                }
                response
            }
        }
    }
}

/// An error body in the API's own shape: OpenAI `{"error":{"message","type","code"}}`,
/// Anthropic `{"type":"error","error":{"type","message"}}` (its message names the code).
fn error_body(api: Api, kind: &str, code: &str, message: &str) -> Vec<u8> {
    let v = match api {
        Api::OpenaiChat => json!({"error": {"message": message, "type": kind, "code": code}}),
        Api::AnthropicMessages => json!({
            "type": "error",
            "error": {"type": kind, "message": format!("{message} ({code})")}
        }),
    };
    v.to_string().into_bytes()
}

/// A client request the route will not forward. Nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClientRefusal {
    code: &'static str,
    message: String,
}

impl ClientRefusal {
    fn reply(&self, api: Api) -> Reply {
        Reply::error(
            api,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            self.code,
            &self.message,
        )
    }
}

/// The request the provider gets: the client's JSON object with `model` set to the selected
/// model. Pure. Refused (400, nothing sent): a request for the other API (no translation), a
/// body that is not a JSON object, and a request without `"stream": true` (the boundary judges
/// event streams only, BND-8).
fn rewrite(
    client_api: Api,
    provider_api: Api,
    model: &str,
    body: &[u8],
) -> Result<Bytes, ClientRefusal> {
    if client_api != provider_api {
        return Err(ClientRefusal {
            code: "api-mismatch",
            message: format!(
                "this route forwards to a {provider_api} provider and does not translate {client_api} requests; send the request to POST /v1{} in the {provider_api} format",
                docsfab_provider::endpoint_path(provider_api)
            ),
        });
    }
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(body) else {
        return Err(ClientRefusal {
            code: "invalid-json",
            message: "the request body must be one JSON object".to_owned(),
        });
    };
    if object.get("stream") != Some(&Value::Bool(true)) {
        return Err(ClientRefusal {
            code: "stream-required",
            message: "the composition route answers streaming requests only: set \"stream\": true (the response boundary checks the event stream before any byte reaches the client)".to_owned(),
        });
    }
    object.insert("model".to_owned(), Value::String(model.to_owned()));
    // A JSON object always serializes; the fallback is unreachable but must not panic.
    let bytes = serde_json::to_vec(&Value::Object(object)).unwrap_or_default();
    Ok(Bytes::from(bytes))
}

/// A 200 body the boundary refused: 502 (the provider sent what a gateway must not pass), or
/// 422 for credential material, so no client retries it (STP-14: that refusal is terminal).
fn refusal_reply(api: Api, refusal: &Refusal) -> Reply {
    let status = if refusal.reason.is_credential() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::BAD_GATEWAY
    };
    // `Refusal`'s Display names the reason and, for credentials, the kind or the variable's
    // label: never the value.
    Reply::error(
        api,
        status,
        "response_refused",
        refusal.reason.code(),
        &format!(
            "the composition route refused the provider's response: {refusal}; nothing of it was forwarded"
        ),
    )
}

/// The error type word for a class, in the API's vocabulary; chosen so that a client that
/// classifies by it (CLS-5, CLS-6) lands on the same class the route recorded.
fn type_for_class(api: Api, class: ProviderErrorClass) -> &'static str {
    use ProviderErrorClass as C;
    match (api, class) {
        (_, C::ContentFilter) => "content_filter",
        (_, C::Authentication) => "authentication_error",
        (_, C::InvalidRequest) => "invalid_request_error",
        (Api::OpenaiChat, C::RateLimit) => "rate_limit_exceeded",
        (Api::AnthropicMessages, C::RateLimit) => "rate_limit_error",
        (Api::OpenaiChat, C::Server) => "server_error",
        (Api::AnthropicMessages, C::Server) => "api_error",
        (_, C::Timeout) => "timeout",
        // Network and stream-incomplete failures are answered as 502s, never as error events.
        (_, C::Network | C::StreamIncomplete) => "upstream_error",
        // Not in any of the policy's lists, so it classifies as `unknown` again (terminal).
        (_, C::Unknown) => "unclassified_error",
    }
}

fn stopped(stop: StopReason, requests: u32) -> String {
    let why = match stop {
        StopReason::NotReplayable => "it is not replayable".to_owned(),
        StopReason::ContentPublished => "answer content had already been published".to_owned(),
        StopReason::AttemptsExhausted { attempts, .. } => {
            format!("the replay window's {attempts} attempts were used")
        }
        StopReason::DelayExhausted { .. } => "the replay window's summed wait was used".to_owned(),
        StopReason::Deadline => "the next wait would cross the composition's timeoutMs".to_owned(),
    };
    format!("the route sent {requests} request(s) and stopped because {why}")
}

/// What the client gets when the replay driver gave up. Pure.
///
/// * A provider status (non-2xx) is passed through with its status and Retry-After; the body is
///   rebuilt from the status, error type and code the transport kept, never the provider's
///   message (some providers echo part of the key there).
/// * A structured error event in a 200 stream whose body the transport did not keep whole comes
///   back as a 200 stream holding one such event (BND-2), with the declared status and a type
///   of the same class, so the client's SDK and step retry classify it as the route did (CLS-5,
///   CLS-6, CLS-7). A body kept whole is forwarded as it came ([`verbatim_error_stream`]).
/// * Any other failure of a 200 stream or of the connection is a 502 (504 for a timeout) naming
///   the class, which clients treat as a retryable server fault, as the class is.
fn failure_reply(api: Api, failure: &TransportFailure, stop: StopReason, requests: u32) -> Reply {
    let f = failure.failure;
    let context = stopped(stop, requests);
    if let Some(status) = f.http_status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        let code = match f.class {
            ProviderErrorClass::ContentFilter => "content_filter",
            _ => f.class.as_str(),
        };
        let kind = type_for_class(api, f.class);
        let kind = if f.class == ProviderErrorClass::ContentFilter {
            "invalid_request_error"
        } else {
            kind
        };
        let mut reply = Reply::error(
            api,
            status,
            kind,
            code,
            &format!("the provider answered {}; {context}", failure.detail),
        );
        if let Reply::Error { retry_after_ms, .. } = &mut reply {
            *retry_after_ms = f.retry_after_ms;
        }
        return reply;
    }
    match f.fault {
        FaultKind::ErrorEvent if is_declared_error(failure) => {
            Reply::Stream(error_event_stream(api, f.class, f.declared_status))
        }
        FaultKind::ContentFilter => Reply::error(
            api,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "content_filter",
            &format!(
                "the provider refused the content: {}; {context}",
                failure.detail
            ),
        ),
        FaultKind::RequestTimeout => Reply::error(
            api,
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            "timeout",
            &format!("{}; {context}", failure.detail),
        ),
        _ => Reply::error(
            api,
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            f.class.as_str(),
            &format!("{}; {context}", failure.detail),
        ),
    }
}

/// Whether an `ErrorEvent` failure was a real structured error event rather than a 200 body the
/// transport could not read (which it also files as `ErrorEvent`, class unknown, with no error
/// words).
fn is_declared_error(failure: &TransportFailure) -> bool {
    failure.failure.declared_status.is_some()
        || failure.failure.class != ProviderErrorClass::Unknown
        || failure.body.error_type.is_some()
        || failure.body.error_code.is_some()
        || failure.detail.contains("carried an error event")
}

/// The body to forward byte for byte when a turn ended on a 200 stream's structured error event
/// and the transport read that stream to its end (BND-2). Pure. `None` sends the rebuilt event
/// instead: a body that was cut or outran the transport's bounds, or a failure of another kind.
fn verbatim_error_stream(failure: &TransportFailure) -> Option<Bytes> {
    let event = failure.failure.fault == FaultKind::ErrorEvent && is_declared_error(failure);
    failure.body.raw.clone().filter(|_| event)
}

/// A 200 stream of one structured error event (BND-3: `error` and `type: "error"` only), in the
/// API's framing: OpenAI `data: {"error":…}` then `data: [DONE]`, Anthropic `event: error`.
fn error_event_stream(api: Api, class: ProviderErrorClass, declared: Option<u16>) -> Bytes {
    let mut error = json!({
        "type": type_for_class(api, class),
        "message": format!("the provider's stream ended with a {class} error event; the composition route replayed what it could"),
    });
    if let Some(code) = declared {
        error["code"] = json!(code);
    }
    let text = match api {
        Api::OpenaiChat => format!("data: {}\n\ndata: [DONE]\n\n", json!({ "error": error })),
        Api::AnthropicMessages => format!(
            "event: error\ndata: {}\n\n",
            json!({"type": "error", "error": error})
        ),
    };
    Bytes::from(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_policy::class::ProviderFailure;
    use docsfab_policy::class::classify_error_event;

    fn body_json(reply: &Reply) -> Value {
        match reply {
            Reply::Error { body, .. } => serde_json::from_slice(body).unwrap(),
            Reply::Stream(b) => panic!("a stream: {b:?}"),
        }
    }

    #[test]
    fn rewrite_sets_the_selected_model_and_keeps_the_rest() {
        let out = rewrite(
            Api::OpenaiChat,
            Api::OpenaiChat,
            "gpt-sel",
            br#"{"model":"x","model":"y","stream":true,"messages":[{"role":"user","content":"hi"}],"temperature":0.5}"#,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "gpt-sel");
        assert_eq!(v["temperature"], 0.5);
        assert_eq!(v["messages"][0]["content"], "hi");
        // A duplicated member cannot smuggle a second model past the rewrite.
        assert_eq!(
            String::from_utf8_lossy(&out).matches("\"model\"").count(),
            1
        );
        let added = rewrite(Api::OpenaiChat, Api::OpenaiChat, "m", br#"{"stream":true}"#).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&added).unwrap()["model"],
            "m"
        );
    }

    #[test]
    fn rewrite_refuses_other_api_non_objects_and_non_streams() {
        let e = rewrite(Api::OpenaiChat, Api::AnthropicMessages, "m", b"{}").unwrap_err();
        assert_eq!(e.code, "api-mismatch");
        assert!(e.message.contains("/v1/messages"), "{}", e.message);
        for body in [&b"[1]"[..], b"not json", b"", b"\xff\xfe"] {
            let e = rewrite(Api::OpenaiChat, Api::OpenaiChat, "m", body).unwrap_err();
            assert_eq!(e.code, "invalid-json");
        }
        for body in [
            &br#"{"stream":false}"#[..],
            br#"{}"#,
            br#"{"stream":"true"}"#,
        ] {
            let e = rewrite(Api::AnthropicMessages, Api::AnthropicMessages, "m", body).unwrap_err();
            assert_eq!(e.code, "stream-required");
        }
    }

    #[test]
    fn error_bodies_have_each_apis_shape() {
        let r = Reply::error(
            Api::OpenaiChat,
            StatusCode::BAD_GATEWAY,
            "response_refused",
            "model-mismatch",
            "msg",
        );
        let v = body_json(&r);
        assert_eq!(v["error"]["code"], "model-mismatch");
        assert_eq!(v["error"]["type"], "response_refused");
        let r = Reply::error(
            Api::AnthropicMessages,
            StatusCode::BAD_GATEWAY,
            "response_refused",
            "model-mismatch",
            "msg",
        );
        let v = body_json(&r);
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "response_refused");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("model-mismatch")
        );
    }

    fn stream_failure(class: ProviderErrorClass, declared: Option<u16>) -> TransportFailure {
        TransportFailure::new(
            ProviderFailure {
                fault: FaultKind::ErrorEvent,
                class,
                http_status: None,
                declared_status: declared,
                retry_after_ms: None,
                content_published: false,
            },
            "the 200 stream carried an error event: type x",
        )
    }

    /// CLS-7 and BND-2: the synthesized event passes the boundary as error events only, and the
    /// policy classifies it as the class the route recorded.
    #[test]
    fn error_event_streams_keep_their_class_cls_7_bnd_2() {
        use ProviderErrorClass as C;
        for api in [Api::OpenaiChat, Api::AnthropicMessages] {
            for (class, declared) in [
                (C::Server, Some(503)),
                (C::Timeout, Some(504)),
                (C::RateLimit, Some(429)),
                (C::Server, None),
                (C::RateLimit, None),
                (C::Unknown, None),
            ] {
                let reply = failure_reply(
                    api,
                    &stream_failure(class, declared),
                    StopReason::NotReplayable,
                    1,
                );
                let Reply::Stream(body) = reply else {
                    panic!("{reply:?}")
                };
                let cfg = BoundaryConfig::new(api, "m", &[]).unwrap();
                assert_eq!(
                    cfg.check(&body),
                    Verdict::Pass(docsfab_boundary::Pass::ErrorEventsOnly)
                );
                let text = String::from_utf8(body.to_vec()).unwrap();
                let data = text
                    .lines()
                    .find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{')))
                    .unwrap();
                let got = classify_error_event(&serde_json::from_str(data).unwrap()).unwrap();
                assert_eq!(got.class, class, "{api} {text}");
                assert_eq!(got.declared_status, declared);
            }
        }
    }

    /// BND-2: only a structured error event whose whole body was kept is forwarded as it came;
    /// an unreadable 200 body and a provider status keep their rebuilt replies.
    #[test]
    fn only_a_kept_error_event_stream_is_forwarded_verbatim_bnd_2() {
        let raw = Bytes::from_static(b"data: {\"error\":{\"type\":\"server_error\"}}\n\n");
        let mut event = stream_failure(ProviderErrorClass::Server, None);
        assert_eq!(verbatim_error_stream(&event), None, "nothing kept");
        event.body.raw = Some(raw.clone());
        assert_eq!(verbatim_error_stream(&event), Some(raw.clone()));
        let mut unreadable = TransportFailure::new(
            ProviderFailure {
                class: ProviderErrorClass::Unknown,
                ..event.failure
            },
            "the 200 stream carried a data line that is not JSON",
        );
        unreadable.body.raw = Some(raw.clone());
        assert_eq!(verbatim_error_stream(&unreadable), None);
        let mut status = TransportFailure::new(
            ProviderFailure {
                fault: FaultKind::HttpStatus,
                http_status: Some(503),
                ..event.failure
            },
            "HTTP 503",
        );
        status.body.raw = Some(raw);
        assert_eq!(verbatim_error_stream(&status), None);
    }

    #[test]
    fn a_provider_status_passes_with_a_rebuilt_body_rep_3() {
        let f = TransportFailure::new(
            ProviderFailure {
                fault: FaultKind::HttpStatus,
                class: ProviderErrorClass::RateLimit,
                http_status: Some(429),
                declared_status: None,
                retry_after_ms: Some(1500),
                content_published: false,
            },
            "HTTP 429, error type rate_limit_exceeded",
        );
        let reply = failure_reply(Api::OpenaiChat, &f, StopReason::Deadline, 3);
        let Reply::Error {
            status,
            retry_after_ms,
            ..
        } = &reply
        else {
            panic!()
        };
        assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(*retry_after_ms, Some(1500));
        let v = body_json(&reply);
        assert_eq!(v["error"]["code"], "rate-limit");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("3 request(s)")
        );
        let response = reply.into_response();
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["retry-after-ms"], "1500");
    }

    /// Issue 9 finding 5: every refusal of a request body is an error in the client's API
    /// shape, with the status a client expects.
    #[test]
    fn hardening_body_refusals_have_each_apis_shape() {
        for (refusal, status, code) in [
            (
                BodyRefusal::TooLarge { limit: 10 },
                StatusCode::PAYLOAD_TOO_LARGE,
                "request-too-large",
            ),
            (
                BodyRefusal::TooSlow {
                    timeout: Duration::from_millis(300),
                },
                StatusCode::REQUEST_TIMEOUT,
                "request-body-timeout",
            ),
            (
                BodyRefusal::Cancelled,
                StatusCode::SERVICE_UNAVAILABLE,
                "route-shutting-down",
            ),
            (
                BodyRefusal::Broken,
                StatusCode::BAD_REQUEST,
                "request-body-broken",
            ),
        ] {
            let r = body_refusal_reply(Api::OpenaiChat, refusal);
            assert!(matches!(r, Reply::Error { status: s, .. } if s == status));
            let v = body_json(&r);
            assert_eq!(v["error"]["code"], code);
            assert!(v["error"]["type"].is_string() && v["error"]["message"].is_string());
            let r = body_refusal_reply(Api::AnthropicMessages, refusal);
            assert!(matches!(r, Reply::Error { status: s, .. } if s == status));
            let v = body_json(&r);
            assert_eq!(v["type"], "error");
            assert!(v["error"]["type"].is_string());
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains(&format!("({code})")), "{m}");
        }
        // The busy 503 is read before the path is known, so it must satisfy both shapes.
        let v: Value = serde_json::from_slice(&busy_body()).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["code"], "route-busy");
        assert!(v["error"]["type"].is_string() && v["error"]["message"].is_string());
    }

    #[test]
    fn scrub_removes_the_key_from_error_bodies() {
        let r = Reply::error(
            Api::OpenaiChat,
            StatusCode::BAD_GATEWAY,
            "sk-host-key-12345",
            "x",
            "echo sk-host-key-12345",
        )
        .scrubbed("sk-host-key-12345");
        let Reply::Error { body, .. } = r else {
            panic!()
        };
        assert!(!String::from_utf8_lossy(&body).contains("sk-host-key"));
    }
}
