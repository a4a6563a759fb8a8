//! Fan-out steps, the parts that need no provider: finding the array a `forEach` names in an
//! earlier answer, rendering one instance's instructions, naming instances, and the map of which
//! instance owns which written path. The executor schedules the instances
//! (`executor::instances`).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use serde_json::Value;

use crate::composition::{FanOut, Placeholder, placeholders};

/// The record's and the terminal's name for instance `index` of step `step`: `pages[3]`.
pub fn instance_id(step: &str, index: usize) -> String {
    format!("{step}[{index}]")
}

/// The elements a fan-out step runs for, read from the earlier answers (`outputs`, by step id,
/// as the text later steps see). The error is one sentence saying what was found instead.
pub fn resolve_items(
    fan: &FanOut,
    outputs: &BTreeMap<String, String>,
) -> Result<Vec<Value>, String> {
    let source = fan.source();
    let answer: Value = outputs
        .get(&fan.step_id)
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or_else(|| {
            format!(
                "forEach {source} found no JSON answer from step {}",
                fan.step_id
            )
        })?;
    let mut at = &answer;
    for member in &fan.path {
        at = at.get(member).ok_or_else(|| {
            format!(
                "forEach {source} names a value that is missing: the answer of step {} has no {member} there",
                fan.step_id
            )
        })?;
    }
    match at {
        Value::Array(items) => Ok(items.clone()),
        other => Err(format!(
            "forEach {source} names {}, not an array",
            kind_of(other)
        )),
    }
}

/// A JSON value's kind with its article, for messages.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One instance's instructions: `{{steps.ID.output}}` as for any step, `{{item}}` as the
/// element's JSON, `{{item.FIELD}}` as that member (a string as its text, anything else as
/// JSON), `{{index}}` as the 0-based position. A member the element lacks is an error sentence.
pub fn render_instructions(
    template: &str,
    item: &Value,
    index: usize,
    outputs: &BTreeMap<String, String>,
) -> Result<String, String> {
    // The composition was checked at start-up, so the placeholders parse.
    let found = placeholders(template)?;
    let mut out = String::with_capacity(template.len());
    let mut at = 0;
    for p in found {
        out.push_str(&template[at..p.range.start]);
        match &p.kind {
            Placeholder::Output(id) => out.push_str(outputs.get(id).map_or("", String::as_str)),
            Placeholder::Index => out.push_str(&index.to_string()),
            Placeholder::Item(members) => out.push_str(&member_text(item, members)?),
        }
        at = p.range.end;
    }
    out.push_str(&template[at..]);
    Ok(out)
}

fn member_text(item: &Value, members: &[String]) -> Result<String, String> {
    let mut at = item;
    for (depth, m) in members.iter().enumerate() {
        at = at.get(m).ok_or_else(|| {
            format!(
                "the element has no member {} for {{{{item.{}}}}}",
                members[..=depth].join("."),
                members.join(".")
            )
        })?;
    }
    Ok(match at {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// What a later `{{steps.ID.output}}` of a fan-out step inserts: a JSON array with one entry per
/// element in index order, the instance's answer object, or its final text as a JSON string for
/// a step whose answer is text (a write step), or `null` for an instance that has none.
pub fn output_array(answers: Vec<Option<Value>>) -> String {
    Value::Array(
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Value::Null))
            .collect(),
    )
    .to_string()
}

/// Which instance of one fan-out step owns each path it wrote or is about to write. Instances
/// share one workspace; a path owned by one is refused to its siblings, so no two instances
/// ever snapshot or restore the same file (a failed instance's restore touches only its own).
#[derive(Debug, Default)]
pub struct WriteClaims {
    owners: Mutex<BTreeMap<String, String>>,
}

impl WriteClaims {
    /// Claims `path` for `instance`, or says in one sentence which sibling owns it.
    pub fn claim(&self, path: &str, instance: &str) -> Result<(), String> {
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        match owners.get(path) {
            Some(owner) if owner != instance => Err(format!(
                "{path} was written by sibling {owner}; write a different file"
            )),
            Some(_) => Ok(()),
            None => {
                owners.insert(path.to_owned(), instance.to_owned());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fan(path: &[&str]) -> FanOut {
        FanOut {
            step_id: "outline".into(),
            path: path.iter().map(|s| (*s).to_owned()).collect(),
            concurrency: 4,
        }
    }

    fn outputs(answer: Value) -> BTreeMap<String, String> {
        BTreeMap::from([("outline".to_owned(), answer.to_string())])
    }

    #[test]
    fn resolves_the_named_array() {
        let out = outputs(json!({"doc": {"modules": [{"name": "a"}, 2]}}));
        let items = resolve_items(&fan(&["doc", "modules"]), &out).unwrap();
        assert_eq!(items, vec![json!({"name": "a"}), json!(2)]);
        let empty = resolve_items(&fan(&["m"]), &outputs(json!({"m": []}))).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn missing_or_non_array_values_are_one_sentence() {
        let out = outputs(json!({"modules": "a, b"}));
        let e = resolve_items(&fan(&["modules"]), &out).unwrap_err();
        assert_eq!(
            e,
            "forEach steps.outline.output.modules names a string, not an array"
        );
        let e = resolve_items(&fan(&["nope"]), &out).unwrap_err();
        assert!(e.contains("missing") && e.contains("no nope"), "{e}");
        let e = resolve_items(&fan(&[]), &out).unwrap_err();
        assert!(e.ends_with("an object, not an array"), "{e}");
    }

    #[test]
    fn renders_item_members_index_and_outputs() {
        let item = json!({"name": "core", "n": 3, "tags": ["x"], "in": {"deep": "d"}});
        let out = outputs(json!({"k": 1}));
        let text = render_instructions(
            "{{index}}: {{item.name}} {{ item.n }} {{item.tags}} {{item.in.deep}} / {{steps.outline.output}} / {{item}}",
            &item,
            7,
            &out,
        )
        .unwrap();
        assert_eq!(text, format!("7: core 3 [\"x\"] d / {{\"k\":1}} / {item}"));
    }

    #[test]
    fn a_missing_member_fails_the_instance_with_its_name() {
        let e = render_instructions(
            "{{item.purpose}}",
            &json!({"name": "a"}),
            0,
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(e, "the element has no member purpose for {{item.purpose}}");
        let e =
            render_instructions("{{item.name}}", &json!("plain"), 0, &BTreeMap::new()).unwrap_err();
        assert!(e.contains("no member name"), "{e}");
    }

    #[test]
    fn a_sibling_cannot_claim_a_path_its_owner_can_reclaim() {
        let claims = WriteClaims::default();
        claims.claim("docs/a.md", "pages[0]").unwrap();
        claims.claim("docs/a.md", "pages[0]").unwrap();
        assert_eq!(
            claims.claim("docs/a.md", "pages[2]").unwrap_err(),
            "docs/a.md was written by sibling pages[0]; write a different file"
        );
        claims.claim("docs/b.md", "pages[2]").unwrap();
    }

    #[test]
    fn instance_output_array_keeps_index_order_with_nulls() {
        let text = output_array(vec![Some(json!({"a": 1})), None, Some(json!("t"))]);
        assert_eq!(text, r#"[{"a":1},null,"t"]"#);
        assert_eq!(instance_id("pages", 12), "pages[12]");
    }
}
