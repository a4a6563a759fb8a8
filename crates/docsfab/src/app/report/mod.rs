//! `docsfab runs show ID --html FILE|-`: the run as one self-contained HTML page.
//!
//! The page carries everything it shows: the run record and the per-file diffs as JSON data
//! blocks, and the style and script from `report/` inlined. A Content-Security-Policy forbids
//! every fetch, so the page works from disk or as a mail attachment and never calls out.
//!
//! The record holds model text, so nothing from it is ever markup: the data blocks escape
//! `<`, `>`, `&` and U+2028/U+2029 (record text cannot close the block or start a tag), and
//! the script inserts every text with `textContent`, never `innerHTML`.

use std::io::Write as _;
use std::path::Path;

use docsfab_record::RunRecord;
use serde::Serialize;

use crate::app::error::{CliError, emit};

const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");

/// One file the run changed and its part of `runs diff`.
#[derive(Serialize)]
struct FileDiff<'a> {
    path: &'a str,
    diff: &'a str,
}

/// The whole page for `record`, with `diffs` (path, unified diff) as `runs diff` prints them.
pub fn render(record: &RunRecord, diffs: &[(String, String)]) -> Result<String, CliError> {
    let record_json = data_block(record)?;
    let files: Vec<FileDiff<'_>> = diffs
        .iter()
        .map(|(path, diff)| FileDiff { path, diff })
        .collect();
    let diffs_json = data_block(&files)?;
    // What the run's gateway may have bent, in the words `runs show` uses (issue 24).
    let gateway_json = data_block(&crate::app::gateway::RunGateway::of_run(record))?;
    // The run id is docsfab's own format, but the title goes through the same escape as the rest.
    let title = escape_text(&format!("docsfab run {}", record.run_id));
    Ok(format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{STYLE}</style>
</head>
<body>
<header id="run-header"><h1>{title}</h1><dl id="run-facts"></dl></header>
<noscript><p>This report draws its timeline with JavaScript; the run record is in the page source as JSON.</p></noscript>
<section id="timeline-section"><h2>Timeline</h2><div id="legend"></div><div id="timeline" tabindex="0"></div></section>
<section id="detail-section"><h2>Selected</h2><div id="detail"><p class="hint">Click a bar (or hover it) to see its record.</p></div></section>
<section id="files-section"><h2>Files written</h2><div id="files"></div></section>
<script type="application/json" id="run-record">{record_json}</script>
<script type="application/json" id="run-diffs">{diffs_json}</script>
<script type="application/json" id="run-gateway">{gateway_json}</script>
<script>
{SCRIPT}</script>
</body>
</html>
"#
    ))
}

/// JSON that is safe inside `<script type="application/json">`: the characters that could end
/// the block, open a comment or tag, or break a JavaScript line become `\uXXXX` escapes (only
/// possible inside JSON strings, where they mean the same character).
fn data_block<T: Serialize>(value: &T) -> Result<String, CliError> {
    let json = serde_json::to_string(value)
        .map_err(|e| CliError::failed(format!("cannot format the run record as JSON ({e}).")))?;
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn escape_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Writes the page to `target`: `-` is standard output; a file is written beside itself and
/// renamed into place, so a failed write leaves no half page.
pub fn write(page: &str, target: &Path) -> Result<(), CliError> {
    if target == Path::new("-") {
        return emit(page);
    }
    let cannot = |e: std::io::Error| {
        CliError::bad_input(format!(
            "cannot write the HTML report to {} ({}); name a file in an existing, writable directory, or `-` for standard output.",
            target.display(),
            crate::app::error::plain_reason(&e.to_string(), "the file cannot be written")
        ))
    };
    if target.is_dir() {
        return Err(cannot(std::io::Error::other("it is a directory")));
    }
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = target.file_name().map_or_else(
        || "report.html".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::File::create(&temp)
        .and_then(|mut f| f.write_all(page.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&temp, target));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(cannot(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue13_data_block_cannot_close_the_script_or_break_a_line() {
        let text = "</script><script>alert(1)</script> & <!-- \u{2028}\u{2029}";
        let block = data_block(&text).unwrap();
        for bad in ['<', '>', '&', '\u{2028}', '\u{2029}'] {
            assert!(!block.contains(bad), "{bad:?} left in {block}");
        }
        // Still the same text for a JSON reader.
        let back: String = serde_json::from_str(&block).unwrap();
        assert_eq!(back, text);
    }

    #[test]
    fn issue13_title_text_is_escaped() {
        assert_eq!(
            escape_text("<b>\"a\" & 'b'</b>"),
            "&lt;b&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/b&gt;"
        );
    }
}
