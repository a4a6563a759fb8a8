use crate::count::Counts;

/// Renders counts as one `wc`-style line: lines, words, bytes, then the name.
pub fn render(counts: &Counts, name: &str) -> String {
    format!("{:>7} {:>7} {:>7} {}", counts.lines, counts.words, counts.bytes, name)
}
