//! Read supervision (LSE-4): source the attempt already received is not sent again.
//!
//! A `read_file` whose byte range overlaps a range of the same file already returned in this
//! attempt, or a `search_text` identical to one already answered, gets a notice instead of the
//! content and spends no read budget. [`NO_PROGRESS_THRESHOLD`] notice-only re-reads in a row,
//! with no new evidence between them, mean the model is looping: the attempt stops as
//! `no-progress`. New evidence is any tool call that returned new content (a fresh read or
//! search, a listing, a write); a tool error is not evidence.
//!
//! Pure bookkeeping: paths are the workspace-relative paths the jail resolved, so `./a` and `a`
//! are the same file.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// Notice-only re-reads in a row, with no new evidence between them, that stop an attempt.
/// Three leaves room for one honest mistake and one retry of it.
pub const NO_PROGRESS_THRESHOLD: u32 = 3;

/// Whether a read may return content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadVerdict {
    /// Nothing of it was returned before: read, spend the budget, then record it.
    Fresh,
    /// Already returned: answer with this notice instead (no content, no budget).
    NoticeOnly { notice: String },
}

/// The read history of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadSupervisor {
    threshold: u32,
    returned: BTreeMap<String, Vec<Range<u64>>>,
    searches: BTreeSet<(String, String)>,
    consecutive_notices: u32,
    notices_total: u32,
    ask_for_answer: bool,
}

impl Default for ReadSupervisor {
    fn default() -> Self {
        ReadSupervisor::new(NO_PROGRESS_THRESHOLD)
    }
}

impl ReadSupervisor {
    pub fn new(threshold: u32) -> ReadSupervisor {
        ReadSupervisor {
            threshold: threshold.max(1),
            returned: BTreeMap::new(),
            searches: BTreeSet::new(),
            consecutive_notices: 0,
            notices_total: 0,
            ask_for_answer: false,
        }
    }

    /// For the retry of an attempt stopped as `no-progress` (STP-12): the first notice-only
    /// re-read also asks the model for its answer.
    pub fn asking_for_the_answer_at_first_notice(mut self) -> ReadSupervisor {
        self.ask_for_answer = true;
        self
    }

    /// Judges a read of `range` of `path`. An empty range never overlaps anything.
    pub fn check_read(&mut self, path: &str, range: Range<u64>) -> ReadVerdict {
        let overlapping = self.returned.get(path).and_then(|ranges| {
            ranges
                .iter()
                .find(|r| range.start < r.end && r.start < range.end)
                .cloned()
        });
        match overlapping {
            None => ReadVerdict::Fresh,
            Some(seen) => self.notice(format!(
                "{path} bytes {}..{} were already returned in this attempt; that content is \
                 above in the conversation. Read a range you have not read, or answer now.",
                seen.start, seen.end
            )),
        }
    }

    /// Records that `range` of `path` was returned: new evidence.
    pub fn record_read(&mut self, path: &str, range: Range<u64>) {
        if range.start < range.end {
            self.returned
                .entry(path.to_owned())
                .or_default()
                .push(range);
        }
        self.record_evidence();
    }

    /// Judges a search; the same pattern under the same path is a re-read.
    pub fn check_search(&mut self, pattern: &str, path: &str) -> ReadVerdict {
        if self
            .searches
            .contains(&(pattern.to_owned(), path.to_owned()))
        {
            self.notice(format!(
                "the search for {pattern:?} under {path:?} was already answered in this \
                 attempt; its results are above. Search for something else, or answer now."
            ))
        } else {
            ReadVerdict::Fresh
        }
    }

    /// Records that a search returned its results: new evidence.
    pub fn record_search(&mut self, pattern: &str, path: &str) {
        self.searches.insert((pattern.to_owned(), path.to_owned()));
        self.record_evidence();
    }

    /// Records other new evidence (a listing, a write): the notice streak ends.
    pub fn record_evidence(&mut self) {
        self.consecutive_notices = 0;
    }

    /// Forgets what was read of `path` (it was just written, so a read returns new content).
    pub fn forget(&mut self, path: &str) {
        self.returned.remove(path);
    }

    /// Whether the notice streak reached the threshold: stop the attempt as `no-progress`.
    pub fn no_progress(&self) -> bool {
        self.consecutive_notices >= self.threshold
    }

    /// Notice-only re-reads in this attempt, streak or not.
    pub fn notices_total(&self) -> u32 {
        self.notices_total
    }

    fn notice(&mut self, mut notice: String) -> ReadVerdict {
        if self.ask_for_answer && self.notices_total == 0 {
            notice.push_str(
                " The previous attempt stopped for re-reading what it had: give your final \
                 answer now, from what you have read.",
            );
        }
        self.consecutive_notices = self.consecutive_notices.saturating_add(1);
        self.notices_total = self.notices_total.saturating_add(1);
        ReadVerdict::NoticeOnly { notice }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requirement: LSE-4.
    #[test]
    fn overlapping_reread_of_the_same_file_is_notice_only_lse_4() {
        let mut s = ReadSupervisor::default();
        assert_eq!(s.check_read("src/a.rs", 0..100), ReadVerdict::Fresh);
        s.record_read("src/a.rs", 0..100);
        assert!(matches!(
            s.check_read("src/a.rs", 50..150),
            ReadVerdict::NoticeOnly { .. }
        ));
        assert_eq!(s.check_read("src/a.rs", 100..200), ReadVerdict::Fresh);
        assert_eq!(s.check_read("src/b.rs", 0..100), ReadVerdict::Fresh);
    }

    /// Requirement: LSE-4.
    #[test]
    fn three_notices_in_a_row_are_no_progress_lse_4() {
        let mut s = ReadSupervisor::default();
        s.record_read("a", 0..10);
        for n in 1..=NO_PROGRESS_THRESHOLD {
            assert!(!s.no_progress());
            assert!(matches!(
                s.check_read("a", 0..10),
                ReadVerdict::NoticeOnly { .. }
            ));
            assert_eq!(s.no_progress(), n == NO_PROGRESS_THRESHOLD);
        }
    }

    /// Requirement: LSE-4.
    #[test]
    fn new_evidence_between_notices_resets_the_streak_lse_4() {
        let mut s = ReadSupervisor::default();
        s.record_read("a", 0..10);
        for _ in 0..5 {
            let _ = s.check_read("a", 0..10);
            let _ = s.check_read("a", 5..6);
            s.record_read("b", 0..1);
            assert!(!s.no_progress());
        }
        assert_eq!(s.notices_total(), 10);
    }

    /// Requirement: STP-12.
    #[test]
    fn a_no_progress_retry_asks_for_the_answer_at_its_first_notice_stp_12() {
        let mut s = ReadSupervisor::default().asking_for_the_answer_at_first_notice();
        s.record_read("a", 0..10);
        let ReadVerdict::NoticeOnly { notice } = s.check_read("a", 0..10) else {
            panic!("not a notice");
        };
        assert!(notice.contains("final answer now"), "{notice}");
        let ReadVerdict::NoticeOnly { notice } = s.check_read("a", 0..10) else {
            panic!("not a notice");
        };
        assert!(
            !notice.contains("final answer now"),
            "only the first notice asks"
        );
        let mut plain = ReadSupervisor::default();
        plain.record_read("a", 0..10);
        assert!(matches!(
            plain.check_read("a", 0..10),
            ReadVerdict::NoticeOnly { notice } if !notice.contains("final answer now")
        ));
    }

    #[test]
    fn repeated_search_is_notice_only_and_a_write_frees_a_reread() {
        let mut s = ReadSupervisor::default();
        assert_eq!(s.check_search("fn main", "src"), ReadVerdict::Fresh);
        s.record_search("fn main", "src");
        assert!(matches!(
            s.check_search("fn main", "src"),
            ReadVerdict::NoticeOnly { .. }
        ));
        assert_eq!(s.check_search("fn main", ""), ReadVerdict::Fresh);
        s.record_read("docs/x.md", 0..10);
        s.forget("docs/x.md");
        assert_eq!(s.check_read("docs/x.md", 0..10), ReadVerdict::Fresh);
    }
}
