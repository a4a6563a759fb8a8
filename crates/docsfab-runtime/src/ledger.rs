//! The tool ledger, the turn governor and the execution lease (LSE-1..LSE-3).
//!
//! Everything here is a pure state machine: the agent loop does the I/O (provider calls, tool
//! execution, preflight checks) and reports what happened; the lease decides whether another
//! provider turn may be requested. Per turn the loop calls:
//!
//! 1. [`ExecutionLease::begin_turn`] with the result of the host preflight. It counts the
//!    provider turn (an in-turn replay is below this and never calls it again, REP-11) or ends
//!    the lease.
//! 2. For each tool call of the response, in order: a rejection before host authorization
//!    ([`BatchBuilder::reject`]), a refusal by host authorization ([`BatchBuilder::refuse`]), or
//!    an execution: [`ExecutionLease::authorize`] then [`BatchBuilder::start`] and, once the tool
//!    returned, [`BatchBuilder::finish`].
//! 3. [`ExecutionLease::checkpoint`] with the built [`ToolBatch`]: renew (request another turn)
//!    or stop, keeping the stop reason and disposition.
//!
//! The lease counts executions when it authorizes them and the batch records their results, so
//! the two are independent evidence; the checkpoint and write settlement reconcile them.

use std::collections::BTreeMap;

use docsfab_record::{CallOutcome, Disposition, LeaseRecord, LeaseStop, ToolBatch, ToolCallEntry};

use crate::composition::Tool;

use docsfab_record::{CallResult, RejectReason};

/// Identifies a started execution inside a [`BatchBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSlot(usize);

/// Builds one turn's [`ToolBatch`] as the calls are decided and run; the counts follow the calls
/// by construction.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    calls: Vec<ToolCallEntry>,
}

impl BatchBuilder {
    pub fn new() -> Self {
        BatchBuilder::default()
    }

    pub fn reject(&mut self, id: &str, tool: &str, reason: RejectReason, detail: &str) {
        self.push(
            id,
            tool,
            CallOutcome::Rejected {
                reason,
                detail: detail.to_owned(),
            },
        );
    }

    pub fn refuse(&mut self, id: &str, tool: &str, detail: &str) {
        self.push(
            id,
            tool,
            CallOutcome::Refused {
                detail: detail.to_owned(),
            },
        );
    }

    /// Records that an authorized call is about to run; its result is missing until
    /// [`BatchBuilder::finish`] is called.
    pub fn start(&mut self, id: &str, tool: Tool) -> CallSlot {
        self.push(id, tool.name(), CallOutcome::Executed { result: None });
        CallSlot(self.calls.len() - 1)
    }

    pub fn finish(&mut self, slot: CallSlot, result: CallResult) {
        if let Some(entry) = self.calls.get_mut(slot.0) {
            entry.outcome = CallOutcome::Executed {
                result: Some(result),
            };
        }
    }

    pub fn build(self) -> ToolBatch {
        let executed = self
            .calls
            .iter()
            .filter(|c| matches!(c.outcome, CallOutcome::Executed { .. }))
            .count();
        let requested = self.calls.len();
        ToolBatch {
            requested: saturating_u32(requested),
            rejected: saturating_u32(requested - executed),
            executed: saturating_u32(executed),
            calls: self.calls,
        }
    }

    fn push(&mut self, id: &str, tool: &str, outcome: CallOutcome) {
        self.calls.push(ToolCallEntry {
            id: id.to_owned(),
            tool: tool.to_owned(),
            outcome,
        });
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A failed host preflight, with its diagnostic evidence (LSE-2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host preflight failed: {evidence}")]
pub struct PreflightFailure {
    pub evidence: String,
}

/// How a lease ended: kept by the terminal lease for diagnosis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEnd {
    pub stop_reason: LeaseStop,
    pub disposition: Disposition,
    pub evidence: Option<String>,
}

impl LeaseEnd {
    fn new(stop_reason: LeaseStop, evidence: Option<String>) -> LeaseEnd {
        LeaseEnd {
            stop_reason,
            disposition: stop_reason.disposition(),
            evidence,
        }
    }
}

/// What the loop reports at the end of a turn. The assistant's text is carried for the record
/// only: the checkpoint never reads it, so no model output can authorize renewal (LSE-3).
#[derive(Debug, Clone, Copy)]
pub struct TurnEvidence<'a> {
    pub batch: &'a ToolBatch,
    /// Read supervision's verdict after this turn's calls.
    pub no_progress: bool,
    pub assistant_text: &'a str,
}

/// The checkpoint's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkpoint {
    /// Request another provider turn.
    Renew,
    /// Do not request another turn.
    Stop(LeaseEnd),
}

/// Refused to authorize a tool execution.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorizeError {
    #[error("the execution lease has ended")]
    LeaseEnded,
    #[error("no provider turn is open")]
    NoOpenTurn,
}

/// The execution lease of one attempt: the turn governor plus the host's own count of executed
/// tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionLease {
    max_turns: u32,
    turns_used: u32,
    executed: u32,
    executed_this_turn: u32,
    counters: BTreeMap<String, u32>,
    turn_open: bool,
    end: Option<LeaseEnd>,
}

impl ExecutionLease {
    pub fn new(max_turns: u32) -> ExecutionLease {
        ExecutionLease {
            max_turns,
            turns_used: 0,
            executed: 0,
            executed_this_turn: 0,
            counters: BTreeMap::new(),
            turn_open: false,
            end: None,
        }
    }

    pub fn turns_used(&self) -> u32 {
        self.turns_used
    }

    pub fn executed_tool_calls(&self) -> u32 {
        self.executed
    }

    pub fn end(&self) -> Option<&LeaseEnd> {
        self.end.as_ref()
    }

    /// Opens the next provider turn after the host preflight. Returns the 1-based turn number,
    /// or how the lease ended: a failed preflight ends it with its evidence (LSE-2), and no turn
    /// beyond `maxTurns` is ever granted.
    pub fn begin_turn(&mut self, preflight: Result<(), PreflightFailure>) -> Result<u32, LeaseEnd> {
        if let Some(end) = &self.end {
            return Err(end.clone());
        }
        if let Err(failure) = preflight {
            return Err(self.stop(LeaseStop::PreflightFailed, Some(failure.evidence)));
        }
        if self.turns_used >= self.max_turns {
            return Err(self.stop(LeaseStop::MaxTurns, None));
        }
        self.turns_used += 1;
        self.executed_this_turn = 0;
        self.turn_open = true;
        Ok(self.turns_used)
    }

    /// Counts one tool execution before it runs. Only an open turn of a live lease may execute.
    pub fn authorize(&mut self, tool: Tool) -> Result<(), AuthorizeError> {
        if self.end.is_some() {
            return Err(AuthorizeError::LeaseEnded);
        }
        if !self.turn_open {
            return Err(AuthorizeError::NoOpenTurn);
        }
        self.executed = self.executed.saturating_add(1);
        self.executed_this_turn = self.executed_this_turn.saturating_add(1);
        *self.counters.entry(tool.name().to_owned()).or_insert(0) += 1;
        Ok(())
    }

    /// Decides, at the end of a turn, whether another provider turn may be requested.
    ///
    /// Renewal rests on executed-call evidence only: the batch must be consistent and its
    /// executed count must equal what this lease authorized in the turn. A turn whose calls
    /// were all rejected still used its turn and may be followed by another (LSE-1).
    pub fn checkpoint(&mut self, evidence: TurnEvidence<'_>) -> Checkpoint {
        if let Some(end) = &self.end {
            return Checkpoint::Stop(end.clone());
        }
        self.turn_open = false;
        let batch = evidence.batch;
        if !batch.is_consistent() {
            return Checkpoint::Stop(self.stop(
                LeaseStop::RenewalRefused,
                Some("the turn's tool batch is inconsistent or misses a result".to_owned()),
            ));
        }
        if batch.executed != self.executed_this_turn {
            return Checkpoint::Stop(self.stop(
                LeaseStop::RenewalRefused,
                Some(format!(
                    "the lease authorized {} tool executions this turn but the batch records {}",
                    self.executed_this_turn, batch.executed
                )),
            ));
        }
        if evidence.no_progress {
            return Checkpoint::Stop(self.stop(LeaseStop::NoProgress, None));
        }
        if batch.requested == 0 {
            return Checkpoint::Stop(self.stop(LeaseStop::Answered, None));
        }
        if self.turns_used >= self.max_turns {
            return Checkpoint::Stop(self.stop(LeaseStop::MaxTurns, None));
        }
        Checkpoint::Renew
    }

    /// Ends the lease for a reason found outside the checkpoint (provider failure, deadline,
    /// cancellation, a host failure while a tool ran). The first end wins.
    pub fn stop(&mut self, reason: LeaseStop, evidence: Option<String>) -> LeaseEnd {
        self.turn_open = false;
        self.end
            .get_or_insert_with(|| LeaseEnd::new(reason, evidence))
            .clone()
    }

    /// The record of a lease that has ended; `None` while it is live.
    pub fn record(&self) -> Option<LeaseRecord> {
        let end = self.end.as_ref()?;
        Some(LeaseRecord {
            max_turns: self.max_turns,
            turns_used: self.turns_used,
            executed_tool_calls: self.executed,
            tool_counters: self.counters.clone(),
            stop_reason: end.stop_reason,
            disposition: end.disposition,
            evidence: end.evidence.clone(),
        })
    }
}
