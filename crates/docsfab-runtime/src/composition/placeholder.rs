//! The `{{...}}` placeholders of a step's instructions: `{{steps.ID.output}}` (an earlier step's
//! answer) and, in a fan-out step, `{{item}}`, `{{item.FIELD}}` and `{{index}}`.

use docsfab_policy::host::shown_value;

/// A `{{steps.ID.output}}` placeholder found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRef {
    pub step_id: String,
    /// Byte range of the whole placeholder, braces included.
    pub range: std::ops::Range<usize>,
}

/// Finds every `{{steps.ID.output}}` in `text` (spaces inside the braces are allowed). Any other
/// `{{...}}`, or an unclosed `{{`, is an error naming it.
pub fn output_references(text: &str) -> Result<Vec<OutputRef>, String> {
    let mut refs = Vec::new();
    let mut at = 0;
    while let Some(open) = text[at..].find("{{").map(|i| at + i) {
        let Some(close) = text[open + 2..].find("}}").map(|i| open + 2 + i) else {
            return Err("an opening {{ has no closing }}".to_string());
        };
        let inner = text[open + 2..close].trim();
        let id = inner
            .strip_prefix("steps.")
            .and_then(|rest| rest.strip_suffix(".output"))
            .filter(|id| valid_id(id));
        match id {
            Some(id) => refs.push(OutputRef {
                step_id: id.to_string(),
                range: open..close + 2,
            }),
            None => {
                return Err(format!(
                    "the placeholder {} is not of the form {{{{steps.ID.output}}}}",
                    shown_value(&format!("{{{{{inner}}}}}"))
                ));
            }
        }
        at = close + 2;
    }
    Ok(refs)
}

/// What a `{{...}}` placeholder in instructions inserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placeholder {
    /// `{{steps.ID.output}}`: an earlier step's answer.
    Output(String),
    /// `{{item}}` (no members) or `{{item.A.B}}`: the fan-out element or a member of it.
    Item(Vec<String>),
    /// `{{index}}`: the fan-out element's 0-based position.
    Index,
}

/// A placeholder and where it sits in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceholderAt {
    pub kind: Placeholder,
    /// Byte range of the whole placeholder, braces included.
    pub range: std::ops::Range<usize>,
}

/// Finds every placeholder in `text` (spaces inside the braces are allowed). Anything else in
/// braces, or an unclosed `{{`, is an error naming it. Whether item placeholders are allowed is
/// the caller's question (only a fan-out step has an item).
pub fn placeholders(text: &str) -> Result<Vec<PlaceholderAt>, String> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(open) = text[at..].find("{{").map(|i| at + i) {
        let Some(close) = text[open + 2..].find("}}").map(|i| open + 2 + i) else {
            return Err("an opening {{ has no closing }}".to_string());
        };
        let inner = text[open + 2..close].trim();
        let Some(kind) = placeholder_kind(inner) else {
            return Err(format!(
                "the placeholder {} is not of the form {{{{steps.ID.output}}}}, {{{{item}}}}, {{{{item.FIELD}}}} or {{{{index}}}}",
                shown_value(&format!("{{{{{inner}}}}}"))
            ));
        };
        found.push(PlaceholderAt {
            kind,
            range: open..close + 2,
        });
        at = close + 2;
    }
    Ok(found)
}

fn placeholder_kind(inner: &str) -> Option<Placeholder> {
    if inner == "index" {
        return Some(Placeholder::Index);
    }
    if inner == "item" {
        return Some(Placeholder::Item(Vec::new()));
    }
    if let Some(members) = inner.strip_prefix("item.") {
        let members: Vec<String> = members.split('.').map(str::to_owned).collect();
        return members
            .iter()
            .all(|m| valid_id(m))
            .then_some(Placeholder::Item(members));
    }
    inner
        .strip_prefix("steps.")
        .and_then(|rest| rest.strip_suffix(".output"))
        .filter(|id| valid_id(id))
        .map(|id| Placeholder::Output(id.to_owned()))
}

/// A step id or member name: a letter or digit, then letters, digits, `_` and `-`.
pub(super) fn valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_references_finds_ranges() {
        let text = "a {{steps.x.output}} b {{ steps.y-2.output }}";
        let refs = output_references(text).unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(&text[refs[0].range.clone()], "{{steps.x.output}}");
        assert_eq!(refs[1].step_id, "y-2");
    }
}
