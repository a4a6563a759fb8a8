//! Splitting a byte stream into lines the way the most permissive SSE consumer does.
//!
//! A line ends at CRLF, LF or a bare CR. A CR that ends one read and an LF that starts the next
//! are one line ending, not two, so the lines produced never depend on how the body was split
//! into reads (BND-6, BND-9). The last line is produced by [`LineSplitter::finish`] even when no
//! line ending follows it.

/// The UTF-8 encoding of U+FEFF, the byte order mark.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Drops every leading byte order mark from `line`.
///
/// Consumers differ: the OpenAI SDK parser drops one BOM per line, the Anthropic-messages parser
/// none. Dropping all of them means we read every line either would treat as data, and more.
pub fn strip_boms(mut line: &[u8]) -> &[u8] {
    while let Some(rest) = line.strip_prefix(BOM) {
        line = rest;
    }
    line
}

/// Incremental line splitter. Feed it reads in order; it calls back once per complete line,
/// without the line ending. Lines that lie wholly inside one read are passed without copying.
#[derive(Debug, Default, Clone)]
pub struct LineSplitter {
    /// Bytes of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// The previous read ended in CR: an LF at the start of the next read belongs to it.
    skip_lf: bool,
    /// Bytes fed so far.
    consumed: u64,
    /// Offset in the body of the first byte of the line being gathered.
    line_start: u64,
}

impl LineSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one read. `on_line` receives each line completed by this read.
    pub fn feed(&mut self, chunk: &[u8], mut on_line: impl FnMut(&[u8])) {
        self.feed_at(chunk, |line, _| on_line(line));
    }

    /// Like [`feed`](Self::feed), and also passes the offset in the whole body of each line's
    /// first byte, so a verdict can say where it was decided.
    pub fn feed_at(&mut self, chunk: &[u8], mut on_line: impl FnMut(&[u8], u64)) {
        if chunk.is_empty() {
            return;
        }
        let base = self.consumed;
        self.consumed += chunk.len() as u64;
        let mut at = 0;
        if self.skip_lf {
            self.skip_lf = false;
            if chunk[0] == b'\n' {
                at = 1;
                self.line_start = base + 1;
            }
        }
        while let Some(i) = memchr::memchr2(b'\r', b'\n', &chunk[at..]) {
            let end = at + i;
            if self.partial.is_empty() {
                on_line(&chunk[at..end], self.line_start);
            } else {
                self.partial.extend_from_slice(&chunk[at..end]);
                on_line(&self.partial, self.line_start);
                self.partial.clear();
            }
            let mut next = end + 1;
            if chunk[end] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            at = next;
            self.line_start = base + next as u64;
        }
        self.partial.extend_from_slice(&chunk[at..]);
    }

    /// Ends the stream: passes the final line if it had no line ending. Returns whether it did.
    pub fn finish(&mut self, mut on_line: impl FnMut(&[u8])) -> bool {
        self.finish_at(|line, _| on_line(line))
    }

    /// Like [`finish`](Self::finish), with the final line's offset.
    pub fn finish_at(&mut self, mut on_line: impl FnMut(&[u8], u64)) -> bool {
        self.skip_lf = false;
        if self.partial.is_empty() {
            return false;
        }
        let last = std::mem::take(&mut self.partial);
        on_line(&last, self.line_start);
        self.partial = last;
        self.partial.clear();
        true
    }

    /// Bytes fed so far, which is the length of the body seen.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Bytes held for a line that has not ended yet.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(reads: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut s = LineSplitter::new();
        let mut out = Vec::new();
        for r in reads {
            s.feed(r, |l| out.push(l.to_vec()));
        }
        s.finish(|l| out.push(l.to_vec()));
        out
    }

    #[test]
    fn all_three_line_endings_end_a_line_bnd_6() {
        assert_eq!(
            split(&[b"a\nb\rc\r\nd"]),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
        );
    }

    #[test]
    fn crlf_split_across_reads_is_one_ending_bnd_9() {
        assert_eq!(
            split(&[b"a\r", b"\nb\n"]),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
        assert_eq!(
            split(&[b"a\r", b"", b"\nb\n"]),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
        // Two CRs are two endings, whatever the split.
        assert_eq!(
            split(&[b"a\r", b"\rb"]),
            vec![b"a".to_vec(), b"".to_vec(), b"b".to_vec()]
        );
    }

    #[test]
    fn unterminated_last_line_is_produced_bnd_9() {
        assert_eq!(
            split(&[b"data: {}\n\ndata: [DO", b"NE]"]),
            vec![b"data: {}".to_vec(), b"".to_vec(), b"data: [DONE]".to_vec()]
        );
    }

    #[test]
    fn offsets_point_at_each_line_start_whatever_the_reads_bnd_9() {
        let body = b"ab\r\ncd\re\n\nf";
        let want = vec![
            (b"ab".to_vec(), 0),
            (b"cd".to_vec(), 4),
            (b"e".to_vec(), 7),
            (b"".to_vec(), 9),
            (b"f".to_vec(), 10),
        ];
        for cut in 0..=body.len() {
            let mut s = LineSplitter::new();
            let mut got = Vec::new();
            s.feed_at(&body[..cut], |l, at| got.push((l.to_vec(), at)));
            s.feed_at(&body[cut..], |l, at| got.push((l.to_vec(), at)));
            s.finish_at(|l, at| got.push((l.to_vec(), at)));
            assert_eq!(got, want, "cut at {cut}");
            assert_eq!(s.consumed(), body.len() as u64);
        }
    }

    #[test]
    fn every_leading_bom_is_dropped_bnd_6() {
        assert_eq!(strip_boms(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x"), b"data: x");
        assert_eq!(strip_boms(b"data: \xEF\xBB\xBFx"), b"data: \xEF\xBB\xBFx");
    }

    proptest::proptest! {
        /// BND-9: the lines never depend on how the body was cut into reads.
        #[test]
        fn lines_do_not_depend_on_read_boundaries_bnd_9(
            body in proptest::collection::vec(proptest::sample::select(vec![b'a', b'\r', b'\n', b':', 0xEF, 0xBB, 0xBF]), 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..20),
        ) {
            let whole = split(&[&body]);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort();
            let mut reads: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for c in cuts { reads.push(&body[at..c]); at = c; }
            reads.push(&body[at..]);
            proptest::prop_assert_eq!(whole, split(&reads));
        }
    }
}
