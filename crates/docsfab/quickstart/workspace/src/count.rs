/// Word, line and byte counts of one text.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub lines: usize,
    pub words: usize,
    pub bytes: usize,
}

/// Counts lines (newline characters), words (runs of non-whitespace) and bytes.
pub fn count(text: &str) -> Counts {
    Counts {
        lines: text.bytes().filter(|&b| b == b'\n').count(),
        words: text.split_whitespace().count(),
        bytes: text.len(),
    }
}
