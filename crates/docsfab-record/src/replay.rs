//! An in-turn replay as the record keeps it: what ended the replayed request and the wait.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::class::{FaultKind, ProviderErrorClass};

/// What failed in a request that was replayed: the HTTP status when a response head arrived,
/// otherwise the fault. Serialized flat into the entry as `status` or `fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReplayCause {
    Status(u16),
    Fault(FaultKind),
}

/// One in-turn replay: what failed, its class, and the wait before the identical request went
/// out again: the policy's `waitMs`, then the shared throttle's `heldMs`. Their sum is the gap
/// on the wire between the failed request and its replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayRecord {
    #[serde(flatten)]
    pub cause: ReplayCause,
    pub provider_error_class: ProviderErrorClass,
    pub wait_ms: u64,
    pub retry_after_ms: Option<u64>,
    /// Time the throttle held the replay after its wait (0 before issue 20's records).
    #[serde(default)]
    pub held_ms: u64,
}

/// How the operator reads a replay's cause: `HTTP 503`, or the fault's record name
/// (`connection-dropped`, `body-cut`, ...). The one rendering, for progress and the route's log.
impl fmt::Display for ReplayCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayCause::Status(s) => write!(f, "HTTP {s}"),
            ReplayCause::Fault(fault) => f.write_str(fault.as_str()),
        }
    }
}
