//! Whether a cited line range still says what it said: the SHA-256 of lines `a..=b` of a file,
//! kept when a page was judged (`grounding.lines` in the run record), against the same lines as
//! the file has them now. Pure: the caller reads the file.

use sha2::{Digest, Sha256};

use crate::extract::line_range;

/// The path a line-range citation names (`src/lib.rs` of `src/lib.rs:12-30`), without a
/// leading `./`; `None` when the text is not a line range.
pub fn cited_path(citation: &str) -> Option<&str> {
    line_range(citation).map(|(path, _, _)| path.trim_start_matches("./"))
}

/// The SHA-256 (hex) of the lines a line-range citation names, joined with `\n`, as `file`
/// holds them; `None` when the citation is not a line range or the file is shorter.
pub fn lines_sha256(file: &str, citation: &str) -> Option<String> {
    let (_, a, b) = line_range(citation)?;
    let lines: Vec<&str> = file.lines().collect();
    let (a, b) = (usize::try_from(a).ok()?, usize::try_from(b).ok()?);
    if b > lines.len() {
        return None;
    }
    Some(hex::encode(Sha256::digest(lines[a - 1..b].join("\n"))))
}

/// What became of a cited line range since it was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// The lines hash as they did.
    Unchanged,
    /// The file has the lines, but they differ.
    Changed,
    /// The file is gone, unreadable, or shorter than the range.
    Gone,
}

impl Freshness {
    pub fn as_str(self) -> &'static str {
        match self {
            Freshness::Unchanged => "unchanged",
            Freshness::Changed => "changed",
            Freshness::Gone => "gone",
        }
    }
}

/// Judges one cited range: `file` is the cited file's text now (`None`: gone or unreadable),
/// `sha256` the hash kept when it was judged.
pub fn freshness(citation: &str, sha256: &str, file: Option<&str>) -> Freshness {
    match file.and_then(|text| lines_sha256(text, citation)) {
        None => Freshness::Gone,
        Some(now) if now == sha256 => Freshness::Unchanged,
        Some(_) => Freshness::Changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue32_a_range_is_unchanged_changed_or_gone() {
        let before = "fn a() {}\nfn b() {}\nfn c() {}\n";
        let kept = lines_sha256(before, "src/lib.rs:2-3").unwrap();
        assert_eq!(
            freshness("src/lib.rs:2-3", &kept, Some(before)),
            Freshness::Unchanged
        );
        // A line added above moves the range: what it names now differs.
        let moved = format!("// new\n{before}");
        assert_eq!(
            freshness("src/lib.rs:2-3", &kept, Some(&moved)),
            Freshness::Changed
        );
        assert_eq!(
            freshness("src/lib.rs:2-3", &kept, Some("fn a() {}\n")),
            Freshness::Gone
        );
        assert_eq!(freshness("src/lib.rs:2-3", &kept, None), Freshness::Gone);
        assert_eq!(cited_path("./src/lib.rs:2-3"), Some("src/lib.rs"));
        assert_eq!(cited_path("src/lib.rs"), None);
    }
}
