//! What an attempt is given ([`AttemptInput`], with its [`AttemptSpend`]) and what its caller
//! hears while it runs ([`TurnEvent`]).

use bytes::Bytes;
use docsfab_boundary::BoundaryConfig;
use docsfab_policy::host::StructuredOutput;
use docsfab_policy::replay::ReplayLimits;
use docsfab_policy::rules::Feedback;
use docsfab_provider::driver::Gate;
use docsfab_provider::{ReplayEntry, RunBudget, Transport};
use docsfab_record::{Api, Pricing, TurnStatus, TurnWarning};
use tokio_util::sync::CancellationToken;

use crate::batch::{self, ToolUse};
use crate::composition::{ModelLimits, Step};
use crate::grounding::GroundingBasis;
use crate::workspace::Workspace;

/// Everything one attempt needs. The ceilings in `limits` are the composition's sealed limits;
/// every attempt of a step gets the same ones and a fresh source-read budget (STP-2).
pub struct AttemptInput<'a> {
    pub transport: &'a dyn Transport,
    /// The shared provider throttle every send of the attempt passes; `None` sends at once.
    pub gate: Option<Gate<'a>>,
    pub api: Api,
    pub model: &'a str,
    pub step: &'a Step,
    pub limits: ModelLimits,
    pub replay_limits: ReplayLimits,
    /// The response boundary for the run's provider, selected model and key (BND-1), or why it
    /// could not be built (then nothing is sent). A completed turn whose transport kept no raw
    /// body (an in-memory test transport) has nothing to check; the HTTP transport the executor
    /// builds always keeps it.
    pub boundary: Result<&'a BoundaryConfig, &'a str>,
    /// The step's instructions with `{{steps.ID.output}}` already substituted.
    pub instructions: &'a str,
    /// The correction the step retry carried to this attempt.
    pub feedback: Option<Feedback>,
    pub workspace: &'a Workspace,
    pub cancel: &'a CancellationToken,
    /// Told about each turn as it happens (for progress display and tests).
    pub observer: &'a (dyn Fn(TurnEvent) + Send + Sync),
    /// Called before each write runs (the executor records a write intent); `None` runs writes
    /// unrecorded.
    pub before_write: Option<batch::BeforeWrite<'a>>,
    /// How the attempt asks for usage, prices it and reserves its spend.
    pub spend: AttemptSpend<'a>,
    /// How a contract's schema is sent as a structured-output constraint (host.yaml
    /// `structuredOutput`).
    pub structured_output: StructuredOutput,
    /// The workspace and the run's pages, for a step whose contract asks for grounding.
    pub grounding: Option<&'a GroundingBasis>,
    /// The unknown names the last ungrounded attempt cited, worded for the model; sent with
    /// the `ground-every-name` correction.
    pub grounding_correction: Option<&'a str>,
}

/// What an attempt's requests ask for usage and caching, what its usage is priced at, and the
/// run budget each send reserves from (docs/cost.md).
#[derive(Debug, Clone, Default)]
pub struct AttemptSpend<'a> {
    /// `None`: the run has no token or cost bound.
    pub budget: Option<&'a RunBudget>,
    /// `None`: no price, so `costUsd` stays `null`.
    pub pricing: Option<Pricing>,
    /// OpenAI: ask for the usage chunk.
    pub include_usage: bool,
    /// The step's prompt cache key; `None` asks for no caching.
    pub prompt_cache_key: Option<String>,
}

/// What happens inside an attempt, as it happens.
#[derive(Debug, Clone)]
pub enum TurnEvent {
    /// The lease granted turn `turn`; `payload` is the exact request body about to be sent and
    /// `digest` its SHA-256 (the simulator's request log names the same digest).
    Request {
        turn: u32,
        digest: String,
        payload: Bytes,
    },
    /// The replay driver scheduled an in-turn replay after `wait_ms`.
    Replay { turn: u32, entry: ReplayEntry },
    /// The shared provider throttle held a request of the turn `held_ms` before it was sent;
    /// `reason` is the last gate that made it wait (`hold`, `concurrency`, `adaptive`, `pacing`).
    Held {
        turn: u32,
        held_ms: u64,
        reason: &'static str,
    },
    /// The throttle's shared state could not be used, so requests go unthrottled. Sent once per
    /// process, however often it happens.
    ThrottleUnavailable { message: String },
    /// The turn ended.
    Finished {
        turn: u32,
        status: TurnStatus,
        requested: u32,
        rejected: u32,
        executed: u32,
        /// The batch's calls: tool, target and outcome (redacted), in the order asked for.
        calls: Vec<ToolUse>,
        /// Why a turn that did not complete ended (the turn record's `reason`); `None` when
        /// it completed.
        reason: Option<String>,
    },
    /// Something looked wrong with the turn that decided nothing (the turn record's
    /// `warnings`); sent right after its `Finished`.
    Warning { turn: u32, warning: TurnWarning },
}
