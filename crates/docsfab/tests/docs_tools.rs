//! Issue 11: docs/configuration.md documents every tool a step can offer and every parameter of
//! each, as the model is sent them. A tool or parameter added in code without its documentation
//! fails here.

use docsfab_runtime::composition::Tool;
use docsfab_runtime::tools::parameter_schema;

fn configuration_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    std::fs::read_to_string(path).unwrap()
}

/// The documentation section of one tool: from its `### \`name\`` heading to the next heading.
fn section<'a>(doc: &'a str, tool: &str) -> &'a str {
    let heading = format!("### `{tool}`");
    let start = doc
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/configuration.md has no section {heading}"));
    let rest = &doc[start + heading.len()..];
    let end = rest.find("\n#").unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn issue11_every_tool_and_parameter_is_documented() {
    let doc = configuration_md();
    for tool in Tool::ALL {
        let text = section(&doc, tool.name());
        let schema = parameter_schema(tool);
        let properties = schema["properties"].as_object().unwrap();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        for (name, spec) in properties {
            let row = text
                .lines()
                .find(|l| l.starts_with(&format!("| `{name}` |")))
                .unwrap_or_else(|| panic!("{}: no table row for `{name}`", tool.name()));
            let kind = spec["type"].as_str().unwrap();
            assert!(
                row.contains(kind),
                "{}: `{name}` row lacks {kind}: {row}",
                tool.name()
            );
            let says_required = row.contains("| yes |");
            assert_eq!(
                says_required,
                required.contains(&name.as_str()),
                "{}: `{name}` required-ness differs from the schema: {row}",
                tool.name()
            );
        }
        let rows = text.lines().filter(|l| l.starts_with("| `")).count();
        assert_eq!(
            rows,
            properties.len(),
            "{}: a row for a parameter the tool lacks",
            tool.name()
        );
    }
}
