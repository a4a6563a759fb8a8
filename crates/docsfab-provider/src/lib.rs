//! docsfab's provider transports and the in-turn replay driver.
//!
//! * [`request`]: the provider-neutral request of one turn and its serialization, once, into the
//!   exact payload bytes for `openai-chat` or `anthropic-messages`, with their SHA-256 digest.
//! * [`transport`]: the [`Transport`] seam and the reqwest [`HttpTransport`], which sends one
//!   request and classifies how it failed into the policy's [`ProviderFailure`].
//! * [`outcome`]: reading a 200 stream of either API into a [`StreamOutcome`] (text, tool calls,
//!   finish reason, end marker, usage, models) or a failure.
//! * [`driver`]: [`run_turn`], one provider turn: the request and its in-turn replays, decided
//!   by `docsfab_policy::replay::decide`, with cancellation, the attempt deadline and the
//!   payload-digest check, producing a [`TurnAccount`].
//! * [`constraint`]: a step's contract as the API's structured-output constraint
//!   ([`ResponseFormat`]), and the strict-schema rules that decide how it is sent.
//! * [`gateway`]: recognising a gateway (LiteLLM's proxy) from a response head, and the
//!   provider's Retry-After it relayed under another name.
//! * [`overflow`]: recognising a context-overflow refusal in each server's dialect, with the
//!   token counts it gave (the failure is then named `context-exhausted`).
//! * [`truncation`]: the test for a prompt a server cut to its context window and answered
//!   anyway (a turn warning, never a retry decision).
//! * `scripted` (behind the `testing` feature): an in-memory transport that plays a script, for
//!   paused-clock tests here and in the runtime.
//!
//! [`ProviderFailure`]: docsfab_policy::class::ProviderFailure

pub mod budget;
pub mod constraint;
pub mod driver;
pub mod gateway;
pub mod outcome;
pub mod overflow;
pub mod request;
#[cfg(any(test, feature = "testing"))]
pub mod scripted;
pub mod secret;
pub mod transport;
pub mod truncation;

pub use budget::{Exhausted, RunBudget, SpendLimits};
pub use driver::{
    DriverEvent, Gate, PayloadSource, ReplayEntry, Spend, TurnAccount, TurnEnd, TurnResult,
    run_turn, run_turn_gated,
};
pub use outcome::{FailureBody, FinishReason, StreamOutcome, ToolCall, TransportFailure};
pub use request::{
    AssistantToolCall, Message, Payload, PayloadDigest, RequestError, ResponseFormat, ToolChoice,
    ToolSpec, TurnRequest, endpoint_path,
};
pub use secret::ApiKey;
pub use transport::{
    DEFAULT_MAX_BODY_BYTES, HttpConfig, HttpTransport, Transport, TransportBuildError, endpoint_url,
};
