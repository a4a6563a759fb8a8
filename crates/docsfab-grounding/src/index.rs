//! The tree a page describes, and the judgement of what the page cites against it.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;

use crate::extract::{Citation, Kind, code_core, segments};

/// File name endings whose text is prose, not source: their words ground no code name (a name
/// that appears only in other documentation is no evidence that the code has it).
const PROSE_EXTENSIONS: &[&str] = &["md", "markdown", "txt", "rst", "adoc"];

/// Names every Rust, Python or JavaScript reader knows without the tree: the standard library
/// and the languages' own words. They are `external`: neither grounded by the tree nor unknown.
const STANDARD_NAMES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "String",
    "Vec",
    "Option",
    "Result",
    "Some",
    "None",
    "Ok",
    "Err",
    "Box",
    "Rc",
    "Arc",
    "Mutex",
    "RwLock",
    "HashMap",
    "HashSet",
    "BTreeMap",
    "BTreeSet",
    "VecDeque",
    "Cow",
    "Path",
    "PathBuf",
    "Duration",
    "Instant",
    "SystemTime",
    "println",
    "eprintln",
    "format",
    "write",
    "writeln",
    "vec",
    "assert",
    "assert_eq",
    "assert_ne",
    "panic",
    "unwrap",
    "expect",
    "unwrap_or",
    "unwrap_or_default",
    "unwrap_or_else",
    "map",
    "and_then",
    "ok_or",
    "iter",
    "into_iter",
    "collect",
    "clone",
    "to_string",
    "to_owned",
    "as_str",
    "len",
    "is_empty",
    "push",
    "insert",
    "get",
    "contains",
    "from",
    "into",
    "new",
    "default",
    "Default",
    "Debug",
    "Display",
    "Clone",
    "Copy",
    "PartialEq",
    "Eq",
    "Hash",
    "Ord",
    "PartialOrd",
    "Send",
    "Sync",
    "Sized",
    "Iterator",
    "IntoIterator",
    "From",
    "Into",
    "TryFrom",
    "AsRef",
    "Drop",
    "Fn",
    "FnMut",
    "FnOnce",
    "Self",
    "self",
    "crate",
    "super",
    "main",
    "io",
    "fs",
    "env",
    "thread",
    "sync",
    "collections",
    "fmt",
    "process",
    "time",
    "Error",
    "read_to_string",
    "__init__",
    "__main__",
    "self",
    "None",
    "True",
    "False",
    "console",
    "log",
    "JSON",
    "parse",
    "stringify",
    "Promise",
    "async",
    "await",
];

/// A source tree, ready to judge citations against: its paths (files and the directories that
/// hold them), the code words of its source text, its files' lines for line ranges, and the
/// names of its declared dependencies.
#[derive(Debug, Default)]
pub struct Index {
    files: BTreeMap<String, String>,
    dirs: BTreeSet<String>,
    /// Every file and directory path and each of its tails on a `/` (`tests/a.rs` of
    /// `crates/x/tests/a.rs`): pages about one crate name its paths from the crate's root.
    tails: HashSet<String>,
    /// File names the source text mentions (`host.yaml` in a string): a name the code uses is
    /// a real name even where no such file is in the tree.
    file_names: HashSet<String>,
    words: HashSet<String>,
    dependencies: HashSet<String>,
}

/// How one citation was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Grounded,
    /// A name of the standard library or a declared dependency: not the tree's to ground.
    External,
    Unknown,
}

/// One citation with its verdict; a line range keeps the SHA-256 of the lines it cites, so a
/// later check can tell whether the claim went stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Judged {
    pub text: String,
    pub kind: Kind,
    pub line: u32,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lines_sha256: Option<String>,
}

/// A citation the tree does not hold, with the nearest real names where there are any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unknown {
    pub text: String,
    pub kind: Kind,
    pub line: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nearest: Vec<String>,
}

/// What one page cites and how much of it is grounded. `cited` counts grounded and unknown
/// citations; external names are counted apart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub cited: u32,
    pub grounded: u32,
    pub external: u32,
    pub unknown: Vec<Unknown>,
    pub judged: Vec<Judged>,
}

impl Index {
    /// Adds one file of the tree (path relative to its root, `/`-separated) with its text.
    pub fn add_file(&mut self, path: &str, text: &str) {
        let path = path.trim_start_matches("./").to_owned();
        let mut dir = path.as_str();
        while let Some((parent, _)) = dir.rsplit_once('/') {
            self.dirs.insert(parent.to_owned());
            self.add_tails(parent);
            dir = parent;
        }
        self.add_tails(&path);
        // A module named by its path without the file ending (`app/print` for app/print.rs).
        if let Some((stem, _)) = path
            .rsplit_once('.')
            .filter(|(stem, _)| !stem.ends_with('/'))
        {
            self.add_tails(stem);
        }
        let prose = path
            .rsplit_once('.')
            .is_some_and(|(_, ext)| PROSE_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()));
        if !prose {
            self.words.extend(code_words(text).map(str::to_owned));
            self.file_names
                .extend(dotted_words(text).map(str::to_owned));
        }
        self.files.insert(path, text.to_owned());
    }

    /// Declares dependency names (from Cargo.toml, package.json, ...): their names are external.
    pub fn add_dependencies<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            self.dependencies.insert(name.replace('-', "_"));
        }
    }

    pub fn is_file(&self, path: &str) -> bool {
        self.files.contains_key(path)
    }

    fn add_tails(&mut self, path: &str) {
        let mut tail = path;
        loop {
            self.tails.insert(tail.to_owned());
            match tail.split_once('/') {
                Some((_, rest)) if !rest.is_empty() => tail = rest,
                _ => break,
            }
        }
    }

    /// Judges `citations` of the page at `page` (its path in the tree, for relative links);
    /// `pages` are other paths that count as present (pages the same run writes).
    pub fn judge(&self, page: &str, citations: &[Citation], pages: &BTreeSet<String>) -> Report {
        let mut report = Report::default();
        for c in citations {
            let (verdict, lines_sha256) = self.verdict(page, c, pages);
            match verdict {
                Verdict::Grounded => {
                    report.cited += 1;
                    report.grounded += 1;
                }
                Verdict::External => report.external += 1,
                Verdict::Unknown => {
                    report.cited += 1;
                    report.unknown.push(Unknown {
                        text: c.text.clone(),
                        kind: c.kind,
                        line: c.line,
                        nearest: self.nearest(c),
                    });
                }
            }
            report.judged.push(Judged {
                text: c.text.clone(),
                kind: c.kind,
                line: c.line,
                verdict,
                lines_sha256,
            });
        }
        report
    }

    fn verdict(
        &self,
        page: &str,
        c: &Citation,
        pages: &BTreeSet<String>,
    ) -> (Verdict, Option<String>) {
        let known = |ok: bool| {
            if ok {
                Verdict::Grounded
            } else {
                Verdict::Unknown
            }
        };
        match c.kind {
            Kind::Path if is_build_output(&c.text) => (Verdict::External, None),
            Kind::Path => (known(self.has_path(&c.text)), None),
            Kind::Identifier => (self.name_verdict(&c.text), None),
            Kind::Link => {
                let target = c.text.split(['#', '?']).next().unwrap_or("");
                let resolved = resolve(page, target);
                let ok = target.is_empty()
                    || resolved
                        .as_deref()
                        .is_some_and(|p| self.has_path(p) || pages.contains(p));
                (known(ok), None)
            }
            Kind::LineRange => match self.lines_hash(&c.text) {
                Some(hash) => (Verdict::Grounded, Some(hash)),
                None => (Verdict::Unknown, None),
            },
        }
    }

    /// A path of the tree: a file or directory, named from the root or from any directory on
    /// its way (`tests/a.rs`); or a bare file name that the source text uses.
    fn has_path(&self, path: &str) -> bool {
        let p = path.trim_start_matches("./").trim_end_matches('/');
        self.tails.contains(p) || (!p.contains('/') && self.file_names.contains(p))
    }

    fn name_verdict(&self, text: &str) -> Verdict {
        let words: Vec<&str> = segments(code_core(text)).collect();
        let Some(first) = words.first() else {
            return Verdict::Unknown;
        };
        let external = |w: &str| STANDARD_NAMES.contains(&w) || self.dependencies.contains(w);
        if words.len() > 1 && external(first) {
            return Verdict::External;
        }
        let unknown: Vec<&&str> = words
            .iter()
            .filter(|w| !self.words.contains(**w) && !external(w))
            .collect();
        match (unknown.is_empty(), words.iter().all(|w| external(w))) {
            (true, true) => Verdict::External,
            (true, false) => Verdict::Grounded,
            (false, _) => Verdict::Unknown,
        }
    }

    /// The SHA-256 of lines `a..=b` of the cited file, when it has them.
    fn lines_hash(&self, text: &str) -> Option<String> {
        let file = self.files.get(crate::stale::cited_path(text)?)?;
        crate::stale::lines_sha256(file, text)
    }

    /// Up to three real names closest to an unknown one (paths for paths, words for names).
    fn nearest(&self, c: &Citation) -> Vec<String> {
        match c.kind {
            Kind::Identifier => {
                let core = code_core(&c.text);
                let missing = segments(core)
                    .find(|w| !self.words.contains(*w))
                    .unwrap_or(core);
                closest(missing, self.words.iter().map(String::as_str))
            }
            Kind::Path | Kind::Link | Kind::LineRange => {
                let path = c.text.split([':', '#']).next().unwrap_or("");
                closest(path, self.files.keys().map(String::as_str))
            }
        }
    }
}

/// Directories that hold what a build or an install makes, never source: a path under one
/// names an output location, which no tree holds.
const BUILD_OUTPUT_DIRS: &[&str] = &["target", "node_modules", "dist", "build", ".venv"];

fn is_build_output(path: &str) -> bool {
    let first = path
        .trim_start_matches("./")
        .split('/')
        .next()
        .unwrap_or("");
    path.contains('/') && BUILD_OUTPUT_DIRS.contains(&first)
}

/// Words with a dot inside (`host.yaml`, `runs.db`) in source text: file names the code uses.
fn dotted_words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        .map(|w| w.trim_matches('.'))
        .filter(|w| w.len() >= 3 && w.contains('.'))
}

/// The words of source text that could be code names.
fn code_words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.len() >= 2 && !w.starts_with(|c: char| c.is_ascii_digit()))
}

/// `target` relative to the directory of `page`, with `.` and `..` resolved; `None` when it
/// climbs out of the tree.
fn resolve(page: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = page.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

/// Up to three candidates within a small edit distance of `wanted`, nearest first.
fn closest<'a>(wanted: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<String> {
    let limit = (wanted.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, &str)> = candidates
        .filter(|c| c.len().abs_diff(wanted.len()) <= limit)
        .filter_map(|c| {
            let d = edit_distance(wanted, c);
            (d <= limit && d > 0).then_some((d, c))
        })
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_owned())
        .collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            let next = (row[j + 1] + 1).min(row[j] + 1).min(prev + cost);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::extract;

    fn tree() -> Index {
        let mut index = Index::default();
        index.add_file(
            "src/lib.rs",
            "pub mod count;\npub fn count_words(s: &str) -> usize {\n    s.split_whitespace().count()\n}\n",
        );
        index.add_file(
            "src/report.rs",
            "pub struct Report;\nimpl Report { pub fn render(&self) {} }\n",
        );
        index.add_file("docs/old.md", "mentions `ghost_fn` only in prose\n");
        index.add_file("src/config.rs", "const HOST: &str = \"host.yaml\";\n");
        index.add_dependencies(["serde", "tokio"]);
        index
    }

    fn judge(md: &str) -> Report {
        tree().judge("docs/page.md", &extract(md), &BTreeSet::new())
    }

    #[test]
    fn real_names_paths_and_links_are_grounded() {
        let r = judge(
            "`count_words` in `src/lib.rs` (`src/lib.rs:2-4`), `Report::render()`, `src/`, \
             [old](old.md), [up](../src/report.rs)",
        );
        assert_eq!((r.cited, r.grounded), (7, 7), "{r:?}");
        let range = r.judged.iter().find(|j| j.kind == Kind::LineRange).unwrap();
        assert_eq!(range.lines_sha256.as_deref().map(str::len), Some(64));
    }

    #[test]
    fn tails_of_paths_used_file_names_and_build_outputs() {
        let r = judge("`lib.rs`, `host.yaml`, `target/debug/x`, `report.rs`, `nope.yaml`");
        assert_eq!((r.cited, r.grounded, r.external), (4, 3, 1), "{r:?}");
        assert_eq!(r.unknown[0].text, "nope.yaml");
    }

    #[test]
    fn fakes_are_unknown_with_the_nearest_real_names() {
        let r = judge(
            "`count_word` in `src/src.rb`, `ghost_fn`, `src/lib.rs:3-99`, [gone](missing.md)",
        );
        assert_eq!((r.cited, r.grounded), (5, 0), "{r:?}");
        assert_eq!(r.unknown[0].nearest, vec!["count_words".to_owned()]);
        // A name that only other documentation mentions is no evidence.
        assert_eq!(r.unknown[2].text, "ghost_fn");
    }

    #[test]
    fn standard_and_dependency_names_are_external_not_unknown() {
        let r = judge(
            "`HashMap`-free: `std::collections::HashMap`, `serde::Serialize`, `tokio::spawn()`, `Vec::new()`",
        );
        assert_eq!((r.cited, r.external), (0, 5), "{r:?}");
    }
}
