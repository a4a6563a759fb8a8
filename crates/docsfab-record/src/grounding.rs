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
    /// Each grounded line range the answer cited (`src/lib.rs:12-30`) with the SHA-256 of
    /// those lines as they were, so a later reader can tell which claims went stale. Absent
    /// when the answer cited none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<CitedLines>,
}

/// A line range an answer cited, as it was when judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CitedLines {
    /// The answer member it was in (`pages.2.markdown`).
    pub member: String,
    /// The citation as written: `src/lib.rs:12-30`.
    pub text: String,
    /// SHA-256 (hex) of the cited lines joined with `\n`.
    pub sha256: String,
}

impl GroundingRecord {
    /// Grounded over cited, the page's truthfulness; `None` when nothing was cited.
    pub fn share(&self) -> Option<f64> {
        (self.cited > 0).then(|| f64::from(self.grounded) / f64::from(self.cited))
    }
}

/// Grounded over cited: how much of what a step's answer cited is in the tree, and how many
/// unknown names the check caught before an answer was accepted. For a run, the sum over its
/// judged steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Truthfulness {
    /// Citations of the accepted answer (of the last judged one, for a step that failed).
    pub cited: u32,
    pub grounded: u32,
    /// `grounded / cited`, rounded to four places; `null` when nothing was cited.
    pub share: Option<f64>,
    /// Unknown names in the answers the check refused (`contract-ungrounded`): what it kept
    /// off the tree.
    pub caught: u32,
    /// The steps with a judged answer (1 for a step).
    pub steps: u32,
}

impl Truthfulness {
    fn new(cited: u32, grounded: u32, caught: u32, steps: u32) -> Truthfulness {
        let share =
            (cited > 0).then(|| (f64::from(grounded) / f64::from(cited) * 1e4).round() / 1e4);
        Truthfulness {
            cited,
            grounded,
            share,
            caught,
            steps,
        }
    }

    /// The figure of a step with a judged answer: the accepted (last) answer's citations, and
    /// the unknown names of every answer before it.
    pub fn of_step(step: &crate::StepRecord) -> Option<Truthfulness> {
        let judged: Vec<&GroundingRecord> = step
            .attempts
            .iter()
            .filter_map(|a| a.grounding.as_ref())
            .collect();
        let (last, refused) = judged.split_last()?;
        let accepted = step.status == crate::RunStatus::Succeeded;
        let refused: &[&GroundingRecord] = match accepted {
            true => refused,
            false => &judged,
        };
        let caught = refused
            .iter()
            .map(|g| u32::try_from(g.unknown.len()).unwrap_or(u32::MAX))
            .sum();
        Some(Truthfulness::new(last.cited, last.grounded, caught, 1))
    }

    /// The sum of the steps' figures; `None` when no step has one.
    pub fn of_run(steps: &[crate::StepRecord]) -> Option<Truthfulness> {
        let figures: Vec<Truthfulness> = steps.iter().filter_map(|s| s.truthfulness).collect();
        if figures.is_empty() {
            return None;
        }
        let sum = |f: fn(&Truthfulness) -> u32| figures.iter().map(f).sum::<u32>();
        let steps = u32::try_from(figures.len()).unwrap_or(u32::MAX);
        Some(Truthfulness::new(
            sum(|f| f.cited),
            sum(|f| f.grounded),
            sum(|f| f.caught),
            steps,
        ))
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
