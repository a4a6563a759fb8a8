//! `docsfab runs diff ID [--stat]`: everything a run wrote, as one unified diff.
//!
//! The run store keeps, for every file a succeeded write attempt changed, its content before
//! the attempt's first write and when the attempt ended (bounded: `docsfab_runtime::written`).
//! Per path, the diff goes from the first kept before-content to the last kept after-content
//! across the run, so a file two steps rewrote shows once. Headers are git's (`--- a/PATH`,
//! `+++ b/PATH`, `/dev/null` for a created file) with 3 lines of context, so `git apply` and
//! `patch -p1` take the output as it is. A file whose contents were not kept (binary, too
//! large, holding a credential, over the run's cap) is one line saying so.

use std::collections::HashMap;
use std::fmt::Write as _;

use docsfab_record::{Access, AttemptStatus, RunRecord};
use docsfab_runtime::written::{Kept, MAX_RUN_BYTES, MAX_SIDE_BYTES, Side, StoredWrite};
use similar::{ChangeTag, TextDiff};

/// Lines of context around each change, as git and GNU diff use by default.
const CONTEXT: usize = 3;
/// The widest `+++--` bar `--stat` draws; longer ones are scaled down, as git does.
const MAX_BAR: usize = 50;

/// One path the run changed: where its first kept before-content and last after-content are.
struct PathChange<'a> {
    path: &'a str,
    first: &'a StoredWrite,
    last: &'a StoredWrite,
}

impl PathChange<'_> {
    fn before(&self) -> &Side {
        &self.first.before
    }
    fn after(&self) -> &Side {
        &self.last.after
    }
    /// Why the contents cannot be shown, or `None` when both ends are kept as text.
    fn not_kept(&self) -> Option<Kept> {
        [self.first.kept, self.last.kept]
            .into_iter()
            .find(|k| *k != Kept::Text)
    }
    fn texts(&self) -> (&str, &str) {
        (
            self.before().text.as_deref().unwrap_or(""),
            self.after().text.as_deref().unwrap_or(""),
        )
    }
    fn old_name(&self) -> String {
        side_name("a", self.path, self.before())
    }
    fn new_name(&self) -> String {
        side_name("b", self.path, self.after())
    }
}

fn side_name(prefix: &str, path: &str, side: &Side) -> String {
    if side.sha256.is_some() {
        format!("{prefix}/{path}")
    } else {
        "/dev/null".to_owned()
    }
}

/// Per path, in the order the run first wrote it; paths that ended as they began are left out.
fn changes(rows: &[StoredWrite]) -> Vec<PathChange<'_>> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<PathChange<'_>> = Vec::new();
    for row in rows {
        match index.get(row.path.as_str()) {
            Some(&i) => out[i].last = row,
            None => {
                index.insert(&row.path, out.len());
                out.push(PathChange {
                    path: &row.path,
                    first: row,
                    last: row,
                });
            }
        }
    }
    out.retain(|c| c.before().sha256 != c.after().sha256);
    out
}

/// What `runs diff` prints for `record` and its stored files: the diff (or the stat), or the
/// one sentence that says why there is nothing to show.
pub fn render(record: &RunRecord, rows: &[StoredWrite], stat: bool) -> String {
    let changed = changes(rows);
    if changed.is_empty() {
        return format!("{}\n", nothing_to_show(record, rows));
    }
    if stat {
        render_stat(&changed)
    } else {
        render_diff(&changed)
    }
}

/// Why a run has no diff, in one sentence.
fn nothing_to_show(record: &RunRecord, rows: &[StoredWrite]) -> String {
    let id = &record.run_id;
    if !rows.is_empty() {
        return format!("Run {id} changed no files: every file it wrote ended as it began.");
    }
    let write_attempts = record
        .steps
        .iter()
        .filter(|s| s.access == Access::Write)
        .flat_map(|s| &s.attempts);
    let mut failed_wrote = false;
    for a in write_attempts {
        match &a.files_written {
            None if a.status == AttemptStatus::Succeeded => {
                return format!(
                    "Run {id} was recorded by an older docsfab, which did not keep the contents of the files it wrote; there is no diff to show."
                );
            }
            Some(files) if !files.is_empty() => failed_wrote = true,
            _ => {}
        }
    }
    if failed_wrote {
        format!(
            "Run {id} has no diff: only attempts that did not succeed wrote files, and docsfab keeps the contents of succeeded ones; `docsfab runs show {id}` lists those files."
        )
    } else {
        format!("Run {id} wrote no files.")
    }
}

fn render_diff(changed: &[PathChange<'_>]) -> String {
    changed.iter().map(file_diff).collect()
}

/// Per changed path, in the order the run first wrote it: the path and its part of the diff
/// (what `runs diff` prints for it). The HTML report links each written file to its part.
pub fn per_file(rows: &[StoredWrite]) -> Vec<(String, String)> {
    changes(rows)
        .iter()
        .map(|c| (c.path.to_owned(), file_diff(c)))
        .collect()
}

/// One path's part of the diff: its hunks, or the one line saying why there are none.
fn file_diff(c: &PathChange<'_>) -> String {
    if let Some(kept) = c.not_kept() {
        return format!("{}\n", not_shown_line(c, kept));
    }
    let (old, new) = c.texts();
    if old.is_empty() && new.is_empty() {
        // No hunk can say it, and a header alone is not a patch.
        let how = if c.before().sha256.is_none() {
            "created"
        } else {
            "removed"
        };
        return format!("File {}: {how}, empty.\n", c.path);
    }
    TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(CONTEXT)
        .header(&c.old_name(), &c.new_name())
        .to_string()
}

/// The one line for a file whose contents were not kept.
fn not_shown_line(c: &PathChange<'_>, kept: Kept) -> String {
    let sizes = format!("{} -> {}", size(c.before()), size(c.after()));
    match kept {
        // git's own wording, which tools that read diffs know.
        Kept::Binary => format!("Binary files {} and {} differ", c.old_name(), c.new_name()),
        Kept::TooLarge => format!(
            "File {}: too large to diff ({sizes}; docsfab keeps at most {} MiB of each side).",
            c.path,
            MAX_SIDE_BYTES >> 20
        ),
        Kept::Credential => format!(
            "File {}: not shown, it holds text shaped like a credential ({sizes}).",
            c.path
        ),
        Kept::RunCap => format!(
            "File {}: not kept, the run had already stored {} MiB of written contents ({sizes}).",
            c.path,
            MAX_RUN_BYTES >> 20
        ),
        Kept::HardLinked => format!(
            "File {}: not shown, it had more than one hard link before the write (another name \
             for it may be outside the workspace), so docsfab keeps only its hashes and sizes \
             ({sizes}).",
            c.path
        ),
        Kept::Text => unreachable!("only called for contents that were not kept"),
    }
}

fn size(side: &Side) -> String {
    if side.sha256.is_none() {
        "absent".to_owned()
    } else {
        format!("{} bytes", side.bytes)
    }
}

/// One `--stat` line's figures: insertions and deletions, or why there are none.
enum Counted {
    Lines { inserted: usize, deleted: usize },
    NotKept(Kept),
}

fn count(c: &PathChange<'_>) -> Counted {
    if let Some(kept) = c.not_kept() {
        return Counted::NotKept(kept);
    }
    let (old, new) = c.texts();
    let (mut inserted, mut deleted) = (0, 0);
    for change in TextDiff::from_lines(old, new).iter_all_changes() {
        match change.tag() {
            ChangeTag::Insert => inserted += 1,
            ChangeTag::Delete => deleted += 1,
            ChangeTag::Equal => {}
        }
    }
    Counted::Lines { inserted, deleted }
}

/// git's `--stat`: ` PATH | N ++--` per file, then the totals.
fn render_stat(changed: &[PathChange<'_>]) -> String {
    let counted: Vec<Counted> = changed.iter().map(count).collect();
    let name_width = changed
        .iter()
        .map(|c| c.path.chars().count())
        .max()
        .unwrap_or(0);
    let max_total = counted
        .iter()
        .filter_map(|c| match c {
            Counted::Lines { inserted, deleted } => Some(inserted + deleted),
            Counted::NotKept(_) => None,
        })
        .max()
        .unwrap_or(0);
    let count_width = max_total.to_string().len();
    let (mut all_inserted, mut all_deleted) = (0, 0);
    let mut out = String::new();
    for (c, figures) in changed.iter().zip(&counted) {
        let right = match figures {
            Counted::Lines { inserted, deleted } => {
                all_inserted += inserted;
                all_deleted += deleted;
                let (plus, minus) = bar(*inserted, *deleted, max_total);
                format!(
                    "{:>count_width$} {}{}",
                    inserted + deleted,
                    "+".repeat(plus),
                    "-".repeat(minus)
                )
            }
            Counted::NotKept(Kept::Binary) => {
                format!("Bin {} -> {} bytes", c.before().bytes, c.after().bytes)
            }
            Counted::NotKept(Kept::TooLarge) => "too large to diff".to_owned(),
            Counted::NotKept(Kept::Credential) => "not shown (credential)".to_owned(),
            Counted::NotKept(_) => "not kept (run cap)".to_owned(),
        };
        let pad = name_width - c.path.chars().count();
        let _ = writeln!(out, " {}{} | {}", c.path, " ".repeat(pad), right.trim_end());
    }
    let _ = writeln!(out, "{}", summary(changed.len(), all_inserted, all_deleted));
    out
}

/// The `+` and `-` counts of a bar, scaled down linearly when the largest change is wider than
/// [`MAX_BAR`]; a non-zero count keeps at least one mark.
fn bar(inserted: usize, deleted: usize, max_total: usize) -> (usize, usize) {
    if max_total <= MAX_BAR {
        return (inserted, deleted);
    }
    let scale = |n: usize| {
        if n == 0 {
            0
        } else {
            1 + n * (MAX_BAR - 1) / max_total
        }
    };
    let total = scale(inserted + deleted);
    let plus = scale(inserted).min(total);
    (plus, total - plus)
}

/// ` 2 files changed, 5 insertions(+), 1 deletion(-)`, leaving out a zero part as git does.
fn summary(files: usize, inserted: usize, deleted: usize) -> String {
    let plural = |n: usize, one: &str, many: &str| if n == 1 { one } else { many }.to_owned();
    let mut line = format!(" {files} {} changed", plural(files, "file", "files"));
    if inserted > 0 || deleted == 0 {
        let _ = write!(
            line,
            ", {inserted} {}(+)",
            plural(inserted, "insertion", "insertions")
        );
    }
    if deleted > 0 || inserted == 0 {
        let _ = write!(
            line,
            ", {deleted} {}(-)",
            plural(deleted, "deletion", "deletions")
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(text: Option<&str>) -> Side {
        Side {
            sha256: text.map(|t| {
                format!(
                    "{:064x}",
                    t.len() + t.bytes().map(usize::from).sum::<usize>()
                )
            }),
            bytes: text.map_or(0, |t| t.len() as u64),
            text: text.map(str::to_owned),
        }
    }

    fn row(step: u32, path: &str, before: Option<&str>, after: Option<&str>) -> StoredWrite {
        StoredWrite {
            step_index: step,
            attempt: 1,
            path: path.into(),
            kept: Kept::Text,
            before: side(before),
            after: side(after),
        }
    }

    #[test]
    fn a_path_two_steps_wrote_diffs_from_its_first_before_to_its_last_after() {
        let rows = [
            row(0, "docs/a.md", None, Some("one\n")),
            row(0, "docs/b.md", Some("x\n"), Some("y\n")),
            row(1, "docs/a.md", Some("one\n"), Some("one\ntwo\n")),
        ];
        let out = render_diff(&changes(&rows));
        assert_eq!(
            out,
            "--- /dev/null\n+++ b/docs/a.md\n@@ -0,0 +1,2 @@\n+one\n+two\n\
             --- a/docs/b.md\n+++ b/docs/b.md\n@@ -1 +1 @@\n-x\n+y\n"
        );
    }

    #[test]
    fn an_empty_created_file_is_one_line_not_a_header_without_hunks() {
        let rows = [row(0, "docs/empty.md", None, Some(""))];
        assert_eq!(
            render_diff(&changes(&rows)),
            "File docs/empty.md: created, empty.\n"
        );
    }

    #[test]
    fn a_path_that_ended_as_it_began_is_left_out() {
        let rows = [
            row(0, "a.md", Some("x\n"), Some("y\n")),
            row(1, "a.md", Some("y\n"), Some("x\n")),
        ];
        assert!(changes(&rows).is_empty());
    }

    #[test]
    fn stat_bars_scale_down_like_git_and_the_summary_leaves_out_zero_parts() {
        assert_eq!(bar(3, 2, 5), (3, 2));
        let (plus, minus) = bar(200, 100, 300);
        assert!(
            plus + minus <= MAX_BAR && plus > minus && minus > 0,
            "{plus} {minus}"
        );
        assert_eq!(summary(1, 2, 0), " 1 file changed, 2 insertions(+)");
        assert_eq!(
            summary(2, 1, 1),
            " 2 files changed, 1 insertion(+), 1 deletion(-)"
        );
        assert_eq!(summary(1, 0, 3), " 1 file changed, 3 deletions(-)");
    }
}
