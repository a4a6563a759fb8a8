//! The rows both backends keep, turned into records (and back) in one place: the columns are
//! the same in SQLite and PostgreSQL, only the SQL that reads and writes them differs.

use super::{RunListing, StoreError, from_json, parse_status, resumed_from};
use crate::snapshot::WrittenFile;
use crate::written::{Kept, Side, StoredWrite, under_run_cap};
use docsfab_record::{RunContext, RunRecord, RunStatus, RunSummary, StepRecord};

/// A run's `runs` row as `load_run` reads it, before its steps.
pub(super) struct RunHead {
    pub composition: String,
    pub status: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub context: Option<String>,
    pub end_reason: Option<String>,
}

impl RunHead {
    /// The stored context. A run created before the store kept contexts has none: its fields
    /// read as null.
    pub fn context(&self) -> Result<Option<RunContext>, StoreError> {
        self.context.as_deref().map(from_json).transpose()
    }

    /// The run's record with its `context` (from [`RunHead::context`]) and `steps`, its totals
    /// summed.
    pub fn into_record(
        self,
        run_id: &str,
        context: Option<RunContext>,
        steps: Vec<StepRecord>,
    ) -> Result<RunRecord, StoreError> {
        let mut record = RunRecord {
            run_id: run_id.to_owned(),
            composition: self.composition,
            status: parse_status(&self.status)?,
            started_at: self.started_at,
            ended_at: self.ended_at,
            workspace: context.as_ref().map(|c| c.workspace.clone()),
            model: context.as_ref().map(|c| c.model.clone()),
            docsfab_version: context.as_ref().map(|c| c.docsfab_version.clone()),
            resumed_from: context.as_ref().and_then(|c| c.resumed_from.clone()),
            provider: context.map(|c| c.provider),
            held_ms: 0,
            usage: docsfab_record::Usage::ZERO,
            cost_usd: None,
            truthfulness: None,
            end_reason: self.end_reason,
            steps,
        };
        record.sum_totals();
        Ok(record)
    }
}

/// A `steps` row: its record, with the `status` column standing for the step's status.
pub(super) fn step_record(status: &str, record: &str) -> Result<StepRecord, StoreError> {
    let mut step: StepRecord = from_json(record)?;
    step.status = parse_status(status)?;
    Ok(step)
}

/// The step's stored record, refused when the step already ended.
pub(super) fn still_running(step: StepRecord) -> Result<StepRecord, StoreError> {
    if step.status != RunStatus::Running {
        return Err(StoreError::StepFinished {
            step_id: step.step_id,
            status: step.status.as_str(),
        });
    }
    Ok(step)
}

/// The rows of `SELECT status, COUNT(*) FROM runs GROUP BY status` as every status in
/// [`RunStatus::ALL`] order, zeros included (a metrics page shows each one).
pub(super) fn status_counts<S: AsRef<str>>(
    rows: impl IntoIterator<Item = (S, i64)>,
) -> Result<Vec<(RunStatus, u64)>, StoreError> {
    let mut counts: Vec<(RunStatus, u64)> = RunStatus::ALL.into_iter().map(|s| (s, 0)).collect();
    for (status, n) in rows {
        let status = parse_status(status.as_ref())?;
        if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == status) {
            slot.1 = u64::try_from(n).unwrap_or(0);
        }
    }
    Ok(counts)
}

/// A row of the `runs list` query: the run's columns and the figures counted for it.
pub(super) struct ListingRow {
    pub run_id: String,
    pub composition: String,
    pub status: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub steps: i64,
    pub attempts: i64,
    /// From start to end in milliseconds; `None` while the run has not ended.
    pub duration_ms: Option<i64>,
    pub context: Option<String>,
}

impl ListingRow {
    pub fn into_listing(self) -> Result<RunListing, StoreError> {
        Ok(RunListing {
            summary: RunSummary {
                status: parse_status(&self.status)?,
                resumed_from: resumed_from(self.context.as_deref()),
                run_id: self.run_id,
                composition: self.composition,
                started_at: self.started_at,
                ended_at: self.ended_at,
            },
            steps: u64::try_from(self.steps).unwrap_or(0),
            attempts: u64::try_from(self.attempts).unwrap_or(0),
            // A clock stepped backwards could make it negative: shown as zero, not wrapped.
            duration_ms: self.duration_ms.map(|d| u64::try_from(d).unwrap_or(0)),
        })
    }
}

/// A `written_files` row to insert: one file a recorded attempt changed.
pub(super) struct NewWritten<'f> {
    /// 1 for the attempt's first file.
    pub seq: u32,
    pub file: &'f WrittenFile,
    pub kept: Kept,
    pub bytes_before: i64,
    pub bytes_after: i64,
    /// The contents, kept only as text.
    pub before: Option<Vec<u8>>,
    pub after: Option<Vec<u8>>,
}

/// The rows of an attempt's `files`, given the content bytes the run has stored already
/// (`used`): a file's contents are kept when [`crate::written::classify`] says text and the run
/// stays within [`crate::written::MAX_RUN_BYTES`] ([`under_run_cap`]).
pub(super) fn new_written(used: u64, files: &[(WrittenFile, Kept)]) -> Vec<NewWritten<'_>> {
    let bytes = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    (1..)
        .zip(files.iter().zip(under_run_cap(used, files)))
        .map(|(seq, ((file, _), kept))| {
            let keep =
                |side: &Option<Vec<u8>>| (kept == Kept::Text).then(|| side.clone()).flatten();
            NewWritten {
                seq,
                file,
                kept,
                bytes_before: bytes(file.bytes_before()),
                bytes_after: bytes(file.after.as_ref().map_or(0, |b| b.len() as u64)),
                before: keep(&file.before),
                after: keep(&file.after),
            }
        })
        .collect()
}

/// A `written_files` row as read back.
pub(super) struct WrittenRow {
    pub step_index: u32,
    pub attempt: u32,
    pub path: String,
    pub kept: String,
    pub before: StoredSide,
    pub after: StoredSide,
}

/// One side of a `written_files` row: `sha256_*`, `bytes_*` and the kept contents.
pub(super) struct StoredSide {
    pub sha256: Option<String>,
    pub bytes: i64,
    pub content: Option<Vec<u8>>,
}

impl WrittenRow {
    pub fn into_write(self) -> Result<StoredWrite, StoreError> {
        let kept = Kept::parse(&self.kept).ok_or_else(|| {
            StoreError::Corrupt(format!("unknown written-file kind {:?}", self.kept))
        })?;
        let path = self.path;
        let side = |stored: StoredSide| -> Result<Side, StoreError> {
            let text = stored
                .content
                .map(String::from_utf8)
                .transpose()
                .map_err(|_| StoreError::Corrupt(format!("stored text of {path} is not UTF-8")))?;
            Ok(Side {
                sha256: stored.sha256,
                bytes: u64::try_from(stored.bytes).unwrap_or(0),
                text,
            })
        };
        Ok(StoredWrite {
            before: side(self.before)?,
            after: side(self.after)?,
            step_index: self.step_index,
            attempt: self.attempt,
            path,
            kept,
        })
    }
}
