//! What the boundary decides about a body: pass it on, or refuse it with a reason and an offset.

use std::fmt;
use std::sync::Arc;

/// The boundary's decision on one 200 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The consumer may read the body.
    Pass(Pass),
    /// The body must not reach the consumer.
    Refuse(Refusal),
}

impl Verdict {
    /// The refusal, when the body was refused.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Verdict::Pass(_) => None,
            Verdict::Refuse(r) => Some(r),
        }
    }
}

/// Why a body passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// A stream of model output whose every event carries (or follows) the selected model's
    /// identity (BND-4).
    Stream,
    /// A stream whose only events are pure structured error events, with at most a closing
    /// `[DONE]`: no identity to check, passed on so the error can be classified (BND-2).
    ErrorEventsOnly,
}

/// A refusal: the reason, and the byte offset in the body where it was decided.
///
/// The offset is the first byte of the line the refusal is about (a leading byte order mark
/// counts as part of its line), or the first byte of a credential found in the raw bytes of a
/// line, or the length of the body when only the end of the body could decide (no event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub offset: u64,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "response refused at byte {}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for Refusal {}

/// Why a body was refused. [`Reason::code`] gives the stable kebab-case code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A line that is neither blank, a comment, nor a `data`, `event`, `id` or `retry` field:
    /// the body is not an event stream (a plain JSON body, an HTML error page) (BND-8).
    NotAStream,
    /// The body ended without a single `data:` line (BND-8).
    NoEvent,
    /// A `data:` line that is neither `[DONE]` nor one complete JSON value (BND-7).
    UnparsableDataLine,
    /// A `data:` line holding JSON that is not an object, which neither API ever sends.
    DataNotAnObject,
    /// A second `data:` line in one event (BND-7). Every consumer joins an event's data lines
    /// with a newline and parses the whole, which two JSON values (or a value and `[DONE]`)
    /// never are: the body passed would be one no consumer can read.
    MultiLineDataEvent,
    /// An event that needs the model's identity does not carry or follow one (BND-4, BND-5).
    MissingModelIdentity,
    /// An event names a model other than the selected one (BND-4).
    ModelMismatch,
    /// Credential material, by kind; the secret itself is never kept.
    CredentialMaterial(CredentialKind),
    /// A single line longer than the configured limit.
    LineTooLong,
}

impl Reason {
    /// The stable code, for records and logs.
    pub fn code(&self) -> &'static str {
        match self {
            Reason::NotAStream => "not-a-stream",
            Reason::NoEvent => "no-event",
            Reason::UnparsableDataLine => "unparsable-data-line",
            Reason::DataNotAnObject => "data-not-an-object",
            Reason::MultiLineDataEvent => "multi-line-data-event",
            Reason::MissingModelIdentity => "missing-model-identity",
            Reason::ModelMismatch => "model-mismatch",
            Reason::CredentialMaterial(_) => "credential-material",
            Reason::LineTooLong => "line-too-long",
        }
    }

    /// Whether this refusal is about credential material, which a validator marks terminal
    /// (STP-14); the other reasons describe one response and leave retrying to the caller.
    pub fn is_credential(&self) -> bool {
        matches!(self, Reason::CredentialMaterial(_))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::CredentialMaterial(kind) => write!(f, "credential-material ({kind})"),
            other => f.write_str(other.code()),
        }
    }
}

/// The kind of credential found. Names the kind, never the value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CredentialKind {
    /// `sk-...`, `sk-proj-...` and other OpenAI secret keys.
    OpenAiKey,
    /// `sk-ant-...`.
    AnthropicKey,
    /// `nvapi-...`.
    NvidiaKey,
    /// `AKIA`/`ASIA` followed by 16 upper-case letters or digits.
    AwsAccessKeyId,
    /// `ghp_`, `gho_`, `ghs_`, `ghu_`, `ghr_` and `github_pat_` tokens.
    GitHubToken,
    /// A `-----BEGIN ... PRIVATE KEY-----` header followed by key material.
    PemPrivateKey,
    /// One of the host's own secrets, by the label the caller gave it (e.g. the name of the
    /// environment variable it was read from).
    HostSecret(Arc<str>),
}

impl CredentialKind {
    pub fn code(&self) -> &str {
        match self {
            CredentialKind::OpenAiKey => "openai-api-key",
            CredentialKind::AnthropicKey => "anthropic-api-key",
            CredentialKind::NvidiaKey => "nvidia-api-key",
            CredentialKind::AwsAccessKeyId => "aws-access-key-id",
            CredentialKind::GitHubToken => "github-token",
            CredentialKind::PemPrivateKey => "pem-private-key",
            CredentialKind::HostSecret(_) => "host-secret",
        }
    }
}

impl fmt::Display for CredentialKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialKind::HostSecret(label) => write!(f, "host-secret {label}"),
            other => f.write_str(other.code()),
        }
    }
}
