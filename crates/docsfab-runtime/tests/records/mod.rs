//! Record fixtures shared by the run store suites (`store.rs` on SQLite, `store_pg.rs` on
//! PostgreSQL), so both backends are fed the same steps and attempts. A directory module:
//! cargo does not build it as a test of its own.
#![allow(dead_code)] // each suite uses a different part

use std::collections::BTreeMap;

use docsfab_record::*;
use docsfab_record::{Disposition, LeaseStop};
use docsfab_runtime::store::StepStart;

/// A read-only step's start.
pub fn step_start(id: &str) -> StepStart {
    step_start_with(id, Access::ReadOnly)
}

pub fn step_start_with(id: &str, access: Access) -> StepStart {
    StepStart {
        step_id: id.into(),
        access,
        configured_max_retries: 3,
        effective_max_retries: 2,
        transport_retry: TransportRetry {
            max_transport_retries: 6,
            transport_max_delay_ms: 60_000,
            transport_max_elapsed_ms: 3_600_000,
            base_delay_ms: 1000,
        },
    }
}

/// Attempt `n`: succeeded when `decision` is none, else failed with that retry decision.
pub fn attempt(n: u32, decision: RetryDecision) -> AttemptRecord {
    AttemptRecord {
        cost_usd: None,
        attempt: n,
        budget: if n == 1 {
            Budget::Initial
        } else {
            Budget::Transport
        },
        status: if decision == RetryDecision::None {
            AttemptStatus::Succeeded
        } else {
            AttemptStatus::Failed
        },
        started_at: rfc3339_utc(std::time::SystemTime::now()),
        provider_error_class: None,
        http_status: None,
        retry_after_ms: None,
        gateway: None,
        failure_category: None,
        failure_class: None,
        code: None,
        message: None,
        answer_excerpt: None,
        answer_bytes: None,
        timeout_kind: None,
        output_constraint: None,
        grounding: None,
        retry_rule: None,
        retry: Retry { decision },
        wait_ms: decision.is_scheduled().then_some(1000),
        write_settlement: None,
        write_restore: None,
        files_written: None,
        usage: Usage {
            input_tokens: Some(100 * u64::from(n)),
            output_tokens: Some(7),
            ..Usage::ZERO
        },
        duration_ms: 1234,
        lease: LeaseRecord {
            max_turns: 12,
            turns_used: 1,
            executed_tool_calls: 0,
            tool_counters: BTreeMap::new(),
            stop_reason: LeaseStop::ProviderFailed,
            disposition: Disposition::Failed,
            evidence: None,
        },
        turns: vec![],
    }
}
