//! The run record: what `docsfab runs show ID --json` prints and what the run store keeps.
//!
//! Every field is documented for users in `docs/run-record.md`; the JSON Schema [`SCHEMA`]
//! (`run-record.schema.json` beside this crate's manifest) is the machine-checkable form of the
//! same shape.
//!
//! Two pairs of fields in the JSON are redundant on purpose (auditors read them without
//! recomputing) but cannot disagree here: `retryScheduled` is derived from `retryDecision`, and a
//! turn's `providerRetries` is the length of its `replays`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::api::Api;
use crate::class::ProviderErrorClass;
use crate::gateway::Gateway;
use crate::grounding::{GroundingRecord, Truthfulness};
use crate::lease::{Disposition, LeaseStop, ToolBatch};
use crate::replay::ReplayRecord;
use crate::step::{
    Access, Budget, OutputConstraint, RecordedSettlement, RetryDecision, StepFailure, TimeoutKind,
    TransportRetry,
};
use crate::usage::{Usage, sum_cost};

/// The run record's JSON Schema (draft 2020-12). Lives in this crate so that no crate reads a
/// file outside itself.
pub const SCHEMA: &str = include_str!("../run-record.schema.json");

/// The most bytes of an attempt's `answerExcerpt` (UTF-8, after redaction and escaping, the
/// `…` mark included): enough to see why a contract refused an answer, small enough that ten
/// attempts of a step stay a readable record.
pub const ANSWER_EXCERPT_MAX_BYTES: usize = 2048;

/// The whole record of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRecord {
    pub run_id: String,
    /// The composition's `name`.
    pub composition: String,
    pub status: RunStatus,
    /// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T20:35:01.123Z`.
    pub started_at: String,
    /// `null` while the run is `running`.
    pub ended_at: Option<String>,
    /// The canonical workspace path; `null` in a record written before docsfab kept it.
    #[serde(default)]
    pub workspace: Option<String>,
    /// The provider the run talked to; `null` in a record written before docsfab kept it.
    #[serde(default)]
    pub provider: Option<RunProvider>,
    /// The model the run selected (the composition's, else the provider's default).
    #[serde(default)]
    pub model: Option<String>,
    /// The docsfab version that ran it.
    #[serde(default)]
    pub docsfab_version: Option<String>,
    /// The sum of every turn's `heldMs` in the run; derived from the turns when the record is
    /// read (0 in a record written before the throttle existed).
    #[serde(default)]
    pub held_ms: u64,
    /// The sum of every attempt's usage in the run (reused steps spent nothing here); derived
    /// when the record is read. Unknown (`null` counts) when any attempt's usage is.
    #[serde(default = "zero_usage")]
    pub usage: Usage,
    /// The sum of the steps' `costUsd`; derived when the record is read. `null` when no price
    /// is set for the provider or some usage is unknown.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Grounded over cited across the accepted answers of the steps this run judged
    /// (docs/grounding.md); derived when the record is read. Absent when no step's contract
    /// asks for grounding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truthfulness: Option<Truthfulness>,
    /// Why the run ended, in one sentence, when its steps cannot say it: a served run that could
    /// not start (its clone failed, its host did not resolve), one cancelled while queued, one
    /// marked `interrupted`. `null` for a run that ended through its steps.
    #[serde(default)]
    pub end_reason: Option<String>,
    /// Set on a run started by `docsfab runs resume`: the run it carried finished steps over
    /// from. Absent on any other run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<RunLink>,
    pub steps: Vec<StepRecord>,
}

/// A run another run names (its lineage).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunLink {
    pub run_id: String,
}

/// The step of an earlier run whose accepted result a step reused instead of running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepLink {
    pub run_id: String,
    /// The step's id in that run (`STEP[INDEX]` for a fan-out instance).
    pub step_id: String,
}

/// Something of the workspace a step's accepted attempt looked at, as it was then: what
/// decides whether that result still holds for today's tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum StepInput {
    /// A file that was read or searched: its SHA-256 (lowercase hex), `null` when no regular
    /// file was there.
    File {
        path: String,
        sha256: Option<String>,
    },
    /// A directory that was listed or searched: every entry under it as `list_files` walks
    /// them (directories end in `/`), `null` when no directory was there.
    Listing {
        path: String,
        entries: Option<Vec<String>>,
    },
}

impl StepInput {
    /// The workspace-relative path the input is about.
    pub fn path(&self) -> &str {
        match self {
            StepInput::File { path, .. } | StepInput::Listing { path, .. } => path,
        }
    }
}

/// What a run is started with and keeps from its first moment: where it worked, which provider
/// and model it asked, and which docsfab it was. A `running` or `interrupted` run has it too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunContext {
    pub workspace: String,
    pub provider: RunProvider,
    pub model: String,
    pub docsfab_version: String,
    /// The run a resumed run carries finished steps over from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<RunLink>,
}

/// The provider of a run as host.yaml names it. `host` is the base URL's host and port only:
/// never its user information, path or query, which can carry credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunProvider {
    /// The key under host.yaml's `providers:`.
    pub name: String,
    pub api: Api,
    /// `host[:port]`, e.g. `api.openai.com` or `127.0.0.1:8080`.
    pub host: String,
}

/// The summary `docsfab runs list --json` prints for each run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunSummary {
    pub run_id: String,
    pub composition: String,
    pub status: RunStatus,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// The run a resumed run carried finished steps over from; absent on any other run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<RunLink>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Submitted to `docsfab serve` and not yet claimed by a worker: no steps, no context.
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// The owning process died while the run was `running` (found on the next start).
    Interrupted,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
        }
    }

    /// Every status, in the order a run can pass through them.
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Interrupted,
    ];

    pub fn parse(text: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// A step's status uses the run's vocabulary: a step is `running` until it ends, and
/// `interrupted` when the run was.
pub type StepStatus = RunStatus;

/// One step of the run and every attempt it made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRecord {
    pub step_id: String,
    pub access: Access,
    pub status: StepStatus,
    /// The `retry.maxRetries` catalog value in force (3, or lower where host.yaml lowers it).
    pub configured_max_retries: u32,
    /// What the step actually used after the environment and the host override.
    pub effective_max_retries: u32,
    pub transport_retry: TransportRetry,
    pub failure: Option<StepFailure>,
    /// The accepted answer object of a read-only step; `null` otherwise.
    #[serde(default)]
    pub output: Option<serde_json::Value>,
    /// The attempt that was running when the run's process died, with the writes it had begun;
    /// present only on an `interrupted` step whose unfinished attempt wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted_attempt: Option<InterruptedAttempt>,
    /// Set on an instance of a fan-out step: which step, which element. Absent on other steps
    /// (and in records written before fan-out existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<ForEach>,
    /// The sum of the `heldMs` of every turn of every attempt of the step; derived from the
    /// turns when the record is read.
    #[serde(default)]
    pub held_ms: u64,
    /// The sum of the usage of every attempt of the step; derived when the record is read.
    #[serde(default = "zero_usage")]
    pub usage: Usage,
    /// The sum of the attempts' `costUsd`; derived when the record is read. `null` when an
    /// attempt's cost is unknown or the step made no attempt.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Grounded over cited in the step's accepted answer (docs/grounding.md); derived when the
    /// record is read. Absent when its contract asks for no grounding, when it failed, and on
    /// a step carried over from an earlier run (the figure is in that run's record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truthfulness: Option<Truthfulness>,
    /// A digest (SHA-256, hex) of everything the step was asked with: its rendered
    /// instructions, its settings, the provider, the model and the docsfab version. Two steps
    /// with the same fingerprint and unchanged inputs would be asked the same question. Set when
    /// the step succeeded; absent in records written before docsfab kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// What the accepted attempt looked at (files read or searched, directories listed), as it
    /// was then. Set when the step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<StepInput>>,
    /// Set when the step was not run but carried over from an earlier run (`runs resume`,
    /// `run --reuse`): its output and files are that step's, and its attempts stay in that
    /// run's record (this step has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reused_from: Option<StepLink>,
    /// The files a reused step's accepted attempt wrote, as that attempt recorded them. Absent
    /// on a step that ran (its attempts hold them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_written: Option<Vec<FileWritten>>,
    pub attempts: Vec<AttemptRecord>,
}

/// The element a fan-out step instance ran for. The instance's `stepId` is `STEP[INDEX]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForEach {
    /// The fan-out step's id as the composition names it.
    pub step: String,
    /// The element's 0-based position in the array.
    pub index: u32,
    /// The element itself.
    pub item: serde_json::Value,
}

/// An attempt that never finished because its process died (`kill -9`, power loss): it has no
/// attempt record, only the write intents committed before each of its writes ran. Its files
/// were not restored: a listed path may hold the attempt's partial work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterruptedAttempt {
    /// The number the attempt had (one more than the attempts recorded).
    pub attempt: u32,
    /// In the order the writes were about to run.
    pub write_intents: Vec<WriteIntent>,
}

/// A write a write step's attempt was about to run, committed to the run store before it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WriteIntent {
    /// The tool, e.g. `write_file`.
    pub tool: String,
    /// Relative to the workspace root.
    pub path: String,
    pub intended_at: String,
}

/// Whether the host put the workspace back after an attempt's writes: after a failed attempt
/// that is retried, and after a cancelled one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteRestore {
    /// Every written file is back as it was, checked by SHA-256; created files are gone.
    Restored,
    /// The restore or its check failed; the attempt's `message` names the file.
    RestoreFailed,
}

impl WriteRestore {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteRestore::Restored => "restored",
            WriteRestore::RestoreFailed => "restore-failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptStatus {
    Succeeded,
    Failed,
    Cancelled,
}

impl AttemptStatus {
    /// The record's spelling: `succeeded`, `failed` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Succeeded => "succeeded",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Cancelled => "cancelled",
        }
    }
}

/// One attempt of a step: its budget, its outcome, the retry decision it earned, its spend and
/// its turns. (Unknown fields are refused by the JSON Schema: serde cannot deny them beside a
/// flattened field.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// 1-based.
    pub attempt: u32,
    pub budget: Budget,
    pub status: AttemptStatus,
    pub started_at: String,
    pub provider_error_class: Option<ProviderErrorClass>,
    pub http_status: Option<u16>,
    pub retry_after_ms: Option<u64>,
    /// The gateway the attempt's responses came through (LiteLLM's proxy, recognised by its
    /// `x-litellm-*` headers): it may have renamed, reshaped or completed what the provider
    /// sent. Absent when no response came through a gateway docsfab recognises.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Gateway>,
    pub failure_category: Option<String>,
    pub failure_class: Option<String>,
    pub code: Option<String>,
    /// A one-line diagnostic for a failed attempt (for example the preflight evidence).
    #[serde(default)]
    pub message: Option<String>,
    /// The start of the final answer the attempt ended on (the text a read step's contract
    /// judged, a write step's closing text), redacted and escaped to one line, at most
    /// [`ANSWER_EXCERPT_MAX_BYTES`] bytes and ending in `…` when cut; `null` when the attempt
    /// ended without one.
    #[serde(default)]
    pub answer_excerpt: Option<String>,
    /// The full answer's size in bytes as the model sent it, beside its excerpt.
    #[serde(default)]
    pub answer_bytes: Option<u64>,
    pub timeout_kind: Option<TimeoutKind>,
    /// The structured-output constraint the attempt's answer requests carried (docs/
    /// structured-output.md); absent when none was sent (no contract, `structuredOutput: off`,
    /// or a schema the API cannot take) and in records written before docsfab sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_constraint: Option<OutputConstraint>,
    /// What the answer cited and what of it the workspace did not hold, for a step whose
    /// contract asks for grounding and an answer that met its schema; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grounding: Option<GroundingRecord>,
    pub retry_rule: Option<String>,
    #[serde(flatten)]
    pub retry: Retry,
    /// The wait scheduled after this attempt, before the next one.
    pub wait_ms: Option<u64>,
    pub write_settlement: Option<RecordedSettlement>,
    /// Present when a restore of the attempt's writes ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_restore: Option<WriteRestore>,
    /// Every file the attempt changed, in the order it first wrote them; kept even when the
    /// attempt's writes were later restored (`writeRestore` says so). Empty for a read-only
    /// step; `None` (absent) in a record written before docsfab kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_written: Option<Vec<FileWritten>>,
    pub usage: Usage,
    /// What the attempt's usage cost at the provider's host.yaml `pricing`, in USD; `null` when
    /// no price is set or the usage is unknown.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    pub duration_ms: u64,
    pub lease: LeaseRecord,
    pub turns: Vec<TurnRecord>,
}

/// One file an attempt changed: its final size and its SHA-256 (lowercase hex) before the
/// attempt's first write and when the attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileWritten {
    /// Relative to the workspace root.
    pub path: String,
    /// The file's size when the attempt ended (0 when it was gone).
    pub bytes: u64,
    /// `null` when the file did not exist before the attempt.
    pub sha256_before: Option<String>,
    /// `null` when the file did not exist (or could not be read) when the attempt ended.
    pub sha256_after: Option<String>,
}

/// The retry decision of an attempt. Serialized as the two record fields `retryDecision` and
/// `retryScheduled`; the second is derived, so the two cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub decision: RetryDecision,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RetryWire {
    retry_decision: RetryDecision,
    retry_scheduled: bool,
}

impl Serialize for Retry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RetryWire {
            retry_decision: self.decision,
            retry_scheduled: self.decision.is_scheduled(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Retry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = RetryWire::deserialize(deserializer)?;
        if wire.retry_scheduled != wire.retry_decision.is_scheduled() {
            return Err(serde::de::Error::custom(
                "retryScheduled must be true exactly when retryDecision is scheduled",
            ));
        }
        Ok(Retry {
            decision: wire.retry_decision,
        })
    }
}

/// The attempt's execution lease as it ended (LSE-1..3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRecord {
    /// The composition's `maxTurns`: the provider turns the lease granted.
    pub max_turns: u32,
    pub turns_used: u32,
    pub executed_tool_calls: u32,
    /// Executed calls per tool name.
    pub tool_counters: BTreeMap<String, u32>,
    pub stop_reason: LeaseStop,
    pub disposition: Disposition,
    /// The host's evidence for the stop, when it has any (for example a preflight diagnostic).
    pub evidence: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TurnStatus {
    Completed,
    Failed,
    Cancelled,
}

impl TurnStatus {
    /// The record's spelling: `completed`, `failed` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnStatus::Completed => "completed",
            TurnStatus::Failed => "failed",
            TurnStatus::Cancelled => "cancelled",
        }
    }
}

/// One provider turn of an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", into = "TurnWire", try_from = "TurnWire")]
pub struct TurnRecord {
    /// 1-based within the attempt.
    pub turn: u32,
    pub status: TurnStatus,
    /// One entry per in-turn replay; `providerRetries` in the JSON is its length.
    pub replays: Vec<ReplayRecord>,
    pub tool_batch: ToolBatch,
    pub usage: Usage,
    /// What the turn's usage cost, as the attempt's `costUsd`.
    pub cost_usd: Option<f64>,
    /// Why a turn that did not complete ended, in one short line (`provider fault: HTTP 503
    /// (server) after 8 requests`, `attempt deadline`, `cancelled`); `None` for a completed turn.
    pub reason: Option<String>,
    /// Time the shared provider throttle held the turn's requests before they were sent (0
    /// in a record written before the throttle existed). Not a replay and not replay wait.
    pub held_ms: u64,
    /// From the turn's start to the next turn's start (or the attempt's end): its request,
    /// replays and tool batch. `None` in records from before docsfab kept it.
    pub duration_ms: Option<u64>,
    /// What looked wrong with the turn's answer without changing any decision (docs/cost.md,
    /// "Silent prompt truncation"); empty in most turns and in older records.
    pub warnings: Vec<TurnWarning>,
}

/// A warning on a turn: something an operator should look at that decided nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TurnWarning {
    /// The provider reported far fewer prompt tokens than a request of `sent_bytes` can hold:
    /// the server most likely cut the prompt to its context window and answered anyway.
    #[serde(rename_all = "camelCase")]
    PromptTruncated { sent_bytes: u64, input_tokens: u64 },
}

impl TurnWarning {
    /// One line for an operator.
    pub fn describe(&self) -> String {
        match self {
            TurnWarning::PromptTruncated {
                sent_bytes,
                input_tokens,
            } => format!(
                "the provider counted {input_tokens} prompt tokens for a {sent_bytes}-byte request; it probably cut the prompt to its context window without saying so (raise the server's context size, e.g. llama-server -c or Ollama num_ctx)"
            ),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TurnWire {
    turn: u32,
    status: TurnStatus,
    provider_retries: u32,
    replays: Vec<ReplayRecord>,
    tool_batch: ToolBatch,
    usage: Usage,
    #[serde(default)]
    cost_usd: Option<f64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    held_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<TurnWarning>,
}

impl From<TurnRecord> for TurnWire {
    fn from(t: TurnRecord) -> Self {
        TurnWire {
            turn: t.turn,
            status: t.status,
            provider_retries: t.provider_retries(),
            replays: t.replays,
            tool_batch: t.tool_batch,
            usage: t.usage,
            cost_usd: t.cost_usd,
            reason: t.reason,
            held_ms: t.held_ms,
            duration_ms: t.duration_ms,
            warnings: t.warnings,
        }
    }
}

impl TryFrom<TurnWire> for TurnRecord {
    type Error = String;
    fn try_from(w: TurnWire) -> Result<Self, String> {
        if usize::try_from(w.provider_retries).ok() != Some(w.replays.len()) {
            return Err(format!(
                "turn {}: providerRetries is {} but {} replays are listed",
                w.turn,
                w.provider_retries,
                w.replays.len()
            ));
        }
        Ok(TurnRecord {
            turn: w.turn,
            status: w.status,
            replays: w.replays,
            tool_batch: w.tool_batch,
            usage: w.usage,
            cost_usd: w.cost_usd,
            reason: w.reason,
            held_ms: w.held_ms,
            duration_ms: w.duration_ms,
            warnings: w.warnings,
        })
    }
}

impl TurnRecord {
    pub fn provider_retries(&self) -> u32 {
        u32::try_from(self.replays.len()).unwrap_or(u32::MAX)
    }
}

impl StepRecord {
    /// The files the step's result stands on: a reused step's own list, else its last
    /// attempt's (a succeeded step's accepted attempt is its last).
    pub fn result_files(&self) -> &[FileWritten] {
        if let Some(files) = &self.files_written {
            return files;
        }
        self.attempts
            .last()
            .and_then(|a| a.files_written.as_deref())
            .unwrap_or(&[])
    }

    /// The throttle's hold over every turn of every attempt: the step's `heldMs`.
    pub fn turns_held_ms(&self) -> u64 {
        self.attempts
            .iter()
            .flat_map(|a| &a.turns)
            .fold(0u64, |sum, t| sum.saturating_add(t.held_ms))
    }
}

impl RunRecord {
    /// Sets the step and run totals (`heldMs`, `usage`, `costUsd`, `truthfulness`) from the
    /// attempts and turns, their one source.
    pub fn sum_totals(&mut self) {
        let mut held = 0u64;
        for step in &mut self.steps {
            step.truthfulness = Truthfulness::of_step(step);
            step.held_ms = step.turns_held_ms();
            held = held.saturating_add(step.held_ms);
            step.usage = step.attempts.iter().map(|a| a.usage).sum();
            step.cost_usd = match step.attempts.is_empty() {
                true => None,
                false => sum_cost(step.attempts.iter().map(|a| a.cost_usd)),
            };
        }
        self.held_ms = held;
        self.truthfulness = Truthfulness::of_run(&self.steps);
        self.usage = self.steps.iter().map(|s| s.usage).sum();
        let spent: Vec<_> = self
            .steps
            .iter()
            .filter(|s| !s.attempts.is_empty())
            .collect();
        self.cost_usd = match spent.is_empty() {
            true => None,
            false => sum_cost(spent.iter().map(|s| s.cost_usd)),
        };
    }
}

fn zero_usage() -> Usage {
    Usage::ZERO
}

/// Formats a time as RFC 3339 UTC with milliseconds (`2026-11-29T20:35:01.123Z`). Times before
/// 1970 are clamped to the epoch.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let millis = since.subsec_millis();
    let secs = since.as_secs();
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day): Howard Hinnant's
/// `civil_from_days`, restricted to dates after the epoch.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}
