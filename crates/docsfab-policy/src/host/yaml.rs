//! Reading configuration YAML within bounds, and saying what is wrong in our own words: every
//! configuration file docsfab reads (host.yaml, compositions, the rules table) is parsed here
//! under one budget, and a refusal names the line and the key and never repeats a key-shaped
//! value.

use super::secret::{looks_like_key, url_carries_secret};
use crate::indent;

/// The largest configuration or composition file docsfab reads, in bytes (1 MiB). A real file
/// is a few kilobytes; the cap keeps a wrong path such as `/dev/zero` from exhausting memory.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// The deepest nesting of lists and mappings a configuration file may have.
pub const MAX_YAML_DEPTH: usize = 40;
/// The most YAML nodes (scalars, lists, mappings) one configuration file may hold.
pub const MAX_YAML_NODES: usize = 50_000;
/// The most aliases (`*name`) one configuration file may use; each can copy a whole subtree,
/// which is how a small file expands into a huge one.
pub const MAX_YAML_ALIASES: usize = 64;
/// The longest value a message repeats; the rest is cut, so a refusal stays one short line.
const SHOWN_VALUE_CHARS: usize = 40;

/// Parses one configuration document under the budget above. Every config file docsfab reads
/// (host.yaml, compositions, the rules table) goes through here, so they share the limits.
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_YAML_DEPTH,
            max_nodes: MAX_YAML_NODES,
            max_aliases: MAX_YAML_ALIASES,
            max_documents: 1,
            max_total_scalar_bytes: MAX_CONFIG_BYTES as usize,
        },
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options(text, options)
}

/// A value as a message may repeat it: quoted, escaped onto one line, cut to a few dozen
/// characters, and withheld entirely when it looks like a key. The one place that decides what
/// of a user's value reaches a message, so a shared redactor can replace the test later.
pub fn shown_value(value: &str) -> String {
    if looks_like_key(value) || url_carries_secret(value) {
        return "(withheld: looks like a key)".to_string();
    }
    let mut cut: String = value.chars().take(SHOWN_VALUE_CHARS).collect();
    if cut.len() < value.len() {
        cut.push_str("...");
    }
    format!("{cut:?}")
}

/// A list of names for a message: all of a short list (a mapping's allowed keys), else the
/// first few and how many more, so a file with a thousand providers cannot turn one refusal
/// into a page.
pub fn shown_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    const ALL_UP_TO: usize = 12;
    const SHOWN: usize = 5;
    let names: Vec<&str> = names.into_iter().collect();
    if names.is_empty() {
        return "none".to_string();
    }
    let shown = if names.len() <= ALL_UP_TO {
        names.len()
    } else {
        SHOWN
    };
    let mut out: Vec<String> = names.iter().take(shown).map(|n| shown_value(n)).collect();
    if names.len() > shown {
        out.push(format!("and {} more", names.len() - shown));
    }
    out.join(", ")
}

/// The key written on `line` of `text` (`  timeoutMs: -1` gives `timeoutMs`), for messages
/// about a value the YAML library refused without naming its key.
fn key_on_line(text: &str, line: u64) -> Option<&str> {
    let l = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let l = l.trim_start().trim_start_matches("- ").trim_start();
    let (key, _) = l.split_once(':')?;
    let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
    let plain = !key.is_empty()
        && key.len() <= 64
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    plain.then_some(key)
}

/// The value written after the key on `line` of `text`, if it is on that line.
fn value_on_line(text: &str, line: u64) -> Option<&str> {
    let l = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let (_, value) = l.split_once(':')?;
    let value = value.trim();
    (!value.is_empty()).then_some(value)
}

/// What a Rust type name the library reports means in a configuration file.
fn expected_in_words(expected: &str) -> String {
    let e = expected.to_ascii_lowercase();
    let whole = |bits: u32| format!("a whole number from 0 to {}", (1u128 << bits) - 1);
    if e.contains("u8") {
        whole(8)
    } else if e.contains("u16") {
        whole(16)
    } else if e.contains("u32") {
        whole(32)
    } else if e.contains("u64") || e.contains("usize") || e.contains("integer") {
        whole(64)
    } else if e.contains("f64") || e.contains("f32") || e.contains("float") {
        "a number".to_string()
    } else if e.contains("bool") {
        "true or false".to_string()
    } else if e.contains("str") || e.contains("char") {
        "text".to_string()
    } else if e.contains("seq") || e.contains("vec") || e.contains("array") || e.contains("list") {
        "a list".to_string()
    } else if e.contains("map") || e.contains("struct") || e.contains("object") {
        "a mapping of keys to values".to_string()
    } else if e.contains("variant") || e.contains("enum") {
        "one of the allowed words".to_string()
    } else {
        "a value of a different kind".to_string()
    }
}

/// The budget breach in words, with the limit that was passed.
fn breach_in_words(b: &serde_saphyr::budget::BudgetBreach) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    match b {
        B::Depth { .. } => format!(
            "the file nests lists and mappings more than {MAX_YAML_DEPTH} levels deep, the most docsfab reads"
        ),
        B::Nodes { .. } | B::Events { .. } => {
            format!("the file holds more than {MAX_YAML_NODES} values, the most docsfab reads")
        }
        B::Aliases { .. } | B::AliasAnchorRatio { .. } | B::Anchors { .. } => format!(
            "the file uses more than {MAX_YAML_ALIASES} aliases (*name), the most docsfab expands"
        ),
        B::Documents { .. } => {
            "the file holds more than one YAML document (a second --- line)".to_string()
        }
        B::ScalarBytes { .. } => format!(
            "the file's values add up to more than {MAX_CONFIG_BYTES} bytes, the most docsfab reads"
        ),
        _ => "the file is larger or more deeply built than docsfab reads".to_string(),
    }
}

/// The message for one library error, in our words: what is wrong and, where the line names
/// one, the key and the (redacted) value.
fn problem_in_words(e: &serde_saphyr::Error, text: &str, line: u64) -> String {
    use serde_saphyr::Error as E;
    let at_key = || {
        key_on_line(text, line)
            .map(|k| format!("key {k}: "))
            .unwrap_or_default()
    };
    let got = || {
        value_on_line(text, line)
            .map(|v| format!(", not {}", shown_value(v)))
            .unwrap_or_default()
    };
    match e {
        E::AliasError { error, .. } => problem_in_words(error, text, line),
        E::WithSnippet { error, .. } => problem_in_words(error, text, line),
        E::Budget { breach, .. } => breach_in_words(breach),
        E::MultipleDocuments { .. } => {
            "the file holds more than one YAML document (a second --- line)".to_string()
        }
        E::SerdeUnknownField {
            field, expected, ..
        } => format!(
            "unknown key {} (allowed here: {})",
            shown_value(field),
            shown_list(expected.iter().copied())
        ),
        E::SerdeMissingField { field, .. } => format!("the required key {field} is missing"),
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => format!(
            "{}{} is not allowed here (use one of: {})",
            at_key(),
            shown_value(variant),
            shown_list(expected.iter().copied())
        ),
        E::DuplicateMappingKey { key, .. } => match key {
            Some(k) => format!(
                "duplicate key {}: it appears twice in one mapping",
                shown_value(k)
            ),
            None => "duplicate key: a key appears twice in one mapping".to_string(),
        },
        E::SerdeInvalidType { expected, .. }
        | E::SerdeInvalidValue { expected, .. }
        | E::SerdeInvalidLength { expected, .. } => {
            format!(
                "{}expected {}{}",
                at_key(),
                expected_in_words(expected),
                got()
            )
        }
        E::InvalidScalar { ty, .. } => {
            format!("{}expected {}{}", at_key(), expected_in_words(ty), got())
        }
        E::NonFiniteFloat { .. } => format!("{}expected a finite number{}", at_key(), got()),
        E::NullIntoString { .. } => format!("{}expected text, not an empty value", at_key()),
        E::InvalidBooleanStrict { .. } => format!("{}expected true or false{}", at_key(), got()),
        E::ExternallyTaggedEnumExpectedScalarOrMapping { .. }
        | E::ExpectedStringKeyForExternallyTaggedEnum { .. }
        | E::UnexpectedValueForUnitEnumVariant { .. }
        | E::TaggedEnumMismatch { .. }
        | E::SerdeVariantId { .. } => {
            format!("{}expected one of the allowed words{}", at_key(), got())
        }
        E::UnsupportedTag { .. } | E::TaggedScalarCannotDeserializeIntoString { .. } => {
            format!(
                "{}YAML tags (!name) are not used in this file; remove the tag",
                at_key()
            )
        }
        E::InvalidUtf8Input | E::BinaryNotUtf8 { .. } => "the file is not UTF-8 text".to_string(),
        E::Eof { .. } => "the file ends before the document is complete".to_string(),
        E::UnknownAnchor { .. } => "an alias (*name) refers to no anchor (&name)".to_string(),
        E::MergeKeyNotAllowed { .. } | E::MergeValueNotMapOrSeqOfMaps { .. } => {
            "merge keys (<<) are not used in this file; write the keys out".to_string()
        }
        E::IndentationError { .. } => {
            "the indentation does not line up with the lines above".to_string()
        }
        other => {
            // Scanner and parser messages ("did not find expected key") are plain words; keep
            // them unless they carry library or Rust vocabulary.
            let text = other.to_string();
            let first = text.lines().next().unwrap_or("").trim();
            let first = first.split(" at line ").next().unwrap_or(first);
            if first == "expected mapping start" {
                format!("{}expected a mapping of keys to values{}", at_key(), got())
            } else if first == "expected sequence start" {
                format!("{}expected a list{}", at_key(), got())
            } else if plain_words(first) {
                format!("{}the YAML is not well formed ({first})", at_key())
            } else {
                format!("{}the YAML is not well formed here", at_key())
            }
        }
    }
}

/// Whether a library message is plain enough to show an operator.
fn plain_words(text: &str) -> bool {
    const INTERNAL: &[&str] = &[
        "serde", "u8", "u16", "u32", "u64", "i64", "usize", "f64", "option<", "from_str", "budget",
        "struct", "enum", "deserial", "{", "`", "::", "policy", "variant",
    ];
    let lower = text.to_ascii_lowercase();
    !text.is_empty()
        && text.len() <= 120
        && !INTERNAL.iter().any(|w| lower.contains(w))
        && !looks_like_key(text)
}

/// The key a library error refused as unknown, if that is what it refused.
pub fn unknown_key(e: &serde_saphyr::Error) -> Option<String> {
    match e.without_snippet() {
        serde_saphyr::Error::SerdeUnknownField { field, .. } => Some(field.clone()),
        _ => None,
    }
}

/// Splits a serde-saphyr error into line, column and a message in our own words (no library
/// type names, no values that look like keys). Shared with the rules table and the composition
/// parser so every file error reads the same. `text` is the file, to name the key at fault.
pub fn yaml_error_parts(e: &serde_saphyr::Error, text: &str) -> (u64, u64, String) {
    let inner = e.without_snippet();
    let (line, column) = inner
        .location()
        .map(|l| (l.line(), l.column()))
        .filter(|&(l, _)| l > 0)
        .unwrap_or((1, 1));
    // The library names where it gave up. A mis-indented line above that is the real fault;
    // so is one inside the node the library complains about (a key indented under a value reads
    // as more of that value), and one anywhere when a required key is "missing", since the
    // library notices that where the mapping ends, often before the misplaced key.
    let missing = match inner {
        serde_saphyr::Error::SerdeMissingField { field, .. } => Some(*field),
        _ => None,
    };
    let misplaced = missing.and_then(|field| indent::misplaced_key(text, field, column));
    let misaligned = || {
        indent::first_misalignment(text).filter(|m| {
            missing.is_some() || m.line <= line || indent::inside_node(text, line, m.line)
        })
    };
    if let Some(m) = misplaced.or_else(misaligned) {
        return (m.line, m.column, m.message);
    }
    (line, column, problem_in_words(inner, text, line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardening_unclear_refusals_values_are_cut_and_keys_withheld() {
        assert_eq!(shown_value("abc"), "\"abc\"");
        let long = shown_value(&"x".repeat(5000));
        assert!(long.len() < 50 && long.ends_with("...\""), "{long}");
        assert_eq!(shown_value("a\nb"), "\"a\\nb\"");
        let key = "sk-proj-aB3dE5fG7hJ9kL1mN3pQ5";
        assert!(!shown_value(key).contains("aB3d"));
        let names: Vec<String> = (0..1000).map(|i| format!("p{i}")).collect();
        let list = shown_list(names.iter().map(String::as_str));
        assert!(list.ends_with("and 995 more") && list.len() < 60, "{list}");
        assert_eq!(shown_list([]), "none");
        // A mapping's allowed keys are listed in full, so a misspelt key's right spelling shows.
        let eight = shown_list(["a", "b", "c", "d", "e", "f", "g", "h"]);
        assert!(
            eight.ends_with("\"h\"") && !eight.contains("more"),
            "{eight}"
        );
    }
}
