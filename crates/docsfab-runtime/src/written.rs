//! The contents a run's succeeded write attempts left behind, kept in the run store for
//! `docsfab runs diff`: what is kept of each file and why (the rows themselves are written by
//! each backend in `store/`).
//!
//! Each file an attempt changed is one row of `written_files`, committed in the same transaction
//! as the attempt's record (an attempt that is recorded has its contents). The contents are
//! bounded, so a run cannot grow the store without limit:
//! - a file either side of which is over [`MAX_SIDE_BYTES`] keeps only its hashes and sizes
//!   (`too-large`);
//! - a file that is not text keeps only its hashes and sizes (`binary`): a NUL byte, invalid
//!   UTF-8, or a control character other than tab, line feed, form feed and carriage return
//!   (such a character could move the cursor or recolor the terminal the diff is shown on);
//! - a file holding text shaped like a credential keeps only its hashes and sizes
//!   (`credential`): keys never reach the store;
//! - once a run has stored [`MAX_RUN_BYTES`] of contents, further files keep only their hashes
//!   and sizes (`run-cap`);
//! - a file that had more than one hard link before the write keeps only its hashes and sizes
//!   (`hard-linked`): another name for its content may be outside the workspace, and what the
//!   read tools refuse to read the store does not keep either.

use crate::snapshot::WrittenFile;

/// The most one side (before or after) of a file may hold to be kept: 1 MiB.
pub const MAX_SIDE_BYTES: usize = 1 << 20;
/// The most contents one run keeps, both sides of every file together: 64 MiB.
pub const MAX_RUN_BYTES: u64 = 64 << 20;

/// Whether a file's contents are kept, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Both sides are kept as text.
    Text,
    Binary,
    TooLarge,
    Credential,
    /// The run had stored [`MAX_RUN_BYTES`] already.
    RunCap,
    /// The file had more than one hard link before the write.
    HardLinked,
}

impl Kept {
    pub fn as_str(self) -> &'static str {
        match self {
            Kept::Text => "text",
            Kept::Binary => "binary",
            Kept::TooLarge => "too-large",
            Kept::Credential => "credential",
            Kept::RunCap => "run-cap",
            Kept::HardLinked => "hard-linked",
        }
    }

    pub fn parse(text: &str) -> Option<Kept> {
        [
            Kept::Text,
            Kept::Binary,
            Kept::TooLarge,
            Kept::Credential,
            Kept::RunCap,
            Kept::HardLinked,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// One side of a file as stored: its hash and size always, its text when kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// `None`: the file did not exist.
    pub sha256: Option<String>,
    pub bytes: u64,
    pub text: Option<String>,
}

/// One row of `written_files`: a file one succeeded attempt changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredWrite {
    pub step_index: u32,
    pub attempt: u32,
    pub path: String,
    pub kept: Kept,
    pub before: Side,
    pub after: Side,
}

/// How `file`'s contents would be kept, before the run's cap is applied. `holds_credential`
/// is the run's redactor's judgement of a text.
pub fn classify(file: &WrittenFile, holds_credential: impl Fn(&str) -> bool) -> Kept {
    if file.linked_before.is_some() {
        return Kept::HardLinked;
    }
    let sides = [file.before.as_deref(), file.after.as_deref()];
    if sides.iter().flatten().any(|b| b.len() > MAX_SIDE_BYTES) {
        return Kept::TooLarge;
    }
    let mut texts = Vec::new();
    for bytes in sides.into_iter().flatten() {
        match std::str::from_utf8(bytes) {
            Ok(text) if !text.chars().any(is_unsafe_control) => texts.push(text),
            _ => return Kept::Binary,
        }
    }
    if texts.into_iter().any(holds_credential) {
        return Kept::Credential;
    }
    Kept::Text
}

/// A control character a text file has no business holding (NUL included).
fn is_unsafe_control(c: char) -> bool {
    c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\x0c')
}

/// How each of an attempt's files is finally kept, given the bytes the run already keeps
/// (`used`): text past the run's cap ([`MAX_RUN_BYTES`]) is kept as `RunCap` (digests only).
/// Both store backends apply it, so they keep the same files.
pub(crate) fn under_run_cap(mut used: u64, files: &[(WrittenFile, Kept)]) -> Vec<Kept> {
    let len = |side: &Option<Vec<u8>>| side.as_ref().map_or(0, |b| b.len() as u64);
    files
        .iter()
        .map(|(file, kept)| {
            let size = len(&file.before) + len(&file.after);
            if *kept != Kept::Text {
                *kept
            } else if used + size > MAX_RUN_BYTES {
                Kept::RunCap
            } else {
                used += size;
                Kept::Text
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(before: Option<&[u8]>, after: Option<&[u8]>) -> WrittenFile {
        WrittenFile {
            path: "docs/a.md".into(),
            before: before.map(<[u8]>::to_vec),
            after: after.map(<[u8]>::to_vec),
            sha256_before: before.map(|_| "b".repeat(64)),
            sha256_after: after.map(|_| "a".repeat(64)),
            linked_before: None,
        }
    }

    #[test]
    fn text_binary_control_large_and_credential_files_are_told_apart() {
        let none = |_: &str| false;
        assert_eq!(
            classify(&file(None, Some(b"# A\n\tok\r\n")), none),
            Kept::Text
        );
        assert_eq!(
            classify(&file(Some(b"a\0b"), Some(b"x")), none),
            Kept::Binary
        );
        assert_eq!(
            classify(&file(Some(&[0xff, 0xfe]), None), none),
            Kept::Binary
        );
        assert_eq!(
            classify(&file(None, Some(b"\x1b[31mred")), none),
            Kept::Binary
        );
        let big = vec![b'a'; MAX_SIDE_BYTES + 1];
        assert_eq!(
            classify(&file(Some(&big), Some(b"x")), none),
            Kept::TooLarge
        );
        let at_cap = vec![b'a'; MAX_SIDE_BYTES];
        assert_eq!(classify(&file(Some(&at_cap), None), none), Kept::Text);
        let secret = |t: &str| t.contains("sk-");
        assert_eq!(
            classify(&file(None, Some(b"key sk-x")), secret),
            Kept::Credential
        );
    }
}
