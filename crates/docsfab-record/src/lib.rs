//! The run record of docsfab and every concept it names, with one owner each.
//!
//! Serde only: no I/O, no clock, no crate of ours below it. The policy, the boundary, the
//! provider client, the simulator, the runtime and the CLI all use these types under these names;
//! none keeps a twin with a conversion. The JSON Schema of the record is [`SCHEMA`].
//!
//! - [`api`]: the wire protocol a provider speaks.
//! - [`class`]: provider error classes and transport faults.
//! - [`gateway`]: a gateway (LiteLLM's proxy) that stood between docsfab and the provider.
//! - [`step`]: a step's access, budgets, retry decision, timeouts, write settlement, contract
//!   failures, failure and transport budget.
//! - [`lease`]: the tool batch of a turn and the lease's stop.
//! - [`replay`]: an in-turn replay and its cause.
//! - [`usage`]: tokens spent.
//! - [`run`]: the run record itself (`docsfab runs show --json`).
mod api;
pub mod class;
pub mod gateway;
pub mod grounding;
pub mod lease;
pub mod replay;
pub mod run;
pub mod step;
pub mod usage;

pub use api::Api;
pub use class::{FaultKind, ProviderErrorClass};
pub use gateway::{Gateway, GatewayName};
pub use grounding::{CitedLines, GroundingRecord, Truthfulness, UnknownCitation};
pub use lease::{
    CallOutcome, CallResult, Disposition, LeaseStop, RejectReason, ToolBatch, ToolCallEntry,
};
pub use replay::{ReplayCause, ReplayRecord};
pub use run::ForEach;
pub use run::{
    ANSWER_EXCERPT_MAX_BYTES, AttemptRecord, AttemptStatus, FileWritten, InterruptedAttempt,
    LeaseRecord, Retry, RunContext, RunLink, RunProvider, RunRecord, RunStatus, RunSummary, SCHEMA,
    StepInput, StepLink, StepRecord, StepStatus, TurnRecord, TurnStatus, TurnWarning, WriteIntent,
    WriteRestore, rfc3339_utc,
};
pub use step::{
    Access, Budget, ContextWindow, ContractFailure, OutputConstraint, RecordedSettlement,
    RetryDecision, StepFailure, TimeoutKind, TransportRetry,
};
pub use usage::{Pricing, Usage, round_usd, shown_cost, sum_cost};
