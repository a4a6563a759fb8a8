//! Provider error classes and the faults a transport observes: what an attempt and a replay
//! record about why a request that left the host failed.

use serde::{Deserialize, Serialize};

/// The class recorded for a failed provider request. Both the in-turn replay and the step retry
/// decide from this value before they look at any error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderErrorClass {
    /// The connection failed, or the body was cut mid-transfer: retryable.
    Network,
    /// The provider failed on its side (5xx, 425, a server-fault error event): retryable.
    Server,
    /// HTTP 408 or 504, or no answer within the client's timeout: retryable.
    Timeout,
    /// The provider is throttling or the quota is spent: retryable only with HTTP 429 on the
    /// response head, since without it nothing says the limit will lift.
    RateLimit,
    /// A stream that closed cleanly without a finish reason or `[DONE]`: retryable.
    StreamIncomplete,
    /// The provider refused the content: never sent again.
    ContentFilter,
    /// HTTP 401 or 403: never sent again, the same key would be refused again.
    Authentication,
    /// Any other 4xx: never sent again, the identical request cannot succeed.
    InvalidRequest,
    /// Nothing known to be retryable: never sent again.
    Unknown,
}

/// How a provider request failed, as the transport observed it on the wire. The label only says
/// what happened; the class a fault maps to (and so every retry decision) is fixed per label in
/// `docsfab_policy::class::ProviderFailure::from_fault`. Labels added later keep older records
/// readable: a record never names a label this version does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The connection could not be made: refused (ECONNREFUSED), or another connect failure
    /// (network or host unreachable) that none of the finer labels names.
    ConnectRefused,
    /// The connection was dropped (closed without a reset) before a response head arrived.
    ConnectionDropped,
    /// No response (or no further bytes) within the client's request timeout.
    RequestTimeout,
    /// The provider answered with a non-success HTTP status.
    HttpStatus,
    /// The response body failed while it was being transferred (reset or cut mid-body).
    BodyCut,
    /// An OpenAI Chat Completions stream closed cleanly with no finish reason and no `[DONE]`.
    StreamIncomplete,
    /// A 200 stream carried a structured error event.
    ErrorEvent,
    /// The provider refused the content (error code or finish reason).
    ContentFilter,
    /// The provider's host name did not resolve while the request was being sent.
    Dns,
    /// The TCP connect did not complete within the client's connect timeout.
    ConnectTimeout,
    /// The TLS handshake failed (not TLS on the other end, a certificate that does not verify).
    Tls,
    /// An open connection was reset (ECONNRESET) or broke on write (EPIPE) before a response
    /// head arrived.
    Reset,
}

impl ProviderErrorClass {
    /// Every class, in declaration order.
    pub const ALL: [ProviderErrorClass; 9] = [
        ProviderErrorClass::Network,
        ProviderErrorClass::Server,
        ProviderErrorClass::Timeout,
        ProviderErrorClass::RateLimit,
        ProviderErrorClass::StreamIncomplete,
        ProviderErrorClass::ContentFilter,
        ProviderErrorClass::Authentication,
        ProviderErrorClass::InvalidRequest,
        ProviderErrorClass::Unknown,
    ];

    /// The kebab-case name recorded in run records.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderErrorClass::Network => "network",
            ProviderErrorClass::Server => "server",
            ProviderErrorClass::Timeout => "timeout",
            ProviderErrorClass::RateLimit => "rate-limit",
            ProviderErrorClass::StreamIncomplete => "stream-incomplete",
            ProviderErrorClass::ContentFilter => "content-filter",
            ProviderErrorClass::Authentication => "authentication",
            ProviderErrorClass::InvalidRequest => "invalid-request",
            ProviderErrorClass::Unknown => "unknown",
        }
    }
}

impl FaultKind {
    /// Every label, in declaration order.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::ConnectRefused,
        FaultKind::ConnectionDropped,
        FaultKind::RequestTimeout,
        FaultKind::HttpStatus,
        FaultKind::BodyCut,
        FaultKind::StreamIncomplete,
        FaultKind::ErrorEvent,
        FaultKind::ContentFilter,
        FaultKind::Dns,
        FaultKind::ConnectTimeout,
        FaultKind::Tls,
        FaultKind::Reset,
    ];

    /// The kebab-case name recorded in run records (`connection-dropped`, `body-cut`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::ConnectRefused => "connect-refused",
            FaultKind::ConnectionDropped => "connection-dropped",
            FaultKind::RequestTimeout => "request-timeout",
            FaultKind::HttpStatus => "http-status",
            FaultKind::BodyCut => "body-cut",
            FaultKind::StreamIncomplete => "stream-incomplete",
            FaultKind::ErrorEvent => "error-event",
            FaultKind::ContentFilter => "content-filter",
            FaultKind::Dns => "dns",
            FaultKind::ConnectTimeout => "connect-timeout",
            FaultKind::Tls => "tls",
            FaultKind::Reset => "reset",
        }
    }
}

impl std::fmt::Display for ProviderErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
