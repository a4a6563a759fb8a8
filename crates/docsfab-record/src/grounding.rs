//! What an attempt's answer cited and what of it the workspace did not hold
//! (`contract.grounding`, docs/grounding.md).

use serde::{Deserialize, Serialize};

/// The grounding of one judged answer. `cited` counts grounded and unknown citations; names of
/// the standard library or a declared dependency are `external`, counted apart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroundingRecord {
    pub cited: u32,
    pub grounded: u32,
    pub external: u32,
    pub unknown: Vec<UnknownCitation>,
}

impl GroundingRecord {
    /// Grounded over cited, the page's truthfulness; `None` when nothing was cited.
    pub fn share(&self) -> Option<f64> {
        (self.cited > 0).then(|| f64::from(self.grounded) / f64::from(self.cited))
    }
}

/// One citation the workspace does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnknownCitation {
    /// The answer member it was in, as a concrete path (`pages.2.markdown`).
    pub member: String,
    pub text: String,
    /// `path`, `identifier`, `link` or `line-range`.
    pub kind: String,
    /// 1-based line within the member's text.
    pub line: u32,
    /// The nearest real names, nearest first (at most three).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nearest: Vec<String>,
}
