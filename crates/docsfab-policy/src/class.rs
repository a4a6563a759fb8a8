//! Provider error classes: what an attempt records about why a request that left the host failed.

use serde::{Deserialize, Serialize};

/// The class recorded for a failed provider request. Both the in-turn replay and the step retry
/// decide from this value before they look at any error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderErrorClass {
    Network,
    Server,
    Timeout,
    RateLimit,
    StreamIncomplete,
    ContentFilter,
    Authentication,
    InvalidRequest,
    Unknown,
}

/// How a provider request failed, as the transport observed it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The connection could not be made (refused, unreachable).
    ConnectRefused,
    /// The connection was reset or dropped before a response head arrived.
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
}

/// Everything the policy needs to know about one failed provider request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderFailure {
    pub fault: FaultKind,
    pub class: ProviderErrorClass,
    /// The status code of the response head; `None` when no head arrived, and for errors that came
    /// inside a 200 stream (a status declared in an error event is `declared_status`).
    pub http_status: Option<u16>,
    /// The integer `error.code` of a structured error event, when it declared one.
    pub declared_status: Option<u16>,
    /// The provider's Retry-After, in milliseconds, when the response carried one.
    pub retry_after_ms: Option<u64>,
    /// Whether answer content (text or a tool call) had already been published before the failure.
    pub content_published: bool,
}

/// The class of an HTTP status the provider sent on the response head (CLS-1).
/// Owned by the policy-decisions work: see `ProviderErrorClass` for the classes.
pub fn classify_http_status(status: u16) -> ProviderErrorClass {
    let _ = status;
    todo!("policy: classify_http_status")
}

/// The reading of a structured error event found in a 200 stream (CLS-5, CLS-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorEventClass {
    pub class: ProviderErrorClass,
    /// The integer `error.code` when the event declared one.
    pub declared_status: Option<u16>,
}

/// Classifies a parsed structured error event such as
/// `{"error":{"type":"service_unavailable","code":503}}`. Never reads the message.
/// Returns `None` when the value is not an error event at all.
pub fn classify_error_event(event: &serde_json::Value) -> Option<ErrorEventClass> {
    let _ = event;
    todo!("policy: classify_error_event")
}
