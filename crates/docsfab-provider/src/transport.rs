//! Sending one request: the [`Transport`] seam, and [`HttpTransport`], the real one on reqwest.
//!
//! A transport sends the exact bytes it is given, once, and reports what came back. It never
//! retries: replays are the driver's decision ([`crate::driver`]), and a hidden resend inside the
//! client would make an attempt invisible to the record. So the reqwest client is built with
//! `retry::never()`, no redirects, no proxy, and no connection pool (one request, one fresh
//! connection: a stale pooled connection would otherwise surface as a fault nobody caused).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use docsfab_boundary::{BoundaryConfig, EventReader, Redactor};
use docsfab_policy::class::ProviderFailure;
use docsfab_policy::retry_after::parse_retry_after;
use docsfab_record::{Api, FaultKind, Gateway, ProviderErrorClass};
use docsfab_throttle::RateHeaders;
use docsfab_throttle::headers::unix_ms;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::gateway;
use crate::outcome::{StreamOutcome, StreamReader, TransportFailure, error_words};
use crate::request::endpoint_path;
use crate::secret::ApiKey;

/// Sends one request's bytes and reads the answer. Object-safe, so the runtime can hold a
/// `Box<dyn Transport>` and tests can drive the replay driver with a scripted one.
pub trait Transport: Send + Sync {
    /// Sends `body` once. The future may be dropped at any point (cancellation, deadline).
    fn send(&self, body: Bytes) -> BoxFuture<'_, Result<StreamOutcome, TransportFailure>>;
}

/// Settings of the HTTP transport.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub api: Api,
    /// The provider's base URL including its version prefix, e.g. `https://api.example.com/v1`.
    pub base_url: String,
    /// `None` sends no auth header (a local simulator needs none).
    pub api_key: Option<ApiKey>,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long the response head, or the next body read, may take; a longer silence is a
    /// request timeout (`timeout`).
    pub read_timeout: Duration,
    /// Keep the exact 200 body in [`StreamOutcome::raw_body`] (the composition route forwards it).
    pub keep_raw_body: bool,
    /// The most bytes one 200 body may have. A provider that streams past it is cut off and the
    /// turn fails as `unknown` (never replayed): the route and the runtime hold bodies in
    /// memory, and no real answer within `maxOutputTokens` comes near the default.
    pub max_body_bytes: usize,
}

/// The default ceiling on one 200 body: 64 MiB, far above any answer a token ceiling allows.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

impl HttpConfig {
    /// Defaults for a hosted provider: 10 s to connect, 120 s of silence at most.
    pub fn new(api: Api, base_url: impl Into<String>, api_key: Option<ApiKey>) -> Self {
        HttpConfig {
            api,
            base_url: base_url.into(),
            api_key,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(120),
            keep_raw_body: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// Why a transport could not be built. Nothing was sent.
#[derive(Debug, thiserror::Error)]
pub enum TransportBuildError {
    /// The URL itself is not repeated: it may carry credentials.
    #[error("the provider base URL is not usable: {0}")]
    BadUrl(String),
    #[error("the API key contains characters that cannot go into an HTTP header")]
    BadApiKey,
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
}

/// The reqwest transport for either API.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    api: Api,
    url: reqwest::Url,
    headers: HeaderMap,
    client: reqwest::Client,
    keep_raw_body: bool,
    max_body_bytes: usize,
    /// The response boundary that judges each 200 body in the same pass that reads it.
    boundary: Option<BoundaryConfig>,
    /// Removes this transport's own key (whole or in pieces) from every failure it returns.
    redactor: Arc<Redactor>,
}

/// The most of an error body read for its type and code; the rest is not needed.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The URL a request of `api` goes to: the base URL's path with the API's path appended,
/// keeping any query the base URL carries. An `anthropic-messages` base URL with no path at all
/// (`http://host:port`, the form Anthropic's SDKs and llama.cpp document) gets `/v1` first, so
/// both spellings reach `/v1/messages`; any other path is taken as written.
pub fn endpoint_url(api: Api, base_url: &str) -> Result<reqwest::Url, TransportBuildError> {
    let mut url = reqwest::Url::parse(base_url.trim())
        .map_err(|e| TransportBuildError::BadUrl(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(TransportBuildError::BadUrl(
            "it must be an http or https URL".into(),
        ));
    }
    let base = url.path().trim_end_matches('/');
    let version = if api == Api::AnthropicMessages && base.is_empty() {
        "/v1"
    } else {
        ""
    };
    let path = format!("{base}{version}{}", endpoint_path(api));
    url.set_path(&path);
    Ok(url)
}

impl HttpTransport {
    pub fn new(config: HttpConfig) -> Result<Self, TransportBuildError> {
        let url = endpoint_url(config.api, &config.base_url)?;

        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        if config.api == Api::AnthropicMessages {
            headers.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static("2023-06-01"),
            );
        }
        if let Some(key) = &config.api_key {
            let (name, value) = match config.api {
                Api::OpenaiChat => (
                    reqwest::header::AUTHORIZATION,
                    format!("Bearer {}", key.expose()),
                ),
                Api::AnthropicMessages => (
                    HeaderName::from_static("x-api-key"),
                    key.expose().to_owned(),
                ),
            };
            let mut value =
                HeaderValue::from_str(&value).map_err(|_| TransportBuildError::BadApiKey)?;
            // Sensitive values print as "Sensitive" in any Debug output of the headers.
            value.set_sensitive(true);
            headers.insert(name, value);
        }

        install_crypto_provider();
        let client = reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .build()
            .map_err(|e| TransportBuildError::Client(e.to_string()))?;
        Ok(HttpTransport {
            api: config.api,
            url,
            headers,
            client,
            keep_raw_body: config.keep_raw_body,
            boundary: None,
            max_body_bytes: config.max_body_bytes,
            redactor: Arc::new(Redactor::new(
                &config
                    .api_key
                    .iter()
                    .map(ApiKey::expose)
                    .collect::<Vec<_>>(),
            )),
        })
    }

    pub fn api(&self) -> Api {
        self.api
    }

    /// Judges every 200 stream under `config` while reading it, so a completed outcome carries
    /// its verdict ([`StreamOutcome::verdict_under`]) and nobody parses the body again (BND-1).
    pub fn with_boundary(mut self, config: BoundaryConfig) -> Self {
        self.boundary = Some(config);
        self
    }

    async fn send_once(&self, body: Bytes) -> Result<StreamOutcome, TransportFailure> {
        let response = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body)
            .send()
            .await
            .map_err(|e| before_head_failure(&e.without_url()))?;
        // Read when the head arrives: that is the instant the budgets it reports were true.
        let gateway = gateway::recognise(response.headers());
        let rate_headers = rate_headers(response.headers(), gateway.as_ref(), SystemTime::now());
        match self.read_response(response, gateway.as_ref()).await {
            Ok(mut outcome) => {
                outcome.rate_headers = rate_headers;
                outcome.gateway = gateway.map(Box::new);
                Ok(outcome)
            }
            Err(mut failure) => {
                failure.body.rate_headers = rate_headers;
                failure.body.gateway = gateway;
                Err(failure)
            }
        }
    }

    /// Reads a response whose head arrived: a non-2xx status, a JSON body or a stream.
    async fn read_response(
        &self,
        response: reqwest::Response,
        gateway: Option<&Gateway>,
    ) -> Result<StreamOutcome, TransportFailure> {
        let status = response.status().as_u16();
        if !response.status().is_success() {
            return Err(status_failure(response, gateway).await);
        }

        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        let mut reader = StreamReader::new(self.api, status);
        // One pass per line: the boundary's parse of each data line also feeds the reader.
        let mut decoder = match &self.boundary {
            Some(config) => EventReader::judged(config),
            None => EventReader::new(),
        };
        let mut raw = BytesMut::new();
        let mut body = response.bytes_stream();
        let mut received: usize = 0;
        while let Some(read) = body.next().await {
            match read {
                Ok(chunk) => {
                    received = received.saturating_add(chunk.len());
                    if received > self.max_body_bytes {
                        let detail = format!(
                            "the response body exceeded {} bytes and was cut off",
                            self.max_body_bytes
                        );
                        // docsfab's own size limit cut the body, not the network: retrying
                        // meets the same body, so the class is `unknown`, not `network`.
                        let failure = ProviderFailure {
                            class: ProviderErrorClass::Unknown,
                            ..ProviderFailure::from_fault(FaultKind::BodyCut)
                        };
                        return Err(reader.cut(failure, detail));
                    }
                    if self.keep_raw_body || is_json {
                        raw.extend_from_slice(&chunk);
                    }
                    if is_json {
                        continue;
                    }
                    let mut failed = None;
                    decoder.feed(&chunk, |e| {
                        if failed.is_none() {
                            failed = reader.read(e).err();
                        }
                    });
                    if let Some(failure) = failed {
                        return Err(self.with_rest_of_body(failure, raw, body).await);
                    }
                }
                Err(e) => {
                    let fault = if e.is_timeout() {
                        FaultKind::RequestTimeout
                    } else {
                        FaultKind::BodyCut
                    };
                    // Without the URL: a base URL may carry credentials in its user info.
                    let detail = format!(
                        "the response body failed mid-transfer: {}",
                        chain(&e.without_url())
                    );
                    return Err(reader.cut(ProviderFailure::from_fault(fault), detail));
                }
            }
        }
        let kept = |raw: BytesMut| self.keep_raw_body.then(|| raw.freeze());
        if is_json {
            let mut failure = reader.json_body(&raw);
            failure.body.raw = kept(raw);
            return Err(failure);
        }
        let mut failed = None;
        let verdict = decoder.finish(|e| {
            if failed.is_none() {
                failed = reader.read(e).err();
            }
        });
        let read = match failed {
            Some(failure) => Err(failure),
            None => reader.finish(),
        };
        match read {
            Ok(mut outcome) => {
                outcome.raw_body = kept(raw);
                outcome.verdict = self.boundary.clone().zip(verdict);
                Ok(outcome)
            }
            Err(mut failure) => {
                failure.body.raw = kept(raw);
                Err(failure)
            }
        }
    }

    /// A 200 stream failed on an event (usually a structured error event). When raw bodies are
    /// kept, reads what the provider sends after it so the whole body can be judged and
    /// forwarded (BND-2); bounded in bytes and in time, because the failure is already decided
    /// and must not wait on a provider that keeps the connection open. Past either bound, or on
    /// a read error, the body is not kept.
    async fn with_rest_of_body(
        &self,
        mut failure: TransportFailure,
        mut raw: BytesMut,
        mut body: impl futures_util::Stream<Item = reqwest::Result<Bytes>> + Unpin,
    ) -> TransportFailure {
        if !self.keep_raw_body {
            return failure;
        }
        let limit = raw.len().saturating_add(TAIL_LIMIT_BYTES);
        let rest = async {
            while let Some(read) = body.next().await {
                raw.extend_from_slice(&read.ok()?);
                if raw.len() > limit {
                    return None;
                }
            }
            Some(raw.freeze())
        };
        failure.body.raw = tokio::time::timeout(TAIL_LIMIT_TIME, rest)
            .await
            .ok()
            .flatten();
        failure
    }
}

/// How much more of a failed 200 stream is read after the event that failed it, when raw bodies
/// are kept: an error event is followed at most by a `[DONE]` or a few closing events.
const TAIL_LIMIT_BYTES: usize = 64 * 1024;
const TAIL_LIMIT_TIME: Duration = Duration::from_secs(2);

impl Transport for HttpTransport {
    fn send(&self, body: Bytes) -> BoxFuture<'_, Result<StreamOutcome, TransportFailure>> {
        Box::pin(async move {
            self.send_once(body)
                .await
                .map_err(|f| f.redacted(&self.redactor))
        })
    }
}

/// Installs rustls' ring provider for the process. The workspace builds reqwest with
/// `rustls-no-provider`, so without this the first HTTPS client would panic. A provider that is
/// already installed (by us or by the binary) is fine.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The rate-limit headers the throttle reads (`x-ratelimit-*`, `anthropic-ratelimit-*`), at
/// most [`RATE_HEADER_LIMIT`] of them, and the Retry-After pair that speaks for the provider
/// ([`gateway::retry_after_pair`]: behind a recognised gateway, the one it relayed when the
/// head has none of its own), under the names the throttle reads; other headers are not kept.
fn rate_headers(head: &HeaderMap, gateway: Option<&Gateway>, now: SystemTime) -> RateHeaders {
    let (retry_after, retry_after_ms) = gateway::retry_after_pair(head, gateway);
    let retry = [
        retry_after.as_deref().map(|v| ("retry-after", v)),
        retry_after_ms.as_deref().map(|v| ("retry-after-ms", v)),
    ];
    let budgets = head
        .iter()
        .filter(|(name, _)| {
            let n = name.as_str();
            n.starts_with("x-ratelimit-") || n.starts_with("anthropic-ratelimit-")
        })
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
    let pairs = retry
        .into_iter()
        .flatten()
        .chain(budgets)
        .take(RATE_HEADER_LIMIT);
    RateHeaders::from_pairs(pairs, unix_ms(now))
}

/// Both families together send at most 20 rate-limit headers; more is not a real provider.
const RATE_HEADER_LIMIT: usize = 32;

/// A request that got no response head: its fault label (see [`before_head_fault`]) and what
/// the client said.
fn before_head_failure(e: &reqwest::Error) -> TransportFailure {
    let fault = before_head_fault(e.is_timeout(), e.is_connect(), e);
    let what = match fault {
        FaultKind::Dns => "the provider's host name did not resolve",
        FaultKind::ConnectTimeout => "the connection was not made within the connect timeout",
        FaultKind::RequestTimeout => "timed out before a response head arrived",
        FaultKind::Tls => "the TLS handshake failed",
        FaultKind::Reset => "the connection was reset before a response head arrived",
        FaultKind::ConnectRefused => "could not connect",
        _ => "the connection was dropped before a response head arrived",
    };
    TransportFailure::new(
        ProviderFailure::from_fault(fault),
        format!("{what}: {}", chain(e)),
    )
}

/// The label of a failure before any response head, from reqwest's two flags and the error's
/// source chain (reqwest -> hyper-util -> io::Error / rustls). Only the label is decided here:
/// its class follows from it, so a finer label never changes a retry decision.
///
/// The chain is matched on types where they are public (io::Error kinds, rustls::Error) and on
/// hyper-util's fixed `dns error` wording (its connect error type is private) or the resolver's
/// `failed to lookup address information` prefix (std's getaddrinfo error).
pub(crate) fn before_head_fault(
    timed_out: bool,
    connecting: bool,
    e: &(dyn std::error::Error + 'static),
) -> FaultKind {
    let causes = causes(e);
    let dns = causes.iter().any(|c| {
        let text = c.to_string();
        text == "dns error"
            || text.starts_with("failed to lookup address information")
            || text.starts_with("error resolving DNS")
    });
    let tls = causes.iter().any(|c| c.is::<rustls::Error>());
    let io_kind = |kinds: &[std::io::ErrorKind]| {
        causes.iter().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| kinds.contains(&io.kind()))
        })
    };
    use std::io::ErrorKind as K;
    if timed_out {
        return if connecting {
            FaultKind::ConnectTimeout
        } else {
            FaultKind::RequestTimeout
        };
    }
    if dns {
        FaultKind::Dns
    } else if tls {
        FaultKind::Tls
    } else if io_kind(&[K::ConnectionRefused]) {
        FaultKind::ConnectRefused
    } else if io_kind(&[K::ConnectionReset, K::BrokenPipe]) {
        FaultKind::Reset
    } else if connecting {
        FaultKind::ConnectRefused
    } else {
        FaultKind::ConnectionDropped
    }
}

/// `e` and every error beneath it. An io::Error's `source()` skips the error it wraps, so the
/// wrapped one (a rustls error inside, say) is visited through `get_ref` as well.
fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(e);
    while let Some(c) = next {
        out.push(c);
        next = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
        // A chain is short; the bound only guards against a cycle.
        if out.len() > 32 {
            break;
        }
    }
    out
}

/// A non-2xx response. The status decides the class (REP-4): the body is read only for a
/// content-filter code on a request the provider rejected, and for the type and code named in
/// the detail. Its message is never copied, since some providers echo part of the key there.
async fn status_failure(
    response: reqwest::Response,
    gateway: Option<&Gateway>,
) -> TransportFailure {
    let status = response.status().as_u16();
    // Behind a recognised gateway the provider's own Retry-After may arrive renamed (issue 24).
    let (retry_after, retry_after_ms) = gateway::retry_after_pair(response.headers(), gateway);
    let retry_after_ms = parse_retry_after(
        retry_after.as_deref(),
        retry_after_ms.as_deref(),
        SystemTime::now(),
    );

    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= ERROR_BODY_LIMIT {
            break;
        }
    }
    let doc = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
    let (error_type, error_code) = error_words(&doc["error"]);

    let mut head = ProviderFailure::from_http_status(status, retry_after_ms);
    let filtered = [&error_code, &error_type].iter().any(|w| {
        matches!(
            w.as_deref(),
            Some("content_filter" | "content_policy_violation")
        )
    });
    // Only a request the provider rejected (an invalid-request 4xx) is refined to
    // content-filter: both are terminal, so the status' decision never flips (REP-4).
    if filtered && head.class == ProviderErrorClass::InvalidRequest {
        head = ProviderFailure {
            http_status: head.http_status,
            retry_after_ms: head.retry_after_ms,
            ..ProviderFailure::from_fault(FaultKind::ContentFilter)
        };
    }

    let mut detail = format!("HTTP {status}");
    if let Some(t) = &error_type {
        detail.push_str(&format!(", error type {t}"));
    }
    if let Some(c) = &error_code {
        detail.push_str(&format!(", error code {c}"));
    }
    // Only a refusal already terminal by its status is read for a context overflow (REP-4).
    let overflow = matches!(head.class, ProviderErrorClass::InvalidRequest)
        .then(|| crate::overflow::recognise(&doc))
        .flatten();
    if let Some(o) = &overflow {
        detail.push_str(&format!(", context overflow ({} dialect)", o.server));
    }
    let mut failure = TransportFailure::new(head, detail);
    failure.body.error_type = error_type;
    failure.body.error_code = error_code;
    failure.body.overflow = overflow;
    failure
}

/// The error and its sources on one line, so the detail says what the OS said.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_key() {
        let t = HttpTransport::new(HttpConfig::new(
            Api::OpenaiChat,
            "http://127.0.0.1:9/v1",
            Some(ApiKey::new("sk-secret-123")),
        ))
        .unwrap();
        let shown = format!("{t:?}");
        assert!(!shown.contains("sk-secret-123"), "{shown}");
        let t = HttpTransport::new(HttpConfig::new(
            Api::AnthropicMessages,
            "http://127.0.0.1:9/v1",
            Some(ApiKey::new("sk-ant-secret")),
        ))
        .unwrap();
        assert!(!format!("{t:?}").contains("sk-ant-secret"));
    }

    #[test]
    fn url_joins_base_and_api_path() {
        let t = HttpTransport::new(HttpConfig::new(
            Api::AnthropicMessages,
            "http://127.0.0.1:9/v1/",
            None,
        ))
        .unwrap();
        assert_eq!(t.url.as_str(), "http://127.0.0.1:9/v1/messages");
        let t = HttpTransport::new(HttpConfig::new(
            Api::OpenaiChat,
            "https://example.com/openai/v1?api-version=2",
            None,
        ))
        .unwrap();
        assert_eq!(
            t.url.as_str(),
            "https://example.com/openai/v1/chat/completions?api-version=2"
        );
        // Issue 31: Anthropic's documented form, without the version path, reaches the same
        // endpoint; an OpenAI base URL and any Anthropic path are taken as written.
        for bare in ["http://127.0.0.1:9", "http://127.0.0.1:9/"] {
            let url = endpoint_url(Api::AnthropicMessages, bare).unwrap();
            assert_eq!(url.as_str(), "http://127.0.0.1:9/v1/messages");
        }
        let url = endpoint_url(Api::AnthropicMessages, "https://gw.example/anthropic").unwrap();
        assert_eq!(url.as_str(), "https://gw.example/anthropic/messages");
        let url = endpoint_url(Api::OpenaiChat, "http://127.0.0.1:9").unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:9/chat/completions");
        let err = HttpTransport::new(HttpConfig::new(Api::OpenaiChat, "ftp://u:secret@h/", None))
            .unwrap_err();
        assert!(!err.to_string().contains("secret"));
        assert!(matches!(
            HttpTransport::new(HttpConfig::new(Api::OpenaiChat, "not a url", None)),
            Err(TransportBuildError::BadUrl(_))
        ));
    }

    /// An io::Error as std's resolver returns it, under hyper-util's `dns error` wrapper.
    #[derive(Debug)]
    struct Wrapped(&'static str, std::io::Error);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    #[test]
    fn issue11_a_resolver_failure_is_labelled_dns() {
        let gai = std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        );
        assert_eq!(
            before_head_fault(false, true, &Wrapped("dns error", gai)),
            FaultKind::Dns
        );
        let again = std::io::Error::other(
            "failed to lookup address information: Temporary failure in name resolution",
        );
        assert_eq!(before_head_fault(false, true, &again), FaultKind::Dns);
    }

    #[test]
    fn issue11_io_kinds_and_rustls_pick_their_labels() {
        use std::io::{Error, ErrorKind};
        let refused = Wrapped("tcp connect error", ErrorKind::ConnectionRefused.into());
        assert_eq!(
            before_head_fault(false, true, &refused),
            FaultKind::ConnectRefused
        );
        let reset: Error = ErrorKind::ConnectionReset.into();
        assert_eq!(before_head_fault(false, false, &reset), FaultKind::Reset);
        let pipe: Error = ErrorKind::BrokenPipe.into();
        assert_eq!(before_head_fault(false, false, &pipe), FaultKind::Reset);
        // rustls' error sits inside two io::Errors, as hyper-rustls hands it up.
        let tls = Error::other(Error::new(
            ErrorKind::InvalidData,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        ));
        assert_eq!(before_head_fault(false, true, &tls), FaultKind::Tls);
        let unreachable: Error = ErrorKind::HostUnreachable.into();
        assert_eq!(
            before_head_fault(false, true, &unreachable),
            FaultKind::ConnectRefused
        );
        let closed = Error::other("connection closed before message completed");
        assert_eq!(
            before_head_fault(false, false, &closed),
            FaultKind::ConnectionDropped
        );
        assert_eq!(
            before_head_fault(true, true, &closed),
            FaultKind::ConnectTimeout
        );
        assert_eq!(
            before_head_fault(true, false, &closed),
            FaultKind::RequestTimeout
        );
    }
}
