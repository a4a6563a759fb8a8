//! The one redaction path for text that came from a provider or a model and is about to reach a
//! terminal, a run record or a log line.
//!
//! A [`Redactor`] turns any string into one safe line:
//!
//! - credentials are replaced by `<redacted>`: every key shape the boundary's scanner knows, every
//!   host key the caller passes, whole, and every 16-byte piece of a host key of 16 bytes or more
//!   (a provider that cuts or splits a long key must not leak its first 64 characters);
//! - control characters, line and paragraph separators and bidirectional overrides are written
//!   as escapes (`\n`, `\u{1b}`), so the text cannot move a cursor, recolor a terminal or forge a
//!   log line;
//! - the result is capped at a number of characters, marked with `…` when cut.
//!
//! Credentials are found on the text as received, before escaping and cutting, so neither can
//! split a key into pieces the scan would miss. Pure: the caller passes the key values.

use aho_corasick::{AhoCorasick, MatchKind};

pub use crate::scan::KEY_PIECE_LEN;
use crate::scan::{Scanner, Secret, credential_end};

/// What replaces a credential.
pub const REDACTED: &str = "<redacted>";

/// The default cap of [`Redactor::line`], in characters: enough for any message docsfab builds,
/// far below what a hostile provider might send.
pub const DEFAULT_MAX_CHARS: usize = 1024;

/// The cap for one word a provider chose, such as an error `type` or `code`, or a model name.
pub const WORD_MAX_CHARS: usize = 64;

/// Redacts, escapes and caps text. Build once per set of keys; cheap to call.
pub struct Redactor {
    scanner: Scanner,
    /// Every host key shorter than [`KEY_PIECE_LEN`] whole, and every [`KEY_PIECE_LEN`]-byte
    /// window of the longer ones. `None` without keys.
    keys: Option<AhoCorasick>,
}

impl std::fmt::Debug for Redactor {
    /// Never the patterns: they are pieces of the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("host_keys", &self.keys.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Default for Redactor {
    /// A redactor that knows no host key: key shapes, escaping and the cap only.
    fn default() -> Self {
        Redactor::new::<&str>(&[])
    }
}

impl Redactor {
    /// `keys` are the host's secret values (API keys as read from the environment). Empty values
    /// are ignored.
    pub fn new<K: AsRef<[u8]>>(keys: &[K]) -> Redactor {
        let mut patterns: Vec<&[u8]> = Vec::new();
        for key in keys {
            let key = key.as_ref();
            if key.len() < KEY_PIECE_LEN {
                if !key.is_empty() {
                    patterns.push(key);
                }
            } else {
                patterns.extend(key.windows(KEY_PIECE_LEN));
            }
        }
        patterns.sort_unstable();
        patterns.dedup();
        // Standard semantics, so overlapping pieces are all reported and their union covers every
        // byte of the key that appears.
        let keys = (!patterns.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(&patterns)
                .expect("a few thousand short literal patterns always build")
        });
        Redactor {
            scanner: Scanner::new(&[]).expect("the fixed prefix set always builds"),
            keys,
        }
    }

    /// A redactor for the host secrets the boundary scans for.
    pub fn from_secrets(secrets: &[Secret]) -> Redactor {
        Redactor::new(&secrets.iter().map(Secret::value).collect::<Vec<_>>())
    }

    /// `text` as one safe line of at most [`DEFAULT_MAX_CHARS`] characters.
    pub fn line(&self, text: &str) -> String {
        self.line_capped(text, DEFAULT_MAX_CHARS)
    }

    /// One word a provider chose, at most [`WORD_MAX_CHARS`] characters.
    pub fn word(&self, text: &str) -> String {
        self.line_capped(text, WORD_MAX_CHARS)
    }

    /// `text` as one safe line of at most `max_chars` characters (at least 1 is used).
    pub fn line_capped(&self, text: &str, max_chars: usize) -> String {
        self.capped(text, Cap::Chars(max_chars.max(1)))
    }

    /// `text` as one safe line of at most `max_bytes` bytes of UTF-8 (at least 3 are used, the
    /// size of the mark), for a stored excerpt whose bound is its size. The same redaction and
    /// escaping as [`Redactor::line`]; only what the cap counts differs.
    pub fn excerpt(&self, text: &str, max_bytes: usize) -> String {
        self.capped(text, Cap::Bytes(max_bytes.max(CUT_MARK.len_utf8())))
    }

    fn capped(&self, text: &str, cap: Cap) -> String {
        let mut out = self.one_pass(text, cap);
        // An escape can glue a letter to a short run of key bytes (`\n` then 15 bytes of the
        // key), so the result is scanned again; a few passes settle it, and text that still
        // does not settle is withheld whole.
        for _ in 0..4 {
            if self.credential_ranges(&out).is_empty() {
                return out;
            }
            out = self.one_pass(&out, cap);
        }
        if self.credential_ranges(&out).is_empty() {
            out
        } else {
            // ASCII: as many characters as bytes.
            REDACTED.chars().take(cap.limit()).collect()
        }
    }

    fn one_pass(&self, text: &str, cap: Cap) -> String {
        let hidden = self.credential_ranges(text);
        let mut out = Out::new(cap);
        let mut at = 0;
        for (start, end) in hidden {
            if !escape_into(&text[at..start], &mut out) || !out.push(REDACTED) {
                return out.finish_cut();
            }
            at = end;
        }
        if !escape_into(&text[at..], &mut out) {
            return out.finish_cut();
        }
        out.text
    }

    /// Whether `text` holds a credential [`Redactor::line`] would hide (escapes aside).
    pub fn holds_credential(&self, text: &str) -> bool {
        !self.credential_ranges(text).is_empty()
    }

    /// Whether `text` holds anything [`Redactor::line`] would remove or escape.
    pub fn is_clean(&self, text: &str) -> bool {
        self.credential_ranges(text).is_empty() && !text.chars().any(needs_escape)
    }

    /// The byte ranges of `text` to hide, sorted, merged, on character boundaries.
    fn credential_ranges(&self, text: &str) -> Vec<(usize, usize)> {
        let hay = text.as_bytes();
        let mut ranges = Vec::new();
        if let Some(keys) = &self.keys {
            ranges.extend(
                keys.find_overlapping_iter(hay)
                    .map(|m| (m.start(), m.end())),
            );
        }
        let mut from = 0;
        while from < hay.len() {
            let clean = from == 0 || !is_token_byte(hay[from - 1]);
            let Some((at, kind)) = self.scanner.find(&hay[from..], clean) else {
                break;
            };
            let start = from + at;
            let end = credential_end(hay, start, &kind).max(start + 1);
            ranges.push((start, end));
            from = end;
        }
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            let start = floor_char_boundary(text, start);
            let end = ceil_char_boundary(text, end);
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }
}

/// `text` redacted with `keys`, as one line of at most `max_chars` characters. Builds a
/// [`Redactor`] per call: keep one when redacting more than a few strings.
pub fn redact(text: &str, keys: &[&str], max_chars: usize) -> String {
    Redactor::new(keys).line_capped(text, max_chars)
}

/// What a cap counts: characters (a line for people) or UTF-8 bytes (a stored excerpt).
#[derive(Debug, Clone, Copy)]
enum Cap {
    Chars(usize),
    Bytes(usize),
}

impl Cap {
    fn limit(self) -> usize {
        match self {
            Cap::Chars(n) | Cap::Bytes(n) => n,
        }
    }

    fn size(self, piece: &str) -> usize {
        match self {
            Cap::Chars(_) => piece.chars().count(),
            Cap::Bytes(_) => piece.len(),
        }
    }
}

/// What ends a text that was cut.
const CUT_MARK: char = '…';

/// The output under construction, built from whole pieces (a character, an escape, the
/// redaction mark) so a cut never leaves half of one.
struct Out {
    text: String,
    /// The size so far, in the cap's unit.
    size: usize,
    cap: Cap,
    /// Byte length and size before each piece, so a cut can drop whole pieces until the mark
    /// fits (a byte cap may need more than one dropped to make room for the 3-byte mark).
    starts: Vec<(usize, usize)>,
}

impl Out {
    fn new(cap: Cap) -> Out {
        Out {
            text: String::new(),
            size: 0,
            cap,
            starts: Vec::new(),
        }
    }

    /// Appends `piece` whole if it fits; false when it does not.
    fn push(&mut self, piece: &str) -> bool {
        let n = self.cap.size(piece);
        if self.size + n > self.cap.limit() {
            return false;
        }
        self.starts.push((self.text.len(), self.size));
        self.text.push_str(piece);
        self.size += n;
        true
    }

    /// Ends a text that did not fit with the mark `…`, dropping the last pieces until the mark
    /// fits after them.
    fn finish_cut(mut self) -> String {
        let mark = self.cap.size(CUT_MARK.encode_utf8(&mut [0u8; 4]));
        while self.size + mark > self.cap.limit() {
            let Some((len, size)) = self.starts.pop() else {
                break;
            };
            self.text.truncate(len);
            self.size = size;
        }
        self.text.push(CUT_MARK);
        self.text
    }
}

/// Escapes `s` into `out`; false when `out` filled up.
fn escape_into(s: &str, out: &mut Out) -> bool {
    let mut buf = [0u8; 4];
    for c in s.chars() {
        let ok = if needs_escape(c) {
            match c {
                '\n' => out.push("\\n"),
                '\r' => out.push("\\r"),
                '\t' => out.push("\\t"),
                c => out.push(&format!("\\u{{{:x}}}", c as u32)),
            }
        } else {
            out.push(c.encode_utf8(&mut buf))
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Characters that can move a cursor, start a terminal escape, break a line or reorder what a
/// reader sees.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LONG: &str = "Kq7vZ2mP9xW4tB8nR3cY6hJ1dF5gL0sA2eU7iO4pQ9wE3rT6yU8iO1pA5sD2fG7hJ4kL9zX3cV6bN8mQ1wE5rT2yU7iO4pA9sD3fG6hJ8kL1zX5cV2bN7mQ4wE9rT3yU6iO8pA1sD5fG2hJ7kL4zX9cV3bN6mQ8w";

    #[test]
    fn the_long_key_is_160_characters() {
        assert_eq!(LONG.len(), 160);
    }

    #[test]
    fn hardening_key_leak_whole_key_in_an_error_type_is_redacted() {
        let r = Redactor::new(&[LONG]);
        let out = r.word(&format!("error type {LONG}"));
        assert_eq!(out, "error type <redacted>");
    }

    #[test]
    fn hardening_key_leak_any_16_byte_piece_of_a_long_key_is_redacted() {
        let r = Redactor::new(&[LONG]);
        for start in 0..=LONG.len() - KEY_PIECE_LEN {
            let piece = &LONG[start..start + KEY_PIECE_LEN];
            let out = r.line(&format!("x {piece} y"));
            assert_eq!(out, "x <redacted> y", "piece at {start}");
        }
        // The first 64 characters, as a 64-character cut used to keep them.
        assert_eq!(r.line(&LONG[..64]), REDACTED);
    }

    #[test]
    fn a_short_key_is_redacted_whole_and_only_whole() {
        let r = Redactor::new(&["canary-0042"]);
        assert_eq!(r.line("a canary-0042 b"), "a <redacted> b");
        assert_eq!(r.line("canary-00"), "canary-00");
    }

    #[test]
    fn key_shapes_are_redacted_without_host_keys() {
        let r = Redactor::default();
        let key = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z";
        assert_eq!(
            r.line(&format!("type {key}, more")),
            "type <redacted>, more"
        );
        assert_eq!(r.line("task-oriented sk-learn"), "task-oriented sk-learn");
    }

    #[test]
    fn hardening_terminal_escapes_and_line_breaks_are_escaped() {
        let r = Redactor::default();
        assert_eq!(
            r.line("a\x1b[31mred\r\nforged\u{2028}x\u{202e}y\t"),
            "a\\u{1b}[31mred\\r\\nforged\\u{2028}x\\u{202e}y\\t"
        );
    }

    #[test]
    fn hardening_terminal_20000_characters_are_capped() {
        let r = Redactor::default();
        let out = r.line(&"\x1b[2J".repeat(5000));
        assert!(out.chars().count() <= DEFAULT_MAX_CHARS);
        assert!(out.ends_with('…'));
        assert!(!out.contains('\x1b'));
        // No half escape before the mark.
        let body = out.trim_end_matches('…');
        let tail = &body[body.rfind('\\').unwrap()..];
        assert!(tail.starts_with("\\u{1b}"), "{out}");
    }

    #[test]
    fn a_key_split_by_a_control_byte_leaves_no_long_piece() {
        let r = Redactor::new(&[LONG]);
        let out = r.line(&format!("{}\x1b{}", &LONG[..80], &LONG[80..]));
        assert_eq!(out, "<redacted>\\u{1b}<redacted>");
    }

    #[test]
    fn debug_output_never_shows_a_key_piece() {
        let shown = format!("{:?}", Redactor::new(&[LONG]));
        assert!(!shown.contains(&LONG[..16]), "{shown}");
    }

    #[test]
    fn convenience_function_matches_the_redactor() {
        assert_eq!(
            redact("k=canary-0042\n", &["canary-0042"], 100),
            "k=<redacted>\\n"
        );
    }

    #[test]
    fn issue11_excerpt_is_capped_in_bytes_on_a_char_boundary_with_the_mark() {
        let r = Redactor::new(&["canary-0042"]);
        // Three bytes a character: a byte cap that falls inside one drops it whole.
        let out = r.excerpt(&"€".repeat(1000), 2048);
        assert!(out.len() <= 2048, "{}", out.len());
        assert!(out.ends_with('…'));
        assert_eq!(
            out.len(),
            2046,
            "682 euro signs and the mark: {}",
            out.len()
        );
        // Short text is kept whole, escaped and redacted like a line.
        assert_eq!(r.excerpt("a\ncanary-0042", 2048), "a\\n<redacted>");
        // A mark of 3 bytes after single-byte pieces: enough pieces go to make room.
        let out = r.excerpt(&"x".repeat(100), 10);
        assert_eq!(out, "xxxxxxx…");
        assert_eq!(out.len(), 10);
    }

    fn arb_text() -> impl Strategy<Value = String> {
        // Mixes key pieces, controls, separators and ordinary text.
        let piece = prop_oneof![
            (0usize..=144, 16usize..=40).prop_map(|(s, n)| LONG[s..(s + n).min(160)].to_owned()),
            Just("\x1b[0m".to_owned()),
            Just("\r\n".to_owned()),
            Just("\u{2028}\u{202e}".to_owned()),
            "[a-zA-Z0-9 _-]{0,30}",
            "\\PC{0,10}",
            any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn hardening_redact_output_is_one_capped_line_without_key_pieces(
            text in arb_text(),
            cap in 1usize..300,
        ) {
            let r = Redactor::new(&[LONG]);
            let out = r.line_capped(&text, cap);
            prop_assert!(out.chars().count() <= cap, "{} > {cap}", out.chars().count());
            prop_assert!(!out.chars().any(needs_escape), "{out:?}");
            for start in 0..=LONG.len() - KEY_PIECE_LEN {
                prop_assert!(!out.contains(&LONG[start..start + KEY_PIECE_LEN]), "{out:?}");
            }
            // Applying it again changes nothing: a redacted line is already safe.
            prop_assert_eq!(r.line_capped(&out, cap), out.clone());
        }

        #[test]
        fn issue11_excerpt_is_one_line_within_its_bytes_without_key_pieces(
            text in arb_text(),
            cap in 3usize..300,
        ) {
            let r = Redactor::new(&[LONG]);
            let out = r.excerpt(&text, cap);
            prop_assert!(out.len() <= cap, "{} > {cap}", out.len());
            prop_assert!(!out.chars().any(needs_escape), "{out:?}");
            for start in 0..=LONG.len() - KEY_PIECE_LEN {
                prop_assert!(!out.contains(&LONG[start..start + KEY_PIECE_LEN]), "{out:?}");
            }
        }
    }
}
