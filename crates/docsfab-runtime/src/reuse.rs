//! Carrying a step's result over from an earlier run (`docsfab runs resume`, `docsfab run
//! --reuse`) instead of asking the provider again, and the proof that it still holds.
//!
//! A step of the earlier run (the *reference*) may stand in for a step of this run when:
//! - it succeeded, and its record keeps its `fingerprint` and its `inputs`;
//! - its fingerprint equals this step's: the same rendered instructions, step settings,
//!   sealed limits, provider, model and docsfab version ([`fingerprint`]);
//! - everything its accepted attempt looked at still looks the same, and every file it wrote is
//!   still as it left it ([`Reference::changed`]).
//!
//! The tree is judged against the one the reference run *left*, not the one the step saw: files
//! the reference run itself wrote after the step (later steps' documents, a sibling instance's
//! page) are the composition's own output, expected as that run left them. A listing is expected
//! to show what it showed plus what the run created later under it; a read file written later by
//! the run is expected as the run left it. Anything else that differs is a change, and the step
//! runs again. Every doubt falls on the side of running again: a mismatch never reuses.

use std::collections::{BTreeSet, HashMap, HashSet};

use docsfab_record::{RunRecord, RunStatus, StepInput, StepLink, StepRecord, WriteRestore};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::composition::{ModelLimits, Step};
use crate::observed::{file_sha256, listing};
use crate::workspace::SKIPPED_DIRS;
use crate::workspace::Workspace;

/// What a step is asked with, hashed into its fingerprint. Its id and line are left out (a step
/// moved in the file asks the same question); `forEach`'s concurrency too.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Asked<'a> {
    version: &'a str,
    provider: &'a str,
    api: &'a str,
    model: &'a str,
    access: docsfab_record::Access,
    tools: Vec<&'a str>,
    contract: &'a Option<crate::composition::Contract>,
    write_roots: &'a [String],
    limits: &'a ModelLimits,
    instructions: &'a str,
}

/// Who a step asks: the provider (its host.yaml name and API) and the model.
#[derive(Debug, Clone, Copy)]
pub struct Asking<'a> {
    pub provider: &'a str,
    pub api: docsfab_record::Api,
    pub model: &'a str,
}

/// The SHA-256 (hex) of what `step` is asked with `instructions` rendered.
pub fn fingerprint(
    step: &Step,
    instructions: &str,
    limits: &ModelLimits,
    asking: Asking<'_>,
) -> String {
    let asked = Asked {
        version: env!("CARGO_PKG_VERSION"),
        provider: asking.provider,
        api: asking.api.as_str(),
        model: asking.model,
        access: step.access,
        tools: step.tools.iter().map(|t| t.name()).collect(),
        contract: &step.contract,
        write_roots: &step.write_roots,
        limits,
        instructions,
    };
    let json = serde_json::to_vec(&asked).unwrap_or_default();
    hex::encode(Sha256::digest(&json))
}

/// How a path was left by the reference run's last write to it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Left {
    /// A regular file with this SHA-256, or nothing (`None`).
    As(Option<String>),
    /// An interrupted write named it; what it holds is not known.
    Unknown,
}

/// The last write of the reference run to a path: the group it came from and how it left it.
#[derive(Debug, Clone)]
struct LastWrite {
    group: usize,
    /// The record index of the step that wrote it.
    step: usize,
    left: Left,
}

/// The earlier run whose succeeded steps this run may reuse.
#[derive(Debug, Clone)]
pub struct Reference {
    run_id: String,
    steps: Vec<StepRecord>,
    /// Per record step: its group (a step and all its fan-out instances are one group), in the
    /// order groups first appear.
    group_of: Vec<usize>,
    groups: Vec<String>,
    writes: HashMap<String, LastWrite>,
    /// Interrupted writes are taken as the workspace now holds them (`--accept-workspace`).
    accept_workspace: bool,
}

/// A path of the workspace that no longer looks as a reused step needs it to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Changed {
    /// The step of the reference run that depends on it.
    pub step_id: String,
    pub path: String,
}

/// The current state of paths, each read once per judgement.
#[derive(Default)]
pub struct Looks {
    files: HashMap<String, Option<String>>,
    listings: HashMap<String, Option<Vec<String>>>,
}

impl Looks {
    fn file(&mut self, ws: &Workspace, path: &str) -> Option<String> {
        self.files
            .entry(path.to_owned())
            .or_insert_with(|| file_sha256(ws, path))
            .clone()
    }
    fn listing(&mut self, ws: &Workspace, path: &str) -> Option<Vec<String>> {
        self.listings
            .entry(path.to_owned())
            .or_insert_with(|| listing(ws, path))
            .clone()
    }
}

impl Reference {
    /// The reference of `record`. With `accept_workspace`, files an interrupted write named are
    /// expected as they are now.
    pub fn new(record: &RunRecord, accept_workspace: bool) -> Reference {
        let mut groups: Vec<String> = Vec::new();
        let mut group_of = Vec::with_capacity(record.steps.len());
        for step in &record.steps {
            let name = group_name(step);
            let at = groups.iter().position(|g| *g == name).unwrap_or_else(|| {
                groups.push(name.to_owned());
                groups.len() - 1
            });
            group_of.push(at);
        }
        let mut reference = Reference {
            run_id: record.run_id.clone(),
            steps: record.steps.clone(),
            group_of,
            groups,
            writes: HashMap::new(),
            accept_workspace,
        };
        reference.writes = reference.last_writes();
        reference
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Every write the record knows, in record order; the last one to a path wins.
    fn last_writes(&self) -> HashMap<String, LastWrite> {
        let mut writes = HashMap::new();
        for (at, step) in self.steps.iter().enumerate() {
            let group = self.group_of[at];
            let mut put = |path: &str, left: Left| {
                writes.insert(
                    path.to_owned(),
                    LastWrite {
                        group,
                        step: at,
                        left,
                    },
                );
            };
            for file in step.files_written.iter().flatten() {
                put(&file.path, Left::As(file.sha256_after.clone()));
            }
            for attempt in &step.attempts {
                let restored = attempt.write_restore == Some(WriteRestore::Restored);
                for file in attempt.files_written.iter().flatten() {
                    let left = if restored {
                        file.sha256_before.clone()
                    } else {
                        file.sha256_after.clone()
                    };
                    put(&file.path, Left::As(left));
                }
            }
            for intent in step
                .interrupted_attempt
                .iter()
                .flat_map(|i| &i.write_intents)
            {
                put(&intent.path, Left::Unknown);
            }
        }
        writes
    }

    /// The record index of a succeeded step of group `group` asked as `fingerprint`, not in
    /// `taken`, whose result can be carried over.
    pub fn candidate(
        &self,
        group: &str,
        fingerprint: &str,
        taken: &HashSet<usize>,
    ) -> Option<usize> {
        self.steps.iter().enumerate().position(|(at, step)| {
            !taken.contains(&at)
                && group_name(step) == group
                && step.status == RunStatus::Succeeded
                && step.inputs.is_some()
                && step.fingerprint.as_deref() == Some(fingerprint)
        })
    }

    /// The record indexes of the steps whose results could be carried over: succeeded, with
    /// their fingerprint and inputs kept.
    pub fn finished(&self) -> impl Iterator<Item = usize> + '_ {
        self.steps.iter().enumerate().filter_map(|(at, step)| {
            (step.status == RunStatus::Succeeded
                && step.inputs.is_some()
                && step.fingerprint.is_some())
            .then_some(at)
        })
    }

    /// The reference step at record index `at`.
    pub fn step(&self, at: usize) -> &StepRecord {
        &self.steps[at]
    }

    /// The output of the reference's step `step_id` when it succeeded (the last such step, for
    /// a run that was itself resumed).
    pub fn succeeded_output(&self, step_id: &str) -> Option<&serde_json::Value> {
        self.steps
            .iter()
            .rev()
            .find(|s| s.step_id == step_id && s.status == RunStatus::Succeeded)?
            .output
            .as_ref()
    }

    /// Where a reused step's attempts are: the run that ran it (an earlier reuse points on).
    pub fn origin(&self, at: usize) -> StepLink {
        let step = &self.steps[at];
        step.reused_from.clone().unwrap_or_else(|| StepLink {
            run_id: self.run_id.clone(),
            step_id: step.step_id.clone(),
        })
    }

    /// The paths that changed under reference step `at` since the reference run left them;
    /// empty when its result still holds.
    pub fn changed(&self, ws: &Workspace, at: usize, looks: &mut Looks) -> Vec<Changed> {
        let step = &self.steps[at];
        let own: HashSet<&str> = step
            .result_files()
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        let mut changed = BTreeSet::new();
        for input in step.inputs.iter().flatten() {
            if own.contains(input.path()) {
                continue;
            }
            if !self.input_holds(ws, at, input, looks) {
                changed.insert(input.path().to_owned());
            }
        }
        for file in step.result_files() {
            let holds = match self.writes.get(&file.path) {
                // A later step wrote it again: that step answers for it.
                Some(w) if w.step != at => true,
                _ => looks.file(ws, &file.path) == file.sha256_after,
            };
            if !holds {
                changed.insert(file.path.clone());
            }
        }
        changed
            .into_iter()
            .map(|path| Changed {
                step_id: step.step_id.clone(),
                path,
            })
            .collect()
    }

    /// Whether `input` of reference step `at` looks now as the reference run left it.
    fn input_holds(&self, ws: &Workspace, at: usize, input: &StepInput, looks: &mut Looks) -> bool {
        let group = self.group_of[at];
        match input {
            StepInput::File { path, sha256 } => match self.writes.get(path) {
                Some(w) if w.group >= group => match &w.left {
                    Left::As(left) => looks.file(ws, path) == *left,
                    Left::Unknown => self.accept_workspace,
                },
                _ => looks.file(ws, path) == *sha256,
            },
            StepInput::Listing { path, entries } => {
                let now = looks.listing(ws, path);
                match (entries, now) {
                    (None, None) => true,
                    (Some(seen), Some(now)) => {
                        self.expected_listing(ws, group, path, seen, looks)
                            == now.into_iter().collect()
                    }
                    _ => false,
                }
            }
        }
    }

    /// What a listing of `dir` seen as `seen` by a step of `group` shows once the reference run
    /// ended: what it saw, plus what the run created under it from that group on.
    fn expected_listing(
        &self,
        ws: &Workspace,
        group: usize,
        dir: &str,
        seen: &[String],
        looks: &mut Looks,
    ) -> BTreeSet<String> {
        let mut expected: BTreeSet<String> = seen.iter().cloned().collect();
        for (path, write) in &self.writes {
            if write.group < group || !under(dir, path) || skipped(path) {
                continue;
            }
            let present = match &write.left {
                Left::As(left) => left.is_some(),
                Left::Unknown => self.accept_workspace && looks.file(ws, path).is_some(),
            };
            if present {
                expected.insert(path.clone());
                for parent in parents(dir, path) {
                    expected.insert(format!("{parent}/"));
                }
            }
        }
        expected
    }

    /// The files interrupted writes named that do not look as the record leaves them: the
    /// attempt was killed after (or while) writing them, so what they hold is nobody's result.
    pub fn unaccounted(&self, ws: &Workspace) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (at, step) in self.steps.iter().enumerate() {
            for intent in step
                .interrupted_attempt
                .iter()
                .flat_map(|i| &i.write_intents)
            {
                if self.left_before(at, &intent.path) != file_sha256(ws, &intent.path) {
                    out.insert(intent.path.clone());
                }
            }
        }
        out.into_iter().collect()
    }

    /// How the record says `path` was left before step `at`'s interrupted attempt (its SHA-256,
    /// `None` for absent): by the last recorded write, else as a step first saw it, else absent
    /// (never written nor seen: it was not there, or the record cannot say what it held).
    fn left_before(&self, at: usize, path: &str) -> Option<String> {
        let mut left: Option<Option<String>> = None;
        for step in &self.steps[..=at] {
            for input in step.inputs.iter().flatten() {
                if let StepInput::File { path: p, sha256 } = input
                    && p == path
                    && left.is_none()
                {
                    left = Some(sha256.clone());
                }
            }
            for file in step.files_written.iter().flatten() {
                if file.path == path {
                    left = Some(file.sha256_after.clone());
                }
            }
            for attempt in &step.attempts {
                let restored = attempt.write_restore == Some(WriteRestore::Restored);
                for file in attempt
                    .files_written
                    .iter()
                    .flatten()
                    .filter(|f| f.path == path)
                {
                    left = Some(if restored {
                        file.sha256_before.clone()
                    } else {
                        file.sha256_after.clone()
                    });
                }
            }
        }
        left.unwrap_or(None)
    }

    /// The groups of the reference run, in order (a step id, or a fan-out step's id).
    pub fn groups(&self) -> &[String] {
        &self.groups
    }
}

/// A step's group: its own id, or for a fan-out instance the fan-out step's.
pub fn group_name(step: &StepRecord) -> &str {
    step.for_each
        .as_ref()
        .map_or(step.step_id.as_str(), |f| f.step.as_str())
}

/// Whether workspace-relative `path` lies under directory `dir` (`""` is the root).
fn under(dir: &str, path: &str) -> bool {
    dir.is_empty()
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether a listing leaves `path` out (it lies in a directory the walk skips).
fn skipped(path: &str) -> bool {
    path.split('/').any(|part| SKIPPED_DIRS.contains(&part))
}

/// The directories between `dir` and `path`, e.g. `docs/api` and `docs/api/x` for
/// `docs/api/x/y.md` under `docs`.
fn parents(dir: &str, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(slash) = path[at..].find('/') {
        let parent = &path[..at + slash];
        if parent.len() > dir.len() {
            out.push(parent.to_owned());
        }
        at += slash + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_the_directories_below_the_listed_one() {
        assert_eq!(
            parents("docs", "docs/api/x/y.md"),
            ["docs/api", "docs/api/x"]
        );
        assert_eq!(parents("", "docs/y.md"), ["docs"]);
        assert!(parents("docs", "docs/y.md").is_empty());
    }

    #[test]
    fn under_means_inside_the_directory_not_a_name_prefix() {
        assert!(under("", "a/b"));
        assert!(under("src", "src/a.rs"));
        assert!(!under("src", "srcs/a.rs"));
        assert!(!under("src", "src"));
    }
}
