//! The run record: what `docsfab runs show ID --json` prints and what the run store keeps.
//!
//! Every field is documented for users in `docs/run-record.md`; the JSON Schema in
//! `docs/run-record.schema.json` is the machine-checkable form of the same shape, and
//! [`validate_against_schema`] checks a serialized record against it.
//!
//! Two pairs of fields in the JSON are redundant on purpose (auditors read them without
//! recomputing) but cannot disagree here: `retryScheduled` is derived from `retryDecision`, and a
//! turn's `providerRetries` is the length of its `replays`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use docsfab_policy::class::ProviderErrorClass;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
    pub steps: Vec<StepRecord>,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
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
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
        }
    }

    pub fn parse(text: &str) -> Option<RunStatus> {
        [
            RunStatus::Running,
            RunStatus::Succeeded,
            RunStatus::Failed,
            RunStatus::Cancelled,
            RunStatus::Interrupted,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// Whether a step may write files (the composition's `access`).
pub use crate::composition::Access as StepAccess;

/// A step's status uses the run's vocabulary: a step is `running` until it ends, and
/// `interrupted` when the run was.
pub type StepStatus = RunStatus;

/// One step of the run and every attempt it made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRecord {
    pub step_id: String,
    pub access: StepAccess,
    pub status: StepStatus,
    /// The `retry.maxRetries` catalog value in force (3, or lower where host.yaml lowers it).
    pub configured_max_retries: u32,
    /// What the step actually used after the environment and the host override.
    pub effective_max_retries: u32,
    pub transport_retry: TransportRetryBudget,
    pub failure: Option<StepFailure>,
    /// The accepted answer object of a read-only step; `null` otherwise.
    #[serde(default)]
    pub output: Option<serde_json::Value>,
    /// The attempt that was running when the run's process died, with the writes it had begun;
    /// present only on an `interrupted` step whose unfinished attempt wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted_attempt: Option<InterruptedAttempt>,
    pub attempts: Vec<AttemptRecord>,
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

/// The transport budget the step applied (STP-6).
///
/// The same four values, under the same names, as `docsfab_policy::catalog::TransportRetry`,
/// which the step reads them from. It stays a type of its own because the record must also read
/// them back (the run store, `runs show`) and refuse unknown fields, and the catalog's type only
/// serializes; once the catalog's type derives `Deserialize` with `deny_unknown_fields`, this one
/// can become an alias of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransportRetryBudget {
    pub max_transport_retries: u32,
    pub transport_max_delay_ms: u64,
    pub transport_max_elapsed_ms: u64,
    pub base_delay_ms: u64,
}

impl From<docsfab_policy::catalog::TransportRetry> for TransportRetryBudget {
    fn from(t: docsfab_policy::catalog::TransportRetry) -> Self {
        TransportRetryBudget {
            max_transport_retries: t.max_transport_retries,
            transport_max_delay_ms: t.transport_max_delay_ms,
            transport_max_elapsed_ms: t.transport_max_elapsed_ms,
            base_delay_ms: t.base_delay_ms,
        }
    }
}

/// Why a step failed, with what to do about it: the step policy's own failure, recorded as the
/// policy wrote it.
pub use docsfab_policy::step::StepFailure;

/// Which budget paid for an attempt: `initial`, `contract` or `transport`.
pub use docsfab_policy::step::Budget as AttemptBudget;

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

/// Which timer ended a timed-out attempt: `attempt-deadline` or `provider-timeout`.
pub use docsfab_policy::step::TimeoutKind;

/// What the step retry decided after an attempt (`none`, `scheduled`, `exhausted`, `terminal`,
/// `declined`), as the step policy decided it.
pub use docsfab_policy::step::RetryDecision;

/// What the host proved about writes during a failed attempt of a write step (WRT-3):
/// `no-write`, `write-executed` or `unavailable`. The step policy's own `WriteSettlement` has a
/// fourth value (a write that ran and whose restore failed) that the record spells
/// `write-executed`; `docsfab_policy::step::WriteSettlement::recorded` maps one to the other.
pub use docsfab_policy::step::RecordedSettlement as WriteSettlement;

/// Tokens an attempt or a turn spent, as the provider reported them (OPS-4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    /// Saturating: a corrupt provider count must not overflow the record.
    fn add(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
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
    pub budget: AttemptBudget,
    pub status: AttemptStatus,
    pub started_at: String,
    pub provider_error_class: Option<ProviderErrorClass>,
    pub http_status: Option<u16>,
    pub retry_after_ms: Option<u64>,
    pub failure_category: Option<String>,
    pub failure_class: Option<String>,
    pub code: Option<String>,
    /// A one-line diagnostic for a failed attempt (for example the preflight evidence).
    #[serde(default)]
    pub message: Option<String>,
    pub timeout_kind: Option<TimeoutKind>,
    pub retry_rule: Option<String>,
    #[serde(flatten)]
    pub retry: Retry,
    /// The wait scheduled after this attempt, before the next one.
    pub wait_ms: Option<u64>,
    pub write_settlement: Option<WriteSettlement>,
    /// Present when a restore of the attempt's writes ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_restore: Option<WriteRestore>,
    pub usage: Usage,
    pub duration_ms: u64,
    pub lease: LeaseRecord,
    pub turns: Vec<TurnRecord>,
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
    pub stop_reason: crate::ledger::StopReason,
    pub disposition: crate::ledger::Disposition,
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
    pub tool_batch: crate::ledger::ToolBatch,
    pub usage: Usage,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TurnWire {
    turn: u32,
    status: TurnStatus,
    provider_retries: u32,
    replays: Vec<ReplayRecord>,
    tool_batch: crate::ledger::ToolBatch,
    usage: Usage,
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
        })
    }
}

impl TurnRecord {
    pub fn provider_retries(&self) -> u32 {
        u32::try_from(self.replays.len()).unwrap_or(u32::MAX)
    }
}

/// One in-turn replay: what failed, its class, and the wait before the identical request went
/// out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayRecord {
    #[serde(flatten)]
    pub cause: ReplayCause,
    pub provider_error_class: ProviderErrorClass,
    pub wait_ms: u64,
    pub retry_after_ms: Option<u64>,
}

/// What ended the replayed request: an HTTP status, or a fault with no status. The replay
/// driver's own type, recorded as it reported it (`status` or `fault`, flattened into the entry).
pub use docsfab_provider::ReplayCause;

/// How the operator reads a replay's cause: `HTTP 503`, or the fault's record name
/// (`connection-dropped`, `body-cut`, ...).
pub fn replay_cause_text(cause: ReplayCause) -> String {
    match cause {
        ReplayCause::Status(s) => format!("HTTP {s}"),
        ReplayCause::Fault(f) => serde_json::to_value(f)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "fault".to_owned()),
    }
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

/// The run record's JSON Schema (draft 2020-12), as shipped in `docs/run-record.schema.json`.
pub const SCHEMA: &str = include_str!("../../../docs/run-record.schema.json");

/// Why a value failed [`validate_against_schema`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaCheckError {
    #[error("the run-record schema itself is invalid: {0}")]
    BadSchema(String),
    #[error("the value does not match the run-record schema: {}", .0.join("; "))]
    Mismatch(Vec<String>),
}

/// Validates a serialized run record (or anything claiming to be one) against the shipped
/// schema. Every violation is listed with its JSON pointer.
pub fn validate_against_schema(value: &serde_json::Value) -> Result<(), SchemaCheckError> {
    let schema: serde_json::Value =
        serde_json::from_str(SCHEMA).map_err(|e| SchemaCheckError::BadSchema(e.to_string()))?;
    let validator = jsonschema::draft202012::new(&schema)
        .map_err(|e| SchemaCheckError::BadSchema(e.to_string()))?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{}: {}", e.instance_path(), e))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(SchemaCheckError::Mismatch(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants_as_rfc3339() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day) 12:34:56.789 UTC
        let t = UNIX_EPOCH + Duration::from_millis(951_827_696_789);
        assert_eq!(rfc3339_utc(t), "2000-02-29T12:34:56.789Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_980_000);
        assert_eq!(rfc3339_utc(t), "2026-11-29T19:20:00.000Z");
    }

    /// The record re-uses the step policy's types; their JSON must stay the record's spellings.
    #[test]
    fn policy_types_serialize_as_the_record_spells_them() {
        use serde_json::json;
        assert_eq!(
            json!([
                AttemptBudget::Initial,
                AttemptBudget::Contract,
                AttemptBudget::Transport
            ]),
            json!(["initial", "contract", "transport"])
        );
        for b in [
            AttemptBudget::Initial,
            AttemptBudget::Contract,
            AttemptBudget::Transport,
        ] {
            assert_eq!(json!(b), json!(b.as_str()));
        }
        for s in [
            AttemptStatus::Succeeded,
            AttemptStatus::Failed,
            AttemptStatus::Cancelled,
        ] {
            assert_eq!(json!(s), json!(s.as_str()));
        }
        for s in [
            TurnStatus::Completed,
            TurnStatus::Failed,
            TurnStatus::Cancelled,
        ] {
            assert_eq!(json!(s), json!(s.as_str()));
        }
        assert_eq!(
            json!([
                RetryDecision::None,
                RetryDecision::Scheduled,
                RetryDecision::Exhausted,
                RetryDecision::Terminal,
                RetryDecision::Declined
            ]),
            json!(["none", "scheduled", "exhausted", "terminal", "declined"])
        );
        assert_eq!(
            json!([TimeoutKind::AttemptDeadline, TimeoutKind::ProviderTimeout]),
            json!(["attempt-deadline", "provider-timeout"])
        );
        assert_eq!(replay_cause_text(ReplayCause::Status(503)), "HTTP 503");
        assert_eq!(
            replay_cause_text(ReplayCause::Fault(
                docsfab_policy::class::FaultKind::ConnectionDropped
            )),
            "connection-dropped"
        );
        let settlements = [
            WriteSettlement::NoWrite,
            WriteSettlement::WriteExecuted,
            WriteSettlement::Unavailable,
        ];
        assert_eq!(
            json!(settlements),
            json!(["no-write", "write-executed", "unavailable"])
        );
        for s in settlements {
            assert_eq!(json!(s), json!(s.as_str()));
        }
        let failure = StepFailure {
            category: "c".into(),
            failure_class: "f".into(),
            code: "x".into(),
            message: "m".into(),
            remediation: "r".into(),
        };
        assert_eq!(
            serde_json::to_string(&failure).ok().as_deref(),
            Some(
                r#"{"category":"c","failureClass":"f","code":"x","message":"m","remediation":"r"}"#
            )
        );
        let extra = r#"{"category":"c","failureClass":"f","code":"x","message":"m","remediation":"r","more":1}"#;
        assert!(serde_json::from_str::<StepFailure>(extra).is_err());
    }
}
