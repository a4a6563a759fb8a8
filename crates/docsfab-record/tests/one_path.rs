//! One path per record item: every crate imports the record's types from `docsfab_record`, their
//! one owner, and no other crate gives them a second path (a `pub use` or `pub(crate) use` of a
//! record item, or a `pub type` naming one). A re-export under an old path is how twins come
//! back: one type read through two or three imports, as if it were two concepts.
//!
//! The scan reads `crates/*/src` as text (this crate has no dev-dependencies, see
//! `bottom_of_graph.rs`): every `pub ... use` and `pub ... type` statement, with the names it
//! binds (an identifier not followed by `::`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A `pub` alias statement found outside the record crate: where, its text, and the record
/// items it names (`*` for a glob or the crate itself).
struct Alias {
    file: String,
    statement: String,
    items: Vec<String>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Identifiers and the punctuation that matters for paths, in order.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut word = c.to_string();
            while let Some(&n) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_') {
                word.push(n);
                chars.next();
            }
            out.push(word);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push("::".to_owned());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

/// The names a `use` or `type` statement binds or names last: identifiers not followed by `::`,
/// keywords left out.
fn leaves(statement: &str) -> Vec<String> {
    const KEYWORDS: &[&str] = &["pub", "crate", "super", "self", "in", "use", "type", "as"];
    let t = tokens(statement);
    t.iter()
        .enumerate()
        .filter(|(i, w)| {
            w.starts_with(|c: char| c.is_alphabetic() || c == '_')
                && !KEYWORDS.contains(&w.as_str())
                && t.get(i + 1).is_none_or(|n| n != "::")
        })
        .map(|(_, w)| w.clone())
        .collect()
}

/// Whether `line` opens a `pub use`, `pub(...) use`, `pub type` or `pub(...) type` statement.
fn opens_pub_alias(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix("pub") else {
        return false;
    };
    let rest = match rest.strip_prefix('(') {
        Some(scoped) => scoped.split_once(')').map_or("", |(_, after)| after),
        None => rest,
    };
    let keyword = rest.trim_start();
    rest.starts_with([' ', '\t']) && (keyword.starts_with("use ") || keyword.starts_with("type "))
}

/// The `pub` alias statements of `src`, each up to its `;`.
fn pub_statements(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in src.lines() {
        if current.is_none() && opens_pub_alias(line) {
            current = Some(String::new());
        }
        if let Some(statement) = current.as_mut() {
            statement.push_str(line.trim());
            statement.push(' ');
            if line.contains(';') {
                out.extend(current.take());
            }
        }
    }
    out
}

/// Every item `docsfab_record` exports at its root.
fn record_items(root: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(root.join("crates/docsfab-record/src/lib.rs"))
        .expect("the record crate's lib.rs");
    pub_statements(&lib)
        .iter()
        .flat_map(|s| leaves(s))
        .collect()
}

/// Every `pub` alias outside the record crate that gives a record item another path.
fn aliases() -> Vec<Alias> {
    let root = repo();
    let items = record_items(&root);
    assert!(
        items.contains("RunRecord") && items.len() > 40,
        "read the record's items: {items:?}"
    );
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let krate = krate.expect("a crate directory").path();
        if krate.file_name().is_some_and(|n| n != "docsfab-record") {
            rust_files(&krate.join("src"), &mut files);
        }
    }
    assert!(files.len() > 100, "scanned only {} files", files.len());
    let mut found = Vec::new();
    for path in files {
        let src = std::fs::read_to_string(&path).expect("a source file");
        let file = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace('\\', "/");
        for statement in pub_statements(&src) {
            let mut named: Vec<String> = leaves(&statement)
                .into_iter()
                .filter(|l| items.contains(l))
                .collect();
            if named.is_empty() && statement.contains("docsfab_record") {
                named.push("*".to_owned());
            }
            if !named.is_empty() {
                found.push(Alias {
                    file: file.clone(),
                    statement: statement.trim().to_owned(),
                    items: named,
                });
            }
        }
    }
    found
}

#[test]
fn no_crate_gives_a_record_item_a_second_path() {
    let offending: Vec<String> = aliases()
        .iter()
        .flat_map(|a| {
            a.items
                .iter()
                .map(|item| format!("{}: {item} in `{}`", a.file, a.statement))
        })
        .collect();
    assert!(
        offending.is_empty(),
        "import record items from `docsfab_record` instead of re-exporting them:\n{}",
        offending.join("\n")
    );
}

#[test]
fn the_scan_sees_a_re_export_in_each_spelling() {
    let items: BTreeSet<String> = ["Usage", "TurnStatus", "Access"].map(str::to_owned).into();
    let src = "pub use docsfab_record::Usage;\n\
               pub(crate) use docsfab_record::{\n    Access,\n    TurnStatus as Status,\n};\n\
               pub use crate::driver::{Other, TurnStatus};\n\
               pub type Usage2 = docsfab_record::Usage;\n\
               use docsfab_record::Access;\n\
               /// pub use docsfab_record::Usage;\n\
               pub struct Publisher { pub usage: Usage }\n";
    let named: Vec<Vec<String>> = pub_statements(src)
        .iter()
        .map(|s| {
            leaves(s)
                .into_iter()
                .filter(|l| items.contains(l))
                .collect()
        })
        .collect();
    assert_eq!(
        named,
        [
            vec!["Usage"],
            vec!["Access", "TurnStatus"],
            vec!["TurnStatus"],
            vec!["Usage"],
        ]
    );
}
