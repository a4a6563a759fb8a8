//! Issue 11: a mis-indented host.yaml or composition is reported at the line that is wrong,
//! not where the YAML library gave up (often the line above the misplaced key).

mod support;

use support::run::docsfab_at;

/// host.yaml with one provider whose last two lines are `tail`.
fn host_with(tail: &str) -> String {
    format!(
        "providers:\n  default:\n    api: openai-chat\n    baseUrl: http://127.0.0.1:9/v1\n{tail}"
    )
}

fn doctor_error(host_yaml: &str) -> String {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("host.yaml"), host_yaml).unwrap();
    let out = docsfab_at(home.path()).arg("doctor").output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "doctor must refuse {host_yaml:?}"
    );
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one sentence: {err}");
    err
}

#[test]
fn issue11_yaml_key_between_levels_is_reported_at_its_line() {
    let err = doctor_error(&host_with("   model: some-model\n    apiKeyEnv: KEY\n"));
    assert!(err.contains("host.yaml line 5, column 4"), "{err}");
    assert!(err.contains("indented 3 spaces"), "{err}");
}

#[test]
fn issue11_yaml_key_under_a_value_is_reported_at_its_line() {
    let err = doctor_error(&host_with("      model: some-model\n    apiKeyEnv: KEY\n"));
    assert!(err.contains("host.yaml line 5, column 7"), "{err}");
}

#[test]
fn issue11_yaml_key_one_level_too_shallow_is_reported_where_the_layout_breaks() {
    // `model` at the provider list's level ends the mapping of `default`; the library then
    // reports apiKeyEnv missing at line 4. The layout breaks at line 6, which names line 5.
    let err = doctor_error(&host_with("  model: some-model\n    apiKeyEnv: KEY\n"));
    assert!(err.contains("host.yaml line 6"), "{err}");
    assert!(err.contains("line 5"), "{err}");
}

#[test]
fn issue11_yaml_misplaced_required_key_is_reported_where_it_is_written() {
    let err = doctor_error(&host_with("    model: some-model\n  apiKeyEnv: KEY\n"));
    assert!(err.contains("host.yaml line 6, column 3"), "{err}");
    assert!(err.contains("apiKeyEnv is indented 2 spaces"), "{err}");
}

#[test]
fn issue11_yaml_mis_indented_composition_is_reported_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let composition = dir.path().join("c.yaml");
    std::fs::write(
        &composition,
        "name: c\nsteps:\n  - id: outline\n    access: read\n     instructions: x\n",
    )
    .unwrap();
    let out = docsfab_at(dir.path())
        .arg("doctor")
        .arg("--composition")
        .arg(&composition)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("c.yaml line 5"), "{err}");
}

#[test]
fn issue11_yaml_shipped_files_have_no_misalignment() {
    let root = env!("CARGO_MANIFEST_DIR");
    for file in ["quickstart/composition.yaml", "quickstart/scenario.yaml"] {
        let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        assert_eq!(
            docsfab_policy::indent::first_misalignment(&text),
            None,
            "{file}"
        );
    }
}
