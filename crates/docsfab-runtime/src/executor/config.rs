//! What a run is given ([`RunConfig`], with its provider's [`ProviderSettings`] and the earlier
//! run it may [`Carry`] results over from) and how it ends ([`RunOutcome`], [`RunError`]).

use std::path::PathBuf;
use std::time::Duration;

use docsfab_policy::catalog::EffectiveLimits;
use docsfab_policy::host::StructuredOutput;
use docsfab_policy::rules::RulesTable;
use docsfab_provider::{ApiKey, TransportBuildError};
use docsfab_record::{Api, Pricing, RunStatus};
use docsfab_throttle::Throttle;
use tokio_util::sync::CancellationToken;

use crate::composition::Composition;
use crate::progress::ProgressSink;
use crate::reuse::Reference;
use crate::store::{JobSpec, StoreError};

/// The provider a run talks to, as host.yaml names it, with the key already read from the
/// variable `apiKeyEnv` names. The key is only ever put in the request header.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// The provider's key under host.yaml's `providers:` (the run record names it).
    pub name: String,
    pub api: Api,
    /// Including the version prefix, e.g. `https://api.example.com/v1`.
    pub base_url: String,
    /// The provider's default model; the composition's `model` wins when set.
    pub model: String,
    /// `None` sends no auth header (a local simulator needs none). Give it the name of its
    /// variable with [`ApiKey::with_label`]: a response that carries the key's value is then
    /// refused naming that variable.
    pub api_key: Option<ApiKey>,
    /// What host.yaml says of the provider's usage, prices and cost budget.
    pub spend: SpendSettings,
    /// How a contract step's schema is sent as a structured-output constraint.
    pub structured_output: StructuredOutput,
}

/// How a run asks for usage, what it prices it at and what it may spend (host.yaml's
/// `includeUsage`, `promptCaching`, `pricing` and `budget.maxRunCostUsd`; docs/cost.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpendSettings {
    /// OpenAI: ask for the usage chunk with `stream_options` (default true).
    pub include_usage: bool,
    /// Mark the stable prefix for the provider's prompt cache (default true).
    pub prompt_caching: bool,
    /// `None`: no price, so every `costUsd` is `null`.
    pub pricing: Option<Pricing>,
    /// Host.yaml validation guarantees a price beside it.
    pub max_run_cost_usd: Option<f64>,
}

impl Default for SpendSettings {
    fn default() -> Self {
        SpendSettings {
            include_usage: true,
            prompt_caching: true,
            pricing: None,
            max_run_cost_usd: None,
        }
    }
}

/// Everything a run needs. Build it after the whole configuration was validated.
pub struct RunConfig {
    pub composition: Composition,
    /// The workspace directory the tools work in.
    pub workspace: PathBuf,
    pub provider: ProviderSettings,
    pub limits: EffectiveLimits,
    pub rules: RulesTable,
    /// The caller's cancellation (Ctrl-C).
    pub cancel: CancellationToken,
    /// The job deadline; `None` uses `runtime.deadlineMilliseconds` from `limits`.
    pub job_deadline: Option<Duration>,
    pub progress: Option<ProgressSink>,
    /// The shared provider throttle (`DOCSFAB_HOME/throttle.db`) every provider request of the
    /// run passes, fan-out instances included; `None` sends at once.
    pub throttle: Option<Throttle>,
    /// An earlier run whose results this run may carry over instead of asking again
    /// (`runs resume`, `run --reuse`); `None` runs every step.
    pub carry: Option<Carry>,
    /// The composition as submitted, kept with the run so `runs resume` can start it again;
    /// `None` keeps none (a claimed job has its own already).
    pub spec: Option<JobSpec>,
}

/// The earlier run a run carries results over from (crate::reuse, docs/resume.md).
#[derive(Debug, Clone)]
pub struct Carry {
    pub reference: Reference,
    /// Set by `runs resume`: the record names the reference run as `resumedFrom`.
    pub resume: bool,
    /// `--allow-lost-pages`: a pages step may write fewer pages than the reference run's did
    /// (docs/pages.md); otherwise it stops before writing and names the pages it would lose.
    pub allow_lost_pages: bool,
}

/// Why a run was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The caller cancelled (Ctrl-C).
    Caller,
    /// The job deadline fired.
    JobDeadline { deadline_ms: u64 },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    pub run_id: String,
    pub status: RunStatus,
    pub cancel_reason: Option<CancelReason>,
}

/// A run that could not be carried out. Step failures are not errors: they are in the record.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Workspace(String),
    #[error("the provider transport cannot be set up: {0}")]
    Transport(#[from] TransportBuildError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
