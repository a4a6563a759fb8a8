//! Write settlement (WRT-1..3): may a failed attempt of a write step be retried?
//!
//! The host reads every tool batch of every turn of the attempt and reconciles it with the
//! execution lease's own count of executed calls and its per-tool counters. Only when all of it
//! agrees does the settlement say `no-write` or `write-executed`; a missing result, a batch
//! whose counts disagree with its calls, an executed or counted tool docsfab does not know, or
//! counters that disagree with the batches make it `unavailable`, and the failure stays terminal
//! as `declined-write-step`. Pure: it reads records, never the filesystem.

use std::collections::BTreeMap;

use docsfab_record::{AttemptRecord, CallOutcome, LeaseRecord, RecordedSettlement, ToolBatch};

use crate::tools::tool_named;

/// The settlement of an attempt, with why it is `unavailable` when it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub settlement: RecordedSettlement,
    /// What did not reconcile (`unavailable` only).
    pub reason: Option<String>,
}

impl Settlement {
    fn unavailable(reason: String) -> Settlement {
        Settlement {
            settlement: RecordedSettlement::Unavailable,
            reason: Some(reason),
        }
    }
}

/// Reconciles the batches of every turn, in order, with the lease.
pub fn settle<'a>(
    batches: impl IntoIterator<Item = &'a ToolBatch>,
    lease: &LeaseRecord,
) -> Settlement {
    let mut executed_total: u64 = 0;
    let mut per_tool: BTreeMap<&str, u64> = BTreeMap::new();
    let mut wrote = false;
    for (index, batch) in batches.into_iter().enumerate() {
        let turn = index + 1;
        if !batch.is_consistent() {
            return Settlement::unavailable(format!(
                "turn {turn}: the tool batch's counts disagree with its calls or a result is \
                 missing"
            ));
        }
        for call in &batch.calls {
            if let CallOutcome::Executed { .. } = call.outcome {
                let Some(tool) = tool_named(&call.tool) else {
                    return Settlement::unavailable(format!(
                        "turn {turn}: an executed call names the unknown tool {:?}",
                        call.tool
                    ));
                };
                wrote |= tool.writes();
                executed_total += 1;
                *per_tool.entry(tool.name()).or_insert(0) += 1;
            }
        }
    }
    if executed_total != u64::from(lease.executed_tool_calls) {
        return Settlement::unavailable(format!(
            "the batches record {executed_total} executed calls, the lease {}",
            lease.executed_tool_calls
        ));
    }
    let mut counted_total: u64 = 0;
    for (name, count) in &lease.tool_counters {
        if tool_named(name).is_none() {
            return Settlement::unavailable(format!("the lease counts the unknown tool {name:?}"));
        }
        counted_total += u64::from(*count);
        if per_tool.get(name.as_str()).copied().unwrap_or(0) != u64::from(*count) {
            return Settlement::unavailable(format!(
                "the lease counts {count} {name} calls, the batches {}",
                per_tool.get(name.as_str()).copied().unwrap_or(0)
            ));
        }
    }
    if counted_total != executed_total {
        return Settlement::unavailable(format!(
            "the per-tool counters sum to {counted_total}, the batches record {executed_total}"
        ));
    }
    Settlement {
        settlement: if wrote {
            RecordedSettlement::WriteExecuted
        } else {
            RecordedSettlement::NoWrite
        },
        reason: None,
    }
}

/// Settles a recorded attempt: its turns must also be the turns its lease used.
pub fn settle_attempt(attempt: &AttemptRecord) -> Settlement {
    let turns = attempt.turns.len();
    if u32::try_from(turns).ok() != Some(attempt.lease.turns_used) {
        return Settlement::unavailable(format!(
            "the attempt records {turns} turns, its lease {}",
            attempt.lease.turns_used
        ));
    }
    settle(attempt.turns.iter().map(|t| &t.tool_batch), &attempt.lease)
}
