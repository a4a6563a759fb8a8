//! Reading a composition file: strict parsing (an unknown field anywhere is refused with the
//! file, the field and the line; CFG-6), then the meaning of each step checked against the steps
//! before it, each refusal one sentence that says what to change.

use docsfab_policy::host::{
    check_model, from_yaml, raw_value, shown_value, unknown_key, yaml_error_parts,
};
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::placeholder::{OutputRef, Placeholder, placeholders, valid_id};
use super::{
    Access, Composition, CompositionError, Contract, DEFAULT_CONCURRENCY, DEFAULT_PROVIDER, FanOut,
    MAX_CONCURRENCY, ModelLimits, Step, Tool,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawComposition {
    name: Spanned<String>,
    provider: Option<Spanned<String>>,
    model: Option<Spanned<String>>,
    limits: Option<RawLimits>,
    steps: Spanned<Vec<RawStep>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawLimits {
    // Read as any value so that a wrong one is refused by name with its allowed range.
    timeout_ms: Option<Spanned<serde_json::Value>>,
    max_turns: Option<Spanned<serde_json::Value>>,
    max_output_tokens: Option<Spanned<serde_json::Value>>,
    source_read_bytes: Option<Spanned<serde_json::Value>>,
    max_run_tokens: Option<Spanned<serde_json::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawStep {
    id: Spanned<String>,
    access: Access,
    instructions: Option<Spanned<String>>,
    #[serde(default)]
    tools: Vec<Spanned<Tool>>,
    pages: Option<Spanned<Vec<Spanned<String>>>>,
    contract: Option<Spanned<RawContract>>,
    write_roots: Option<Spanned<Vec<Spanned<String>>>>,
    for_each: Option<Spanned<String>>,
    // Read as any value so that a wrong one is refused by name with its allowed range.
    concurrency: Option<Spanned<serde_json::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContract {
    schema: serde_json::Value,
    grounding: Option<Vec<String>>,
}

impl Composition {
    /// Parses and checks the text of a composition file; `path` is only used in messages.
    pub fn parse(text: &str, path: &str) -> Result<Composition, CompositionError> {
        let raw: RawComposition = from_yaml(text).map_err(|e| {
            let (line, column, message) = yaml_error_parts(&e, text);
            let field = unknown_key(&e);
            let remedy = match &field {
                Some(f) if f.to_ascii_lowercase().contains("retr") => {
                    "; a composition has no retry field (the host sets retries: \
                     DOCSFAB_READ_ONLY_MAX_RETRIES or host.yaml), so remove it"
                }
                Some(_) => "; remove the field or correct its spelling",
                None => "; fix the file",
            };
            CompositionError {
                path: path.to_string(),
                line: Some(line),
                column: Some(column),
                field,
                message: format!("{message}{remedy}"),
            }
        })?;
        let err = |line: u64, field: String, message: String| CompositionError {
            path: path.to_string(),
            line: Some(line),
            column: None,
            field: Some(field),
            message,
        };

        let name = raw.name.value.trim().to_string();
        if name.is_empty() {
            return Err(err(
                raw.name.defined.line(),
                "name".into(),
                "the composition name is empty; give it a name".into(),
            ));
        }
        let provider = match raw.provider {
            Some(p) if p.value.trim().is_empty() => {
                return Err(err(
                    p.defined.line(),
                    "provider".into(),
                    "the provider name is empty; name a provider from host.yaml or remove the field to use \"default\"".into(),
                ));
            }
            Some(p) => p.value.trim().to_string(),
            None => DEFAULT_PROVIDER.to_string(),
        };
        let model = match raw.model {
            Some(m) if m.value.trim().is_empty() => {
                return Err(err(
                    m.defined.line(),
                    "model".into(),
                    "the model name is empty; name a model or remove the field to use the provider's model".into(),
                ));
            }
            Some(m) => {
                if let Err(problem) = check_model(m.value.trim()) {
                    return Err(err(m.defined.line(), "model".into(), problem.to_string()));
                }
                Some(m.value.trim().to_string())
            }
            None => None,
        };
        let limits = check_limits(raw.limits, text, &err)?;

        if raw.steps.value.is_empty() {
            return Err(err(
                raw.steps.defined.line(),
                "steps".into(),
                "the composition has no steps; add at least one".into(),
            ));
        }
        let all_ids: Vec<String> = raw
            .steps
            .value
            .iter()
            .map(|s| s.id.value.trim().to_string())
            .collect();
        let mut steps: Vec<Step> = Vec::with_capacity(raw.steps.value.len());
        for (i, s) in raw.steps.value.into_iter().enumerate() {
            let step = check_step(i, s, &steps, &all_ids, &err)?;
            steps.push(step);
        }

        Ok(Composition {
            name,
            provider,
            model,
            limits,
            steps,
        })
    }
}

/// Where a step check reports: the step's index in the file, its id as messages show it (cut
/// short, and withheld if key-shaped), and the error builder of the file.
struct StepSite<'a, E> {
    i: usize,
    shown_id: String,
    err: &'a E,
}

impl<E: Fn(u64, String, String) -> CompositionError> StepSite<'_, E> {
    /// The error at `line` about field `f` of this step.
    fn fail(&self, line: u64, f: &str, message: String) -> CompositionError {
        (self.err)(line, format!("steps[{}].{f}", self.i), message)
    }
}

/// Checks step `i` of the file against the steps before it (`earlier`); `all_ids` are the ids of
/// every step, to say whether a reference to a step not yet run names a later one.
fn check_step(
    i: usize,
    s: RawStep,
    earlier: &[Step],
    all_ids: &[String],
    err: &impl Fn(u64, String, String) -> CompositionError,
) -> Result<Step, CompositionError> {
    let line = s.id.defined.line();
    let id = s.id.value.trim().to_string();
    // Every message below names the step by this form: cut short, and withheld if key-shaped.
    let site = StepSite {
        i,
        shown_id: shown_value(&id),
        err,
    };
    check_id(&site, &id, line, earlier)?;
    if s.pages.is_some() {
        return check_pages_step(&site, id, line, s, earlier);
    }
    let Some(instructions) = s.instructions else {
        return Err(site.fail(
            line,
            "instructions",
            format!(
                "step {} has no instructions; say what the step must do (only a step with pages: needs none)",
                site.shown_id
            ),
        ));
    };
    check_instructions(&site, &id, &instructions, earlier, all_ids)?;
    let tools = check_tools(&site, &s.tools, s.access)?;
    let write_roots = check_write_roots(&site, s.write_roots, s.access)?;
    if s.access == Access::Write && tools.contains(&Tool::WriteFile) && write_roots.is_empty() {
        return Err(site.fail(
            line,
            "writeRoots",
            format!(
                "write step {shown_id} offers write_file but has no writeRoots; list the paths it may write, such as [docs/]",
                shown_id = site.shown_id
            ),
        ));
    }
    let contract = match s.contract {
        Some(c) => Some(check_contract(&site, c)?),
        None => None,
    };
    let for_each = check_for_each(&site, s.for_each, s.concurrency, earlier, all_ids)?;
    check_item_placeholders(&site, &instructions, for_each.is_some())?;

    Ok(Step {
        id,
        access: s.access,
        instructions: instructions.value,
        tools,
        contract,
        write_roots,
        line,
        fan_out: for_each,
        pages: Vec::new(),
    })
}

/// A pages step (docs/pages.md): a write step with write roots whose `pages` name earlier
/// read-only steps that answer pages, each grounded, so that no page reaches the tree before
/// its contract and its grounding passed.
fn check_pages_step<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    id: String,
    line: u64,
    s: RawStep,
    earlier: &[Step],
) -> Result<Step, CompositionError> {
    let shown_id = &site.shown_id;
    refuse_model_fields(site, line, &s)?;
    let (access, instructions) = (s.access, s.instructions);
    let pages = s.pages.expect("checked by the caller");
    if access != Access::Write {
        return Err(site.fail(
            line,
            "access",
            format!("step {shown_id} writes pages, so its access must be write; set access: write"),
        ));
    }
    if let Some(i) = instructions {
        return Err(site.fail(
            i.defined.line(),
            "instructions",
            format!(
                "step {shown_id} writes pages and sends no request, so it has no instructions; remove them"
            ),
        ));
    }
    let write_roots = check_write_roots(site, s.write_roots, access)?;
    if write_roots.is_empty() {
        return Err(site.fail(
            line,
            "writeRoots",
            format!(
                "step {shown_id} writes pages but has no writeRoots; list the paths its pages may be written under, such as [docs/]"
            ),
        ));
    }
    if pages.value.is_empty() {
        return Err(site.fail(
            pages.defined.line(),
            "pages",
            format!(
                "step {shown_id} has an empty pages list; name the steps whose pages it writes"
            ),
        ));
    }
    let mut from = Vec::new();
    for source in pages.value {
        let name = source.value.trim().to_owned();
        check_page_source(site, &name, source.defined.line(), earlier)?;
        if !from.contains(&name) {
            from.push(name);
        }
    }
    Ok(Step {
        id,
        access,
        instructions: String::new(),
        tools: Vec::new(),
        contract: None,
        write_roots,
        line,
        fan_out: None,
        pages: from,
    })
}

/// A page source is an earlier read-only step whose contract requires `path` and `markdown`
/// and grounds `markdown`.
fn check_page_source<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    name: &str,
    line: u64,
    earlier: &[Step],
) -> Result<(), CompositionError> {
    let shown_id = &site.shown_id;
    let fail = |why: &str| {
        site.fail(
            line,
            "pages",
            format!(
                "pages of step {shown_id} names step {}, {why}",
                shown_value(name)
            ),
        )
    };
    let Some(source) = earlier.iter().find(|e| e.id == name) else {
        return Err(fail(
            "which is not a step listed before it; name an earlier step",
        ));
    };
    let Some(contract) = source
        .contract
        .as_ref()
        .filter(|_| source.access == Access::ReadOnly)
    else {
        return Err(fail(
            "which answers no JSON object (only a read-only step with a contract does); point it at a step that answers pages",
        ));
    };
    let required: Vec<&str> = contract
        .schema
        .get("required")
        .and_then(serde_json::Value::as_array)
        .map(|r| r.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    if !(required.contains(&"path") && required.contains(&"markdown")) {
        return Err(fail(
            "whose contract does not require path and markdown; add required: [path, markdown] to its schema",
        ));
    }
    if !contract.grounding.iter().any(|m| m == "markdown") {
        return Err(fail(
            "whose contract does not ground markdown, and no page may reach the tree unchecked; add grounding: [markdown] to its contract",
        ));
    }
    Ok(())
}

/// A pages step has no tools, contract or `forEach`: it asks no model.
fn refuse_model_fields<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    line: u64,
    s: &RawStep,
) -> Result<(), CompositionError> {
    let field = match (
        s.tools.is_empty(),
        s.contract.is_some(),
        s.for_each.is_some() || s.concurrency.is_some(),
    ) {
        (false, _, _) => "tools",
        (_, true, _) => "contract",
        (_, _, true) => "forEach",
        _ => return Ok(()),
    };
    Err(site.fail(
        line,
        field,
        format!(
            "step {} writes pages and asks no model, so it has no {field}; remove it",
            site.shown_id
        ),
    ))
}

/// The id is well formed and not used by an earlier step.
fn check_id<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    id: &str,
    line: u64,
    earlier: &[Step],
) -> Result<(), CompositionError> {
    let shown_id = &site.shown_id;
    if !valid_id(id) {
        return Err(site.fail(
            line,
            "id",
            format!(
                "step id {shown_id} must start with a letter or digit and use only letters, digits, _ and -; rename it"
            ),
        ));
    }
    if let Some(first) = earlier.iter().find(|e| e.id == id) {
        return Err(site.fail(
            line,
            "id",
            format!(
                "step id {shown_id} is already used by the step on line {}; give each step its own id",
                first.line
            ),
        ));
    }
    Ok(())
}

/// The instructions are not empty and refer only to the outputs of earlier steps.
fn check_instructions<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    id: &str,
    instructions: &Spanned<String>,
    earlier: &[Step],
    all_ids: &[String],
) -> Result<(), CompositionError> {
    let shown_id = &site.shown_id;
    let line = instructions.defined.line();
    if instructions.value.trim().is_empty() {
        return Err(site.fail(
            line,
            "instructions",
            format!("step {shown_id} has empty instructions; say what the step must do"),
        ));
    }
    let refs = placeholders(&instructions.value).map_err(|m| {
        site.fail(
            line,
            "instructions",
            format!(
                "in step {shown_id} {m}; use {{{{steps.ID.output}}}} to insert an earlier step's answer"
            ),
        )
    })?;
    let refs = refs.into_iter().filter_map(|p| match p.kind {
        Placeholder::Output(step_id) => Some(OutputRef {
            step_id,
            range: p.range,
        }),
        _ => None,
    });
    for r in refs {
        if !earlier.iter().any(|e| e.id == r.step_id) {
            let why = if r.step_id == id {
                "its own output"
            } else if all_ids.contains(&r.step_id) {
                "a step that runs later"
            } else {
                "a step that does not exist"
            };
            return Err(site.fail(
                line,
                "instructions",
                format!(
                    "step {shown_id} refers to the output of step {}, {why}; refer only to steps listed before it",
                    shown_value(&r.step_id)
                ),
            ));
        }
    }
    Ok(())
}

/// `{{item}}`, `{{item.FIELD}}` and `{{index}}` appear only in a fan-out step.
fn check_item_placeholders<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    instructions: &Spanned<String>,
    fan_out: bool,
) -> Result<(), CompositionError> {
    if fan_out {
        return Ok(());
    }
    let found = placeholders(&instructions.value).unwrap_or_default();
    let Some(p) = found
        .iter()
        .find(|p| matches!(p.kind, Placeholder::Item(_) | Placeholder::Index))
    else {
        return Ok(());
    };
    Err(site.fail(
        instructions.defined.line(),
        "instructions",
        format!(
            "step {} uses {}, which only a step with forEach has; add forEach or remove the placeholder",
            site.shown_id,
            shown_value(&instructions.value[p.range.clone()])
        ),
    ))
}

/// `forEach` names an array inside an earlier read-only step's answer (as far as that step's
/// contract schema can tell), and `concurrency` is 1..=16 and only given with it.
fn check_for_each<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    for_each: Option<Spanned<String>>,
    concurrency: Option<Spanned<serde_json::Value>>,
    earlier: &[Step],
    all_ids: &[String],
) -> Result<Option<FanOut>, CompositionError> {
    let shown_id = &site.shown_id;
    let Some(for_each) = for_each else {
        return match concurrency {
            Some(c) => Err(site.fail(
                c.defined.line(),
                "concurrency",
                format!(
                    "step {shown_id} has concurrency but no forEach, and only a fan-out step runs instances at once; remove concurrency or add forEach"
                ),
            )),
            None => Ok(None),
        };
    };
    let line = for_each.defined.line();
    let written = for_each.value.trim();
    let fail = |message: String| site.fail(line, "forEach", message);
    let Some((step_id, path)) = parse_for_each(written) else {
        return Err(fail(format!(
            "forEach of step {shown_id} is {}, which is not of the form steps.ID.output.PATH; name an array in an earlier step's answer, such as steps.outline.output.modules",
            shown_value(written)
        )));
    };
    let Some(source) = earlier.iter().find(|e| e.id == step_id) else {
        let why = if all_ids.contains(&step_id) {
            "a step that runs later or the step itself"
        } else {
            "a step that does not exist"
        };
        return Err(fail(format!(
            "forEach of step {shown_id} names step {}, {why}; name a step listed before it",
            shown_value(&step_id)
        )));
    };
    let Some(contract) = source
        .contract
        .as_ref()
        .filter(|_| source.access == Access::ReadOnly)
    else {
        return Err(fail(format!(
            "forEach of step {shown_id} names step {}, which answers no JSON object (only a read-only step with a contract does); point it at such a step",
            shown_value(&step_id)
        )));
    };
    // A fan-out step's own output is the array of its instances' answers.
    let schema = match source.fan_out {
        Some(_) => serde_json::json!({"type": "array", "items": contract.schema}),
        None => contract.schema.clone(),
    };
    if let Some(declared) = declared_kind(&schema, &path) {
        return Err(fail(format!(
            "forEach of step {shown_id} names {}, which the contract of step {} declares as {declared}, not an array; name an array",
            shown_value(written),
            shown_value(&step_id)
        )));
    }
    let concurrency = match concurrency {
        None => DEFAULT_CONCURRENCY,
        Some(c) if c.value.is_null() => DEFAULT_CONCURRENCY,
        Some(c) => match c.value.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if (1..=MAX_CONCURRENCY).contains(&n) => n,
            _ => {
                return Err(site.fail(
                    c.defined.line(),
                    "concurrency",
                    format!(
                        "concurrency of step {shown_id} is {}, but it must be a whole number from 1 to {MAX_CONCURRENCY}; fix it or remove it to use the default {DEFAULT_CONCURRENCY}",
                        shown_value(&c.value.to_string())
                    ),
                ));
            }
        },
    };
    Ok(Some(FanOut {
        step_id,
        path,
        concurrency,
    }))
}

/// `steps.ID.output` followed by any number of `.MEMBER`s.
fn parse_for_each(text: &str) -> Option<(String, Vec<String>)> {
    let mut parts = text.split('.');
    if parts.next() != Some("steps") {
        return None;
    }
    let id = parts.next().filter(|id| valid_id(id))?;
    if parts.next() != Some("output") {
        return None;
    }
    let path: Vec<String> = parts.map(str::to_owned).collect();
    path.iter()
        .all(|m| valid_id(m))
        .then(|| (id.to_owned(), path))
}

/// What the schema declares at `path` when that is known not to be an array (e.g. `string`,
/// or `object` for a member of something declared not to be an object). `None` when it is or
/// may be an array: a schema that says nothing leaves the question to run time.
fn declared_kind(schema: &serde_json::Value, path: &[String]) -> Option<String> {
    let mut at = schema;
    for member in path {
        if let Some(types) = declared_types(at)
            && !types.contains(&"object")
        {
            return Some(types.join(" or "));
        }
        at = at.get("properties")?.get(member)?;
    }
    declared_types(at)
        .filter(|types| !types.contains(&"array"))
        .map(|types| types.join(" or "))
}

/// The JSON Schema `type` keyword as a list, when present.
fn declared_types(schema: &serde_json::Value) -> Option<Vec<&str>> {
    match schema.get("type")? {
        serde_json::Value::String(t) => Some(vec![t.as_str()]),
        serde_json::Value::Array(ts) => Some(ts.iter().filter_map(|t| t.as_str()).collect()),
        _ => None,
    }
}

/// Each tool is listed once, and a writing tool only on a write step.
fn check_tools<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    listed: &[Spanned<Tool>],
    access: Access,
) -> Result<Vec<Tool>, CompositionError> {
    let shown_id = &site.shown_id;
    let mut tools: Vec<Tool> = Vec::new();
    for t in listed {
        if tools.contains(&t.value) {
            return Err(site.fail(
                t.defined.line(),
                "tools",
                format!(
                    "step {shown_id} lists {} twice; list each tool once",
                    t.value.name()
                ),
            ));
        }
        if t.value.writes() && access != Access::Write {
            return Err(site.fail(
                t.defined.line(),
                "tools",
                format!(
                    "read-only step {shown_id} lists {}, which only write steps may use; remove it or make the step access: write",
                    t.value.name()
                ),
            ));
        }
        tools.push(t.value);
    }
    Ok(tools)
}

/// Write roots appear only on a write step, each a path inside the workspace.
fn check_write_roots<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    roots: Option<Spanned<Vec<Spanned<String>>>>,
    access: Access,
) -> Result<Vec<String>, CompositionError> {
    let shown_id = &site.shown_id;
    let mut write_roots = Vec::new();
    let Some(roots) = roots else {
        return Ok(write_roots);
    };
    if access != Access::Write {
        return Err(site.fail(
            roots.defined.line(),
            "writeRoots",
            format!(
                "read-only step {shown_id} has writeRoots, which only write steps may have; remove them or make the step access: write"
            ),
        ));
    }
    for r in roots.value {
        if let Some(problem) = write_root_problem(&r.value) {
            return Err(site.fail(
                r.defined.line(),
                "writeRoots",
                format!(
                    "write root {} of step {shown_id} {problem}; give a path relative to the workspace, such as docs/",
                    shown_value(&r.value)
                ),
            ));
        }
        write_roots.push(r.value);
    }
    Ok(write_roots)
}

/// The contract schema is a JSON Schema object (or boolean) that compiles.
fn check_contract<E: Fn(u64, String, String) -> CompositionError>(
    site: &StepSite<'_, E>,
    c: Spanned<RawContract>,
) -> Result<Contract, CompositionError> {
    let shown_id = &site.shown_id;
    let c_line = c.defined.line();
    let schema = c.value.schema;
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(site.fail(
            c_line,
            "contract.schema",
            format!(
                "the contract schema of step {shown_id} must be a JSON Schema object; write it as a mapping such as {{type: object}}"
            ),
        ));
    }
    if let Err(e) = jsonschema::validator_for(&schema) {
        return Err(site.fail(
            c_line,
            "contract.schema",
            format!(
                "the contract schema of step {shown_id} is not a valid JSON Schema ({}); correct it",
                shown_value(&e.to_string())
            ),
        ));
    }
    let grounding = c.value.grounding.unwrap_or_default();
    if let Some(bad) = grounding.iter().find(|m| !is_member_path(m)) {
        return Err(site.fail(
            c_line,
            "contract.grounding",
            format!(
                "the contract grounding of step {shown_id} names {}, which is not a member path; write dotted names with * for every array item, such as pages.*.markdown",
                shown_value(bad)
            ),
        ));
    }
    Ok(Contract { schema, grounding })
}

/// `a.b`, `pages.*.markdown`: names of letters, digits, `_` and `-`, or `*`.
fn is_member_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('.').all(|part| {
            part == "*"
                || (!part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        })
}

fn check_limits(
    raw: Option<RawLimits>,
    text: &str,
    err: &impl Fn(u64, String, String) -> CompositionError,
) -> Result<ModelLimits, CompositionError> {
    let mut limits = ModelLimits::default();
    let Some(raw) = raw else { return Ok(limits) };
    let max32 = u64::from(u32::MAX);
    // Zero would end every attempt before it starts, so those limits start at 1; a step that
    // reads nothing is legitimate, so sourceReadBytes may be 0.
    if let Some(v) = whole(text, &raw.timeout_ms, "timeoutMs", 1, u64::MAX, err)? {
        limits.timeout_ms = v;
    }
    if let Some(v) = whole(text, &raw.max_turns, "maxTurns", 1, max32, err)? {
        limits.max_turns = u32::try_from(v).unwrap_or(u32::MAX);
    }
    if let Some(v) = whole(
        text,
        &raw.max_output_tokens,
        "maxOutputTokens",
        1,
        max32,
        err,
    )? {
        limits.max_output_tokens = u32::try_from(v).unwrap_or(u32::MAX);
    }
    if let Some(v) = whole(
        text,
        &raw.source_read_bytes,
        "sourceReadBytes",
        0,
        u64::MAX,
        err,
    )? {
        limits.source_read_bytes = v;
    }
    limits.max_run_tokens = whole(text, &raw.max_run_tokens, "maxRunTokens", 1, u64::MAX, err)?;
    Ok(limits)
}

/// Reads `limits.FIELD` as a whole number from `min` to `max`; null or absent means the default.
fn whole(
    text: &str,
    v: &Option<Spanned<serde_json::Value>>,
    field: &str,
    min: u64,
    max: u64,
    err: &impl Fn(u64, String, String) -> CompositionError,
) -> Result<Option<u64>, CompositionError> {
    let Some(s) = v else { return Ok(None) };
    if s.value.is_null() {
        return Ok(None);
    }
    match s.value.as_u64() {
        Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
        Some(0) => Err(err(
            s.defined.line(),
            format!("limits.{field}"),
            format!(
                "limits.{field} is 0, which would end every attempt at once; give a whole number from {min} to {max} or remove it to use the default"
            ),
        )),
        _ => {
            let written = raw_value(text, s).text;
            Err(err(
                s.defined.line(),
                format!("limits.{field}"),
                format!(
                    "limits.{field} is {}, but it must be a whole number from {min} to {max}; fix the value or remove it to use the default",
                    shown_value(&written)
                ),
            ))
        }
    }
}

/// Why `root` is not an acceptable write root, if it is not.
fn write_root_problem(root: &str) -> Option<&'static str> {
    let r = root.trim();
    if r.is_empty() {
        return Some("is empty");
    }
    if r.starts_with('/') || r.starts_with('\\') || r.chars().nth(1) == Some(':') {
        return Some("is absolute");
    }
    if r.split(['/', '\\']).any(|part| part == "..") {
        return Some("climbs out of the workspace with ..");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICKSTART: &str = r#"name: quickstart
provider: default
model: some-model
limits:
  timeoutMs: 300000
  maxTurns: 12
  maxOutputTokens: 4096
  sourceReadBytes: 262144
steps:
  - id: outline
    access: read-only
    instructions: |
      Survey the crate and return {"modules": [...]}.
    tools: [list_files, read_file, search_text]
    contract:
      schema: {type: object, required: [modules]}
  - id: pages
    access: write
    instructions: |
      Write docs/overview.md for these modules: {{steps.outline.output}}
    tools: [read_file, write_file]
    writeRoots: [docs/]
"#;

    fn parse(text: &str) -> Result<Composition, CompositionError> {
        Composition::parse(text, "c.yaml")
    }

    fn refused(text: &str) -> CompositionError {
        match parse(text) {
            Ok(c) => panic!("expected a refusal, got {c:?}"),
            Err(e) => e,
        }
    }

    /// A page-answering step `page` and a pages step with `extra` lines (issue 32).
    fn with_pages(page_contract: &str, pages_step: &str) -> String {
        format!(
            "name: wiki\nsteps:\n  - id: page\n    access: read-only\n    instructions: Write it.\n    contract:\n{page_contract}\n  - id: write\n    access: write\n{pages_step}\n"
        )
    }

    const PAGE_CONTRACT: &str =
        "      schema: {type: object, required: [path, markdown]}\n      grounding: [markdown]";

    #[test]
    fn issue32_a_pages_step_names_earlier_page_steps_and_needs_no_instructions() {
        let c = parse(&with_pages(
            PAGE_CONTRACT,
            "    pages: [page, page]\n    writeRoots: [docs/]",
        ))
        .unwrap();
        let write = c.step("write").unwrap();
        assert!(write.writes_pages());
        assert_eq!(write.pages, vec!["page".to_owned()]);
        assert!(write.instructions.is_empty() && write.tools.is_empty());
    }

    #[test]
    fn issue32_a_pages_step_is_refused_with_what_to_change() {
        let cases = [
            (
                with_pages(PAGE_CONTRACT, "    pages: [page]"),
                "writeRoots",
                "has no writeRoots",
            ),
            (
                with_pages(
                    PAGE_CONTRACT,
                    "    pages: [page]\n    writeRoots: [docs/]\n    instructions: Write.",
                ),
                "instructions",
                "sends no request",
            ),
            (
                with_pages(
                    PAGE_CONTRACT,
                    "    pages: [page]\n    writeRoots: [docs/]\n    tools: [write_file]",
                ),
                "tools",
                "asks no model",
            ),
            (
                with_pages(PAGE_CONTRACT, "    pages: [later]\n    writeRoots: [docs/]"),
                "pages",
                "not a step listed before it",
            ),
            (
                with_pages(
                    "      schema: {type: object, required: [markdown]}\n      grounding: [markdown]",
                    "    pages: [page]\n    writeRoots: [docs/]",
                ),
                "pages",
                "does not require path and markdown",
            ),
            (
                with_pages(
                    "      schema: {type: object, required: [path, markdown]}",
                    "    pages: [page]\n    writeRoots: [docs/]",
                ),
                "pages",
                "does not ground markdown",
            ),
        ];
        for (text, field, words) in cases {
            let e = refused(&text);
            assert_eq!(
                e.field.as_deref(),
                Some(&*format!("steps[1].{field}")),
                "{e:?}"
            );
            assert!(e.message.contains(words), "{}: {}", words, e.message);
        }
        let read_only = text_without_pages_access();
        assert!(refused(&read_only).message.contains("access must be write"));
        let missing = "name: x\nsteps:\n  - id: a\n    access: read-only\n";
        assert!(refused(missing).message.contains("has no instructions"));
    }

    fn text_without_pages_access() -> String {
        with_pages(PAGE_CONTRACT, "    pages: [page]\n    writeRoots: [docs/]").replace(
            "  - id: write\n    access: write",
            "  - id: write\n    access: read-only",
        )
    }

    #[test]
    fn parses_the_documented_example() {
        let c = parse(QUICKSTART).unwrap();
        assert_eq!(c.name, "quickstart");
        assert_eq!(c.provider, "default");
        assert_eq!(c.model.as_deref(), Some("some-model"));
        assert_eq!(
            c.limits,
            ModelLimits {
                timeout_ms: 300_000,
                max_turns: 12,
                max_output_tokens: 4096,
                source_read_bytes: 262_144,
                max_run_tokens: None,
            }
        );
        assert_eq!(c.steps.len(), 2);
        let outline = c.step("outline").unwrap();
        assert_eq!(outline.access, Access::ReadOnly);
        assert_eq!(
            outline.tools,
            vec![Tool::ListFiles, Tool::ReadFile, Tool::SearchText]
        );
        assert_eq!(
            outline.contract.as_ref().unwrap().schema["required"][0],
            "modules"
        );
        assert_eq!(outline.line, 10);
        let pages = c.step("pages").unwrap();
        assert_eq!(pages.write_roots, vec!["docs/".to_string()]);
        assert!(pages.contract.is_none());
    }

    #[test]
    fn defaults_when_limits_and_provider_absent() {
        let c = parse("name: n\nsteps:\n  - id: a\n    access: read-only\n    instructions: go\n")
            .unwrap();
        assert_eq!(c.provider, "default");
        assert_eq!(c.model, None);
        assert_eq!(c.limits, ModelLimits::default());
        assert_eq!(c.limits.timeout_ms, 1_800_000);
        assert!(c.steps[0].tools.is_empty());
    }

    #[test]
    fn retry_field_in_limits_refused_naming_it_cfg_6() {
        for field in [
            "maxRetries",
            "retries",
            "maxTransportRetries",
            "readOnlyMaxRetries",
        ] {
            let text = QUICKSTART.replace(
                "  maxTurns: 12\n",
                &format!("  maxTurns: 12\n  {field}: 1\n"),
            );
            let e = refused(&text);
            assert_eq!(e.field.as_deref(), Some(field));
            assert_eq!(e.line, Some(7));
            let msg = e.to_string();
            assert!(
                msg.contains(field) && msg.contains("c.yaml line 7"),
                "{msg}"
            );
            assert!(msg.contains("no retry field"), "{msg}");
        }
    }

    #[test]
    fn any_unknown_field_refused_cfg_6() {
        let e = refused(
            &QUICKSTART.replace("    access: write\n", "    access: write\n    retry: 2\n"),
        );
        assert_eq!(e.field.as_deref(), Some("retry"));
        let e = refused(&format!("{QUICKSTART}extra: 1\n"));
        assert!(e.to_string().contains("extra"), "{e}");
        let e = refused(&QUICKSTART.replace("  - id: pages\n", "  - id: pages\n    colour: red\n"));
        assert!(
            e.to_string().contains("colour") && e.to_string().contains("correct its spelling"),
            "{e}"
        );
    }

    #[test]
    fn unknown_field_in_contract_refused_cfg_6() {
        let e = refused(&QUICKSTART.replace(
            "      schema: {type: object, required: [modules]}\n",
            "      schema: {type: object, required: [modules]}\n      maxRetries: 2\n",
        ));
        assert_eq!(e.field.as_deref(), Some("maxRetries"));
        assert_eq!(e.line, Some(17));
    }

    #[test]
    fn duplicate_step_ids_refused() {
        let e = refused(&QUICKSTART.replace("id: pages", "id: outline"));
        assert!(e.to_string().contains("already used"), "{e}");
        assert_eq!(e.line, Some(17));
    }

    #[test]
    fn unknown_tool_refused() {
        let e = refused(&QUICKSTART.replace("[read_file, write_file]", "[read_file, delete_file]"));
        let msg = e.to_string();
        assert!(
            msg.contains("delete_file") && msg.contains("list_files"),
            "{msg}"
        );
    }

    #[test]
    fn write_file_only_on_write_steps() {
        let e = refused(&QUICKSTART.replace(
            "[list_files, read_file, search_text]",
            "[list_files, write_file]",
        ));
        assert!(e.to_string().contains("only write steps"), "{e}");
    }

    #[test]
    fn write_roots_only_on_write_steps_and_relative() {
        let text = QUICKSTART.replace(
            "    contract:\n",
            "    writeRoots: [docs/]\n    contract:\n",
        );
        assert!(refused(&text).to_string().contains("writeRoots"));
        for bad in ["/etc", "../up", "docs/../../x", "C:\\x", "\"\""] {
            let e = refused(&QUICKSTART.replace("[docs/]", &format!("[{bad}]")));
            assert_eq!(e.field.as_deref(), Some("steps[1].writeRoots"), "{bad}");
        }
        let e = refused(&QUICKSTART.replace("    writeRoots: [docs/]\n", ""));
        assert!(e.to_string().contains("no writeRoots"), "{e}");
    }

    #[test]
    fn output_references_only_to_earlier_steps() {
        let forward = QUICKSTART.replace(
            "Survey the crate",
            "Survey {{steps.pages.output}} the crate",
        );
        assert!(refused(&forward).to_string().contains("runs later"));
        let own = QUICKSTART.replace("{{steps.outline.output}}", "{{steps.pages.output}}");
        assert!(refused(&own).to_string().contains("its own output"));
        let missing = QUICKSTART.replace("{{steps.outline.output}}", "{{ steps.nope.output }}");
        assert!(refused(&missing).to_string().contains("does not exist"));
        let other = QUICKSTART.replace("{{steps.outline.output}}", "{{env.HOME}}");
        assert!(refused(&other).to_string().contains("not of the form"));
        let open = QUICKSTART.replace("{{steps.outline.output}}", "{{steps.outline.output");
        assert!(refused(&open).to_string().contains("no closing"));
    }

    #[test]
    fn invalid_schema_refused() {
        let e = refused(&QUICKSTART.replace("{type: object, required: [modules]}", "{type: 12}"));
        assert_eq!(e.field.as_deref(), Some("steps[0].contract.schema"));
        let e = refused(&QUICKSTART.replace("{type: object, required: [modules]}", "[1, 2]"));
        assert!(e.to_string().contains("JSON Schema object"), "{e}");
    }

    #[test]
    fn zero_limits_and_wrong_types_refused() {
        let e = refused(&QUICKSTART.replace("timeoutMs: 300000", "timeoutMs: 0"));
        assert_eq!(e.field.as_deref(), Some("limits.timeoutMs"));
        let e = refused(&QUICKSTART.replace("timeoutMs: 300000", "timeoutMs: soon"));
        assert_eq!(e.line, Some(5));
        let ok =
            parse(&QUICKSTART.replace("sourceReadBytes: 262144", "sourceReadBytes: 0")).unwrap();
        assert_eq!(ok.limits.source_read_bytes, 0);
    }

    #[test]
    fn empty_or_missing_parts_refused() {
        assert!(
            refused("name: n\nsteps: []\n")
                .to_string()
                .contains("no steps")
        );
        assert!(refused("").to_string().contains("c.yaml"));
        let e = refused(&QUICKSTART.replace("access: read-only", "access: readonly"));
        assert!(e.to_string().contains("readonly"), "{e}");
    }

    #[test]
    fn every_message_is_one_sentence() {
        let e = refused(&QUICKSTART.replace("id: pages", "id: outline"));
        let msg = e.to_string();
        assert!(
            msg.ends_with('.') && !msg.contains(". ") && !msg.contains('\n'),
            "{msg}"
        );
    }

    #[test]
    fn hardening_unclear_refusals_fuzz_found_long_unknown_key_with_retry_remedy() {
        // Found by the `config` fuzz target: a long garbage key containing "retr" took the
        // retry remedy and the line grew past 300 characters.
        let text = "n mae:quickstart      Surv# Every step retry decision nam!ools: [read_file, wr=te_file]\n    writeRoots: [docs/]\n";
        let msg = refused(text).to_string();
        assert!(
            msg.chars().count() <= 300,
            "{} chars: {msg}",
            msg.chars().count()
        );
        assert!(
            msg.contains("no retry field") && !msg.contains('\n'),
            "{msg}"
        );
    }

    #[test]
    fn hardening_unclear_refusals_limits_name_the_range() {
        for bad in ["-1", "1.5", "18446744073709551616", "true", "\"x\""] {
            let text = QUICKSTART.replace("maxTurns: 12", &format!("maxTurns: {bad}"));
            let msg = refused(&text).to_string();
            assert!(
                msg.contains("limits.maxTurns") && msg.contains("from 1 to 4294967295"),
                "{msg}"
            );
        }
    }

    const FAN: &str = r#"name: fan
steps:
  - id: outline
    access: read-only
    instructions: Survey.
    contract:
      schema:
        type: object
        required: [modules]
        properties:
          modules: {type: array, items: {type: object}}
          title: {type: string}
          meta: {type: object}
  - id: pages
    access: write
    forEach: steps.outline.output.modules
    concurrency: 3
    instructions: |
      Write docs/{{item.name}}.md ({{index}}): {{item}} after {{steps.outline.output}}
    tools: [write_file]
    writeRoots: [docs/]
"#;

    #[test]
    fn issue12_for_each_and_concurrency_parse() {
        let c = parse(FAN).unwrap();
        let fan = c.step("pages").unwrap().fan_out.clone().unwrap();
        assert_eq!(fan.step_id, "outline");
        assert_eq!(fan.path, vec!["modules".to_owned()]);
        assert_eq!(fan.concurrency, 3);
        assert_eq!(fan.source(), "steps.outline.output.modules");
        let default = parse(&FAN.replace("    concurrency: 3\n", "")).unwrap();
        assert_eq!(default.steps[1].fan_out.as_ref().unwrap().concurrency, 4);
        // An undeclared member is left to run time; so is a deeper path into an object.
        for path in [
            "steps.outline.output.other",
            "steps.outline.output.meta.list",
        ] {
            let text = FAN.replace("steps.outline.output.modules", path);
            assert!(parse(&text).is_ok(), "{path}");
        }
        assert!(c.steps[0].fan_out.is_none());
    }

    #[test]
    fn issue12_for_each_refusals_are_one_sentence_at_the_line() {
        let cases = [
            (
                FAN.replace("steps.outline.output.modules", "outline.modules"),
                "not of the form",
            ),
            (
                FAN.replace("steps.outline.output.modules", "steps.nope.output.x"),
                "does not exist",
            ),
            (
                FAN.replace("steps.outline.output.modules", "steps.pages.output.x"),
                "runs later or the step itself",
            ),
            (
                FAN.replace("steps.outline.output.modules", "steps.outline.output.title"),
                "declares as string, not an array",
            ),
            (
                FAN.replace(
                    "steps.outline.output.modules",
                    "steps.outline.output.title.x",
                ),
                "declares as string",
            ),
            (
                FAN.replace("steps.outline.output.modules", "steps.outline.output"),
                "declares as object, not an array",
            ),
            (
                FAN.replace("    contract:\n", "    contractx:\n"),
                "contractx",
            ),
        ];
        for (text, want) in &cases {
            let msg = refused(text).to_string();
            assert!(msg.contains(want), "{want}: {msg}");
            assert!(msg.ends_with('.') && !msg.contains('\n'), "{msg}");
        }
        let e = refused(&FAN.replace(
            "steps.outline.output.modules",
            "steps.outline.output.titel x",
        ));
        assert_eq!(e.field.as_deref(), Some("steps[1].forEach"));
        assert_eq!(e.line, Some(16));
        // The source must answer a JSON object: a read-only step with a contract.
        let no_contract = FAN.replace(
            "    contract:\n      schema:\n        type: object\n        required: [modules]\n        properties:\n          modules: {type: array, items: {type: object}}\n          title: {type: string}\n          meta: {type: object}\n",
            "",
        );
        let msg = refused(&no_contract).to_string();
        assert!(msg.contains("answers no JSON object"), "{msg}");
    }

    #[test]
    fn issue12_concurrency_range_and_placement_refused() {
        for bad in ["0", "17", "-1", "2.5", "many"] {
            let e = refused(&FAN.replace("concurrency: 3", &format!("concurrency: {bad}")));
            assert_eq!(e.field.as_deref(), Some("steps[1].concurrency"), "{bad}");
            assert!(e.to_string().contains("from 1 to 16"), "{e}");
        }
        assert_eq!(
            parse(&FAN.replace("concurrency: 3", "concurrency: 16"))
                .unwrap()
                .steps[1]
                .fan_out
                .as_ref()
                .unwrap()
                .concurrency,
            16
        );
        let e = refused(&FAN.replace("    forEach: steps.outline.output.modules\n", ""));
        assert!(e.to_string().contains("concurrency but no forEach"), "{e}");
    }

    #[test]
    fn issue12_item_placeholders_only_in_a_fan_out_step() {
        let text = FAN.replace(
            "    forEach: steps.outline.output.modules\n    concurrency: 3\n",
            "",
        );
        let msg = refused(&text).to_string();
        assert!(
            msg.contains("{{item.name}}") && msg.contains("only a step with forEach"),
            "{msg}"
        );
        let text = QUICKSTART.replace("{{steps.outline.output}}", "{{index}}");
        assert!(refused(&text).to_string().contains("{{index}}"));
        let text = FAN.replace("{{item.name}}", "{{item.}}");
        assert!(refused(&text).to_string().contains("not of the form"));
    }
}
