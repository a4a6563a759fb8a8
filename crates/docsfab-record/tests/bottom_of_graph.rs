//! The record crate stays at the bottom of the crate graph: serde and serde_json only, no crate
//! of ours, and its schema read from inside the crate. A dependency added here would bring back
//! the cycles and twins this crate exists to remove.

#[test]
fn record_crate_depends_on_serde_only() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("the crate's own manifest");
    let deps: Vec<&str> = manifest
        .split("[dependencies]")
        .nth(1)
        .expect("a [dependencies] table")
        .lines()
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| l.split(['.', '=', ' ']).next())
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert_eq!(deps, ["serde", "serde_json"], "{manifest}");
    assert!(!manifest.contains("[dev-dependencies]"), "{manifest}");
}

#[test]
fn the_schema_is_the_crate_file_and_names_the_record_fields() {
    let schema: serde_json::Value =
        serde_json::from_str(docsfab_record::SCHEMA).expect("the schema is JSON");
    let required = schema["required"].as_array().expect("a required list");
    for field in [
        "runId",
        "composition",
        "status",
        "startedAt",
        "endedAt",
        "steps",
    ] {
        assert!(required.iter().any(|f| f == field), "{field} not required");
    }
}
