//! Finding the line a mis-indented YAML file actually goes wrong on.
//!
//! A YAML library reports where its parser or the deserializer gave up, which for a key indented
//! one level too shallow is often the end of the mapping above it ("the required key apiKeyEnv
//! is missing" on the line before the key that is right there, just misplaced). This module reads
//! the file's indentation the way a person does and names the first line that does not line up:
//! a key indented between two levels, a key indented under a line that already has a value, or a
//! required key that sits at the wrong depth. It is consulted only after a parse has failed, so a
//! layout it misreads can never reject a file the library accepts.

/// A line whose indentation is wrong, in the words the operator reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misalignment {
    /// 1-based.
    pub line: u64,
    /// 1-based column of the line's first character.
    pub column: u64,
    pub message: String,
}

/// The first line of `text` whose indentation cannot be what the author meant, if any.
pub fn first_misalignment(text: &str) -> Option<Misalignment> {
    let mut layout = Layout::default();
    for (index, raw) in text.lines().enumerate() {
        if let Some(found) = layout.step(index as u64 + 1, raw) {
            return Some(found);
        }
    }
    None
}

/// When the library says a required `key` is missing, the line where that key is written at
/// another depth than the mapping's other keys, with a message saying so. `mapping_column` is
/// the (1-based) column the library reported, where the mapping's keys start.
pub fn misplaced_key(text: &str, key: &str, mapping_column: u64) -> Option<Misalignment> {
    let want = usize::try_from(mapping_column.checked_sub(1)?).ok()?;
    text.lines().enumerate().find_map(|(index, raw)| {
        let indent = leading_spaces(raw);
        let content = raw[indent..].trim_end();
        let written = content
            .strip_prefix(key)
            .is_some_and(|rest| rest.starts_with(':'));
        (written && indent != want).then(|| Misalignment {
            line: index as u64 + 1,
            column: indent as u64 + 1,
            message: format!(
                "{key} is indented {indent} spaces, but the other keys of its mapping are \
                 indented {want}, so it belongs to another mapping and the required key {key} is \
                 missing"
            ),
        })
    })
}

/// Whether every content line after `start` up to `line` is indented deeper than `start`, so
/// that a parser reads them as part of the node written on `start`.
pub fn inside_node(text: &str, start: u64, line: u64) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    let at = |n: u64| {
        usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| lines.get(i))
    };
    let Some(first) = at(start) else {
        return false;
    };
    let base = leading_spaces(first);
    line > start
        && (start + 1..=line)
            .all(|n| at(n).is_some_and(|l| l.trim().is_empty() || leading_spaces(l) > base))
}

/// What the lines read so far leave open.
#[derive(Debug, Default)]
struct Layout {
    /// Indentation of the keys (or list items) of every open block, outermost first.
    levels: Vec<usize>,
    /// The previous content line ended with `key:` or `-`: the next line may go deeper.
    opened: bool,
    /// The previous content line was `key: plain text`: a deeper line without a key continues it.
    plain_value: bool,
    /// Inside a `|` or `>` block scalar whose key is indented this much: deeper lines are text.
    block_scalar: Option<usize>,
    /// Unclosed `[` and `{` of a flow collection spanning lines: their lines are not checked.
    flow_depth: i64,
    /// The last content line, for messages.
    last_line: u64,
}

impl Layout {
    fn step(&mut self, line: u64, raw: &str) -> Option<Misalignment> {
        let indent = leading_spaces(raw);
        let content = strip_comment(raw[indent..].trim_end());
        if content.is_empty() {
            return None;
        }
        if let Some(parent) = self.block_scalar {
            if indent > parent {
                return None;
            }
            self.block_scalar = None;
        }
        if self.flow_depth > 0 {
            self.flow_depth += flow_balance(content);
            return None;
        }
        if content == "---" || content == "..." {
            *self = Layout::default();
            return None;
        }
        if raw[indent..].starts_with('\t') {
            return Some(Misalignment {
                line,
                column: indent as u64 + 1,
                message: "the line is indented with a tab; YAML indents with spaces only"
                    .to_string(),
            });
        }
        let deeper = self.levels.last().is_none_or(|&t| indent > t);
        if deeper && self.plain_value && !looks_like_key(content) {
            // The continuation of a multi-line plain value, which YAML allows.
            return None;
        }
        let found = self.check(line, indent);
        self.read(indent, content);
        self.last_line = line;
        found
    }

    /// Whether a line at `indent` fits the blocks open above it.
    fn check(&mut self, line: u64, indent: usize) -> Option<Misalignment> {
        let top = self.levels.last().copied();
        let deeper = top.is_none_or(|t| indent > t);
        if deeper {
            if self.opened || top.is_none() {
                self.levels.push(indent);
                return None;
            }
            return Some(Misalignment {
                line,
                column: indent as u64 + 1,
                message: format!(
                    "the line is indented further than line {}, which already has a value; \
                     indent it like the keys beside it",
                    self.last_line
                ),
            });
        }
        while self.levels.last().is_some_and(|&t| t > indent) {
            self.levels.pop();
        }
        if self.levels.last() == Some(&indent) {
            return None;
        }
        let shown: Vec<String> = self.levels.iter().map(|l| l.to_string()).collect();
        Some(Misalignment {
            line,
            column: indent as u64 + 1,
            message: format!(
                "the line is indented {indent} spaces, which lines up with no key above it \
                 (those are indented {}); indent it like the keys it belongs with",
                if shown.is_empty() {
                    "0".to_string()
                } else {
                    shown.join(" or ")
                }
            ),
        })
    }

    /// Notes what a line that fits leaves open for the next one.
    fn read(&mut self, indent: usize, content: &str) {
        let (key_indent, rest) = match content.strip_prefix('-') {
            Some(item) if item.is_empty() || item.starts_with(' ') => {
                let inner = item.trim_start();
                if inner.is_empty() {
                    self.opened = true;
                    self.plain_value = false;
                    return;
                }
                // `- key: value` opens a mapping whose keys line up with `key`.
                let column = indent + 1 + (item.len() - inner.len());
                self.levels.push(column);
                (column, inner)
            }
            _ => (indent, content),
        };
        let value = match split_key(rest) {
            Some((_, value)) => value,
            None => {
                self.opened = false;
                self.plain_value = false;
                self.flow_depth = flow_balance(rest).max(0);
                return;
            }
        };
        self.opened = value.is_empty();
        self.plain_value =
            !value.is_empty() && !value.starts_with(['"', '\'', '[', '{', '|', '>', '&', '*', '!']);
        if value.starts_with(['|', '>']) {
            self.block_scalar = Some(key_indent);
        }
        self.flow_depth = flow_balance(value).max(0);
    }
}

fn leading_spaces(raw: &str) -> usize {
    raw.len() - raw.trim_start_matches(' ').len()
}

/// The line without a trailing ` # comment` (a `#` inside quotes is kept), or empty for a line
/// that is only a comment.
fn strip_comment(content: &str) -> &str {
    if content.starts_with('#') {
        return "";
    }
    let mut quote = None;
    let mut previous = ' ';
    for (at, c) in content.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if previous == ' ' || previous == '\t' => {
                return content[..at].trim_end();
            }
            _ => {}
        }
        previous = c;
    }
    content
}

/// `key: value` split at the mapping colon (a colon followed by a space or the end), outside
/// quotes; `None` for a line that is not a key.
fn split_key(content: &str) -> Option<(&str, &str)> {
    let mut quote = None;
    let bytes = content.as_bytes();
    for (at, c) in content.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') if at == 0 => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '[' | '{') if at == 0 => return None,
            (None, ':') if bytes.get(at + 1).is_none_or(|b| *b == b' ') => {
                return Some((&content[..at], content[at + 1..].trim_start()));
            }
            _ => {}
        }
    }
    None
}

fn looks_like_key(content: &str) -> bool {
    split_key(content).is_some()
}

/// Opened minus closed brackets of a flow collection on one line, ignoring quoted text.
fn flow_balance(content: &str) -> i64 {
    let mut quote = None;
    let mut depth = 0i64;
    for c in content.chars() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            _ => {}
        }
    }
    depth
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of(text: &str) -> Option<u64> {
        first_misalignment(text).map(|m| m.line)
    }

    #[test]
    fn a_key_between_two_levels_is_named() {
        let text = "providers:\n  default:\n    api: openai-chat\n    baseUrl: http://h/v1\n   model: m\n    apiKeyEnv: KEY\n";
        let m = first_misalignment(text).unwrap();
        assert_eq!((m.line, m.column), (5, 4));
        assert!(m.message.contains("indented 3 spaces"), "{}", m.message);
        assert!(m.message.contains("0 or 2"), "{}", m.message);
    }

    #[test]
    fn a_key_under_a_line_with_a_value_is_named() {
        let text = "providers:\n  default:\n    api: openai-chat\n    baseUrl: http://h:9/v1\n      model: m\n";
        let m = first_misalignment(text).unwrap();
        assert_eq!(m.line, 5);
        assert!(m.message.contains("line 4"), "{}", m.message);
    }

    #[test]
    fn a_key_one_level_too_shallow_makes_the_next_line_wrong() {
        let text = "providers:\n  default:\n    api: openai-chat\n  model: m\n    apiKeyEnv: KEY\n";
        assert_eq!(line_of(text), Some(5));
    }

    #[test]
    fn a_misplaced_required_key_is_found_where_it_is_written() {
        let text = "providers:\n  default:\n    api: openai-chat\n    model: m\n  apiKeyEnv: KEY\n";
        assert_eq!(line_of(text), None, "the layout itself is valid YAML");
        let m = misplaced_key(text, "apiKeyEnv", 5).unwrap();
        assert_eq!((m.line, m.column), (5, 3));
        assert!(m.message.contains("indented 2 spaces"), "{}", m.message);
        assert_eq!(misplaced_key(text, "apiKeyEnv", 3), None);
        assert_eq!(misplaced_key(text, "baseUrl", 5), None);
    }

    #[test]
    fn lines_indented_under_a_value_belong_to_its_node() {
        let text = "a:\n  b: read\n   c: x\n\n    d: y\n  e: 1\n";
        assert!(inside_node(text, 2, 3));
        assert!(inside_node(text, 2, 5));
        assert!(!inside_node(text, 2, 6));
        assert!(!inside_node(text, 2, 2));
        assert!(!inside_node(text, 9, 10));
    }

    #[test]
    fn tabs_are_named() {
        assert_eq!(line_of("a:\n\tb: 1\n"), Some(2));
    }

    #[test]
    fn well_formed_layouts_pass() {
        let texts = [
            include_str!("../retry-policy.yaml"),
            "steps:\n- id: a\n  access: read\n- id: b\n  tools: [a, b]\n",
            "key: a long value\n  that goes on\n  over lines\nnext: 1\n",
            "text: |\n  indented\n    more\n  back\nnext: >-\n    folded\nend: 1\n",
            "flow: [a,\n   b,\n      c]\nafter: {x: 1,\n y: 2}\nlast: 1\n",
            "url: \"http://h:9/#x\"  # comment: here\n  # comment deeper\nb: 1\n",
            "a:\n  - b: 1\n    c:\n      - d\n      - e\n  - f\n",
            "---\na: 1\n...\n",
        ];
        for text in texts {
            assert_eq!(first_misalignment(text), None, "{text}");
        }
    }
}
