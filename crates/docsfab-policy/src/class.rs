//! Provider error classes: what an attempt records about why a request that left the host failed.

use docsfab_record::{FaultKind, ProviderErrorClass};
use serde::{Deserialize, Serialize};

/// Everything the policy needs to know about one failed provider request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderFailure {
    /// What the transport saw.
    pub fault: FaultKind,
    /// The class both retry layers decide from.
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
///
/// Beyond the statuses CLS-1 names, the choices are:
/// - 425 (Too Early) is `server`: the server asks for the same request again later, so it is
///   transient like a 5xx and replayed (REP-2);
/// - every other 4xx (402, 405, 410, 451, ...) is `invalid-request`: repeating the identical
///   request cannot change the answer, so it is terminal (REP-3);
/// - 1xx, 2xx, 3xx and anything outside 100..=599 are `unknown` (not a failure status we know).
pub fn classify_http_status(status: u16) -> ProviderErrorClass {
    match status {
        408 | 504 => ProviderErrorClass::Timeout,
        429 => ProviderErrorClass::RateLimit,
        401 | 403 => ProviderErrorClass::Authentication,
        425 => ProviderErrorClass::Server,
        500..=599 => ProviderErrorClass::Server,
        400..=499 => ProviderErrorClass::InvalidRequest,
        _ => ProviderErrorClass::Unknown,
    }
}

/// Whether an HTTP status on the response head is one a server asks a client to repeat
/// (REP-2): 408, 425, 429 and every 5xx.
pub fn is_replayable_status(status: u16) -> bool {
    matches!(status, 408 | 425 | 429 | 500..=599)
}

impl ProviderFailure {
    /// A non-success status on the response head. The class comes from the status alone, so a
    /// status inside the error body can never change it (REP-4).
    pub fn from_http_status(status: u16, retry_after_ms: Option<u64>) -> Self {
        ProviderFailure {
            fault: FaultKind::HttpStatus,
            class: classify_http_status(status),
            http_status: Some(status),
            declared_status: None,
            retry_after_ms,
            content_published: false,
        }
    }

    /// A fault observed on the wire without a status. `HttpStatus` and `ErrorEvent` carry their
    /// class in a status or an event: use [`Self::from_http_status`] or
    /// [`Self::from_error_event`]; given here they are `unknown`.
    pub fn from_fault(fault: FaultKind) -> Self {
        let class = match fault {
            FaultKind::ConnectRefused
            | FaultKind::ConnectionDropped
            | FaultKind::BodyCut
            | FaultKind::Dns
            | FaultKind::Tls
            | FaultKind::Reset => ProviderErrorClass::Network,
            // A connect timeout was recorded as a request timeout before it had its own label;
            // it keeps that class, so the budgets that judge it are unchanged.
            FaultKind::RequestTimeout | FaultKind::ConnectTimeout => ProviderErrorClass::Timeout,
            FaultKind::StreamIncomplete => ProviderErrorClass::StreamIncomplete,
            FaultKind::ContentFilter => ProviderErrorClass::ContentFilter,
            FaultKind::HttpStatus | FaultKind::ErrorEvent => ProviderErrorClass::Unknown,
        };
        ProviderFailure {
            fault,
            class,
            http_status: None,
            declared_status: None,
            retry_after_ms: None,
            content_published: false,
        }
    }

    /// A structured error event that ended a 200 stream (CLS-5, CLS-6). It has no HTTP status of
    /// its own, so a declared 429 stays a rate limit without status (terminal).
    pub fn from_error_event(event: ErrorEventClass) -> Self {
        ProviderFailure {
            fault: FaultKind::ErrorEvent,
            class: event.class,
            http_status: None,
            declared_status: event.declared_status,
            retry_after_ms: None,
            content_published: false,
        }
    }

    /// HTTP 429 on the response head: the failure that the throttle window judges (REP-7).
    pub fn is_throttled(&self) -> bool {
        self.class == ProviderErrorClass::RateLimit && self.http_status == Some(429)
    }

    /// Whether the recorded class lets this failure be sent again, at either layer (REP-2,
    /// REP-5, REP-6, STP-3): `network`, `server`, `timeout`, `stream-incomplete`, and
    /// `rate-limit` only with HTTP 429.
    ///
    /// As a safety net a head status that is not repeatable (any 4xx but 408, 425, 429) keeps the
    /// failure terminal even if the class was recorded inconsistently (REP-3).
    pub fn is_transport_retryable(&self) -> bool {
        let class_allows = match self.class {
            ProviderErrorClass::Network
            | ProviderErrorClass::Server
            | ProviderErrorClass::Timeout
            | ProviderErrorClass::StreamIncomplete => true,
            ProviderErrorClass::RateLimit => self.http_status == Some(429),
            ProviderErrorClass::ContentFilter
            | ProviderErrorClass::Authentication
            | ProviderErrorClass::InvalidRequest
            | ProviderErrorClass::Unknown => false,
        };
        let status_allows = match self.http_status {
            Some(status @ 400..=499) => is_replayable_status(status),
            _ => true,
        };
        class_allows && status_allows
    }
}

/// The reading of a structured error event found in a 200 stream (CLS-5, CLS-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorEventClass {
    /// The class the event's `error.type` and `error.code` give.
    pub class: ProviderErrorClass,
    /// The integer `error.code` when the event declared one.
    pub declared_status: Option<u16>,
}

/// `error.type` values that name a fault on the provider's side (CLS-5). A closed list: a type
/// not listed here never makes an event retryable.
pub const SERVER_FAULT_TYPES: &[&str] = &[
    "server_error",
    "service_unavailable",
    "internal_server_error",
    "internal_error",
    "api_error",
    "overloaded_error",
    "overloaded",
    "bad_gateway",
    "gateway_timeout",
    "timeout_error",
    "upstream_error",
];

/// `error.type` or string `error.code` values naming a content-filter refusal (CLS-1).
pub const CONTENT_FILTER_TYPES: &[&str] = &["content_filter", "content_policy_violation"];

/// `error.type` values naming a rate limit or quota. Inside a 200 stream these have no HTTP
/// status, so they stay terminal (REP-6).
pub const RATE_LIMIT_TYPES: &[&str] = &[
    "rate_limit_error",
    "rate_limit_exceeded",
    "insufficient_quota",
    "quota_exceeded",
];

/// `error.type` values naming an authentication or permission refusal.
pub const AUTHENTICATION_TYPES: &[&str] = &[
    "authentication_error",
    "permission_error",
    "invalid_api_key",
];

/// `error.type` values naming a request the provider will never accept as sent.
pub const INVALID_REQUEST_TYPES: &[&str] = &[
    "invalid_request_error",
    "not_found_error",
    "request_too_large",
];

/// Classifies a parsed structured error event such as
/// `{"error":{"type":"service_unavailable","code":503}}` or Anthropic's
/// `{"type":"error","error":{"type":"overloaded_error","message":"..."}}`. Never reads the
/// message.
///
/// An event is one only when its members are `error` plus, optionally, `"type": "error"` (the
/// same rule as the response boundary, BND-3); anything else, or a null `error`, gives `None`.
///
/// Precedence inside the event: an integer `error.code` in 100..=599, or a decimal string of
/// one (`"500"`, see [`declared_status_of`]), is a declared status and is classed like an HTTP
/// status (a declared 504 is `timeout`, any other 5xx `server`, a declared 429 `rate-limit`),
/// unless it maps to `unknown`; then `error.type` (and a string `error.code`) is looked up in
/// the closed lists above; otherwise the class is `unknown`. A `null` (or any non-string)
/// `error.type` is no type: it names nothing, and never makes the event `unknown` by itself.
pub fn classify_error_event(event: &serde_json::Value) -> Option<ErrorEventClass> {
    let object = event.as_object()?;
    let error = object.get("error").filter(|e| !e.is_null())?;
    let only_error_members = object
        .iter()
        .all(|(key, value)| key == "error" || (key == "type" && value.as_str() == Some("error")));
    if !only_error_members {
        return None;
    }

    let code = error.get("code");
    let declared_status = code.and_then(declared_status_of);

    if let Some(status) = declared_status {
        let class = classify_http_status(status);
        if class != ProviderErrorClass::Unknown {
            return Some(ErrorEventClass {
                class,
                declared_status,
            });
        }
    }

    let error_type = error.get("type").and_then(serde_json::Value::as_str);
    let string_code = code.and_then(serde_json::Value::as_str);
    let class = [error_type, string_code]
        .into_iter()
        .flatten()
        .find_map(class_of_error_type)
        .unwrap_or(ProviderErrorClass::Unknown);
    Some(ErrorEventClass {
        class,
        declared_status,
    })
}

/// The status an event's `error.code` declares: an integer in 100..=599, or the same number
/// written as exactly three ASCII digits. LiteLLM's proxy writes every status it relays that
/// way (`"code": "500"`, `sse_error_payload` in `litellm/proxy/common_request_processing.py`),
/// and reads such strings back as statuses itself (`_parse_event_data_for_error`), so the
/// string is the same declaration as the integer (issue 24). Anything looser (`" 503"`,
/// `"0503"`, `"503.0"`, `"5e2"`, a fraction, a negative number) declares nothing.
pub fn declared_status_of(code: &serde_json::Value) -> Option<u16> {
    let n = match code {
        serde_json::Value::Number(n) => n.as_u64()?,
        serde_json::Value::String(s) if s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse::<u64>().ok()?
        }
        _ => return None,
    };
    u16::try_from(n).ok().filter(|c| (100..=599).contains(c))
}

fn class_of_error_type(name: &str) -> Option<ProviderErrorClass> {
    let listed = |list: &[&str]| list.contains(&name);
    // Without a declared status every server-fault type is `server`, the timeout-named ones
    // included (CLS-6); both are retryable alike.
    if listed(SERVER_FAULT_TYPES) {
        Some(ProviderErrorClass::Server)
    } else if listed(CONTENT_FILTER_TYPES) {
        Some(ProviderErrorClass::ContentFilter)
    } else if listed(RATE_LIMIT_TYPES) {
        Some(ProviderErrorClass::RateLimit)
    } else if listed(AUTHENTICATION_TYPES) {
        Some(ProviderErrorClass::Authentication)
    } else if listed(INVALID_REQUEST_TYPES) {
        Some(ProviderErrorClass::InvalidRequest)
    } else {
        None
    }
}
