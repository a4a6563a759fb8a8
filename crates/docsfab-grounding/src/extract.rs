//! What a Markdown text cites.

use serde::Serialize;

/// What kind of thing a citation names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A workspace path in backticks: `src/lib.rs`, `Cargo.toml`, `src/`.
    Path,
    /// A code name in backticks: `run_turn`, `RunRecord`, `a::b`, `x.method()`.
    Identifier,
    /// A relative Markdown link target: `[x](../y.md)`.
    Link,
    /// A path with a line or a line range: `src/lib.rs:12-30`, or `<!-- ground: path:12-30 -->`.
    LineRange,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Path => "path",
            Kind::Identifier => "identifier",
            Kind::Link => "link",
            Kind::LineRange => "line-range",
        }
    }
}

/// One thing a text cites, as written, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Citation {
    pub text: String,
    pub kind: Kind,
    pub line: u32,
}

/// File name endings that make a backticked word a path even without a `/`.
const FILE_EXTENSIONS: &[&str] = &[
    "rs", "toml", "md", "yaml", "yml", "json", "lock", "py", "js", "mjs", "ts", "tsx", "go", "c",
    "h", "cc", "cpp", "hpp", "java", "kt", "rb", "sh", "sql", "html", "css", "txt", "proto",
];

/// Every citation of `markdown`, in order. Fenced code blocks are skipped.
pub fn extract(markdown: &str) -> Vec<Citation> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for (n, line) in markdown.lines().enumerate() {
        let line_no = u32::try_from(n + 1).unwrap_or(u32::MAX);
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (Some(_), _) => {}
            (None, None) => scan_line(line, line_no, &mut out),
        }
    }
    out
}

/// The citations of one line outside code blocks, in reading order: code spans, links and
/// ground comments. Code spans are blanked out of the prose (same length), so a link's place
/// in the prose is its place in the line.
fn scan_line(line: &str, line_no: u32, out: &mut Vec<Citation>) {
    let mut found: Vec<(usize, Citation)> = Vec::new();
    let mut prose = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        prose.push_str(&rest[..start]);
        let ticks = rest[start..].bytes().take_while(|b| *b == b'`').count();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        let Some(end) = after.find(&closing) else {
            prose.push_str(&rest[start..]);
            rest = "";
            break;
        };
        if let Some(c) = classify_span(after[..end].trim(), line_no) {
            found.push((prose.len(), c));
        }
        prose.push_str(&" ".repeat(2 * ticks + end));
        rest = &after[end + ticks..];
    }
    prose.push_str(rest);
    links(&prose, line_no, &mut found);
    ground_comments(&prose, line_no, &mut found);
    found.sort_by_key(|(at, _)| *at);
    out.extend(found.into_iter().map(|(_, c)| c));
}

/// `[text](target)` with a relative target, at its place in `prose`.
fn links(prose: &str, line_no: u32, out: &mut Vec<(usize, Citation)>) {
    let mut from = 0;
    while let Some(at) = prose[from..].find("](").map(|i| from + i) {
        let after = &prose[at + 2..];
        let Some(end) = after.find(')') else {
            return;
        };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        if is_relative_target(target) {
            let citation = Citation {
                text: target.to_owned(),
                kind: Kind::Link,
                line: line_no,
            };
            out.push((at, citation));
        }
        from = at + 2 + end;
    }
}

fn is_relative_target(target: &str) -> bool {
    !(target.is_empty()
        || target.starts_with('#')
        || target.starts_with('/')
        || target.contains("://")
        || target.starts_with("mailto:")
        || target.contains('<')
        || target.contains('{'))
}

/// `<!-- ground: path:12-30 -->`, the citation form a composition may ask pages for.
fn ground_comments(prose: &str, line_no: u32, out: &mut Vec<(usize, Citation)>) {
    const OPEN: &str = "<!-- ground:";
    let mut from = 0;
    while let Some(at) = prose[from..].find(OPEN).map(|i| from + i) {
        let after = &prose[at + OPEN.len()..];
        let end = after.find("-->").unwrap_or(after.len());
        for cited in after[..end].split([',', ' ']).filter(|s| !s.is_empty()) {
            if let Some(c) = classify_span(cited, line_no) {
                out.push((at, c));
            }
        }
        from = at + OPEN.len() + end;
    }
}

/// What a backticked span cites, if anything.
fn classify_span(span: &str, line_no: u32) -> Option<Citation> {
    let cite = |kind| {
        Some(Citation {
            text: span.to_owned(),
            kind,
            line: line_no,
        })
    };
    if span.is_empty()
        || span.chars().any(char::is_whitespace)
        || !is_plain(span)
        || is_placeholder(span)
        || is_media_type(span)
    {
        return None;
    }
    if line_range(span).is_some() {
        return cite(Kind::LineRange);
    }
    if looks_like_path(span) {
        return cite(Kind::Path);
    }
    if looks_like_code_name(span) {
        return cite(Kind::Identifier);
    }
    None
}

/// Spans that are templates, placeholders, shell or URLs cite nothing in the tree.
fn is_plain(span: &str) -> bool {
    let bad_start = ['-', '$', '~', '/', '<', '{', '@', '%', '.'];
    !(span.starts_with(bad_start)
        || span.contains("://")
        || span.contains([
            '*', '{', '}', '"', '\'', '=', ',', ';', '|', '\\', '#', '?', '[',
        ]))
}

/// A template rather than a name: a part in capitals (`DOCSFAB_HOME/runs.db`,
/// `SHAPE.CASE.json`, `results-TIME/`) or a fragment cut at an underscore (`_TRACES_`).
fn is_placeholder(span: &str) -> bool {
    let capitals = span.split(['/', '.', '-']).any(|part| {
        part.len() >= 2
            && part
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            && part.chars().any(|c| c.is_ascii_uppercase())
    });
    let is_path_like = span.contains('/') || looks_like_path(span);
    (capitals && is_path_like) || span.ends_with('_')
}

/// `text/event-stream`, `application/json`, `http/protobuf`: media types and protocols.
fn is_media_type(span: &str) -> bool {
    const TOP: &[&str] = &[
        "text",
        "application",
        "image",
        "audio",
        "video",
        "multipart",
        "font",
        "http",
        "grpc",
    ];
    span.split_once('/')
        .is_some_and(|(top, rest)| TOP.contains(&top) && !rest.contains(['/', '.']))
}

/// `path:12` or `path:12-30` with a path-shaped left side: (path, first, last).
pub(crate) fn line_range(span: &str) -> Option<(&str, u32, u32)> {
    let (path, lines) = span.rsplit_once(':')?;
    if !looks_like_path(path) {
        return None;
    }
    let (a, b) = lines.split_once('-').unwrap_or((lines, lines));
    let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
    (a >= 1 && b >= a).then_some((path, a, b))
}

fn looks_like_path(span: &str) -> bool {
    let path_chars = span
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'));
    if !path_chars || span.contains("..") && !span.starts_with("../") {
        return false;
    }
    let has_extension = span
        .rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && FILE_EXTENSIONS.contains(&ext));
    // `a/b` with letters on both sides: a directory path (`src/`, `crates/docsfab`).
    let is_dir_path = span.contains('/')
        && span.split('/').filter(|s| !s.is_empty()).count() >= 1
        && span.chars().any(|c| c.is_ascii_alphabetic());
    has_extension || is_dir_path
}

/// Code-shaped: `a::b`, a call `f()`/`x.f()`, a macro `m!`, `snake_case`, `CamelCase`,
/// `camelCase`, `SCREAMING_CASE`, or a dotted key `retry.maxRetries`. A plain word is not.
fn looks_like_code_name(span: &str) -> bool {
    let core = code_core(span);
    if core.is_empty()
        || !core
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
    {
        return false;
    }
    if !core
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.'))
    {
        return false;
    }
    let call = span.ends_with(')') || span.ends_with('!');
    call || core.contains("::") || core.contains('.') || segments(core).any(is_code_word)
}

/// The span without a call's arguments, a macro's `!` or a type's generics.
pub(crate) fn code_core(span: &str) -> &str {
    let end = span.find(['(', '<', '!']).unwrap_or(span.len());
    span[..end].trim_start_matches(['&', '*'])
}

/// The words of a code name: `a::b.c` gives `a`, `b`, `c`.
pub(crate) fn segments(core: &str) -> impl Iterator<Item = &str> {
    core.split([':', '.']).filter(|s| !s.is_empty())
}

/// A single word shaped like code rather than English.
fn is_code_word(word: &str) -> bool {
    let has_underscore = word.contains('_') && word.chars().any(|c| c.is_ascii_alphabetic());
    let upper_inside = word.chars().skip(1).any(|c| c.is_ascii_uppercase());
    let has_lower = word.chars().any(|c| c.is_ascii_lowercase());
    has_underscore || (upper_inside && has_lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(md: &str) -> Vec<(String, Kind)> {
        extract(md).into_iter().map(|c| (c.text, c.kind)).collect()
    }

    #[test]
    fn code_spans_are_sorted_into_kinds_and_plain_words_cite_nothing() {
        let md = "See `src/lib.rs`, `src/lib.rs:3-9`, `run_turn`, `RunRecord`, `a::b`, \
                  `x.count()`, `retry.maxRetries`, `println!`, `Cargo.toml` and `src/`. Not `run`, \
                  `cargo test`, `--json`, `true`, `42`, `$HOME`, `~/.docsfab`, `https://x.y/z`, `Vec`, \
                  `DOCSFAB_HOME/runs.db`, `text/event-stream`, `_TRACES_`.";
        assert_eq!(
            kinds(md),
            vec![
                ("src/lib.rs".into(), Kind::Path),
                ("src/lib.rs:3-9".into(), Kind::LineRange),
                ("run_turn".into(), Kind::Identifier),
                ("RunRecord".into(), Kind::Identifier),
                ("a::b".into(), Kind::Identifier),
                ("x.count()".into(), Kind::Identifier),
                ("retry.maxRetries".into(), Kind::Identifier),
                ("println!".into(), Kind::Identifier),
                ("Cargo.toml".into(), Kind::Path),
                ("src/".into(), Kind::Path),
            ]
        );
    }

    #[test]
    fn fenced_blocks_are_examples_and_links_and_ground_comments_are_read() {
        let md = "```rust\nlet x = `fake_name`;\n```\n[guide](docs/guide.md#top) and \
                  [site](https://example.com) <!-- ground: src/a.rs:1-2 -->\n~~~\n`inside`\n~~~\n";
        let got = extract(md);
        assert_eq!(
            got.iter()
                .map(|c| (c.text.as_str(), c.kind, c.line))
                .collect::<Vec<_>>(),
            vec![
                ("docs/guide.md#top", Kind::Link, 4),
                ("src/a.rs:1-2", Kind::LineRange, 4),
            ]
        );
    }

    #[test]
    fn double_backticks_and_unclosed_spans_do_not_derail_the_line() {
        assert_eq!(
            kinds("``a `b` c`` then `snake_case` and `unclosed"),
            vec![("snake_case".into(), Kind::Identifier)]
        );
    }
}
