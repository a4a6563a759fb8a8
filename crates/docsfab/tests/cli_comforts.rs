//! Issue 11 CLI comforts as real processes: shell completions, the man page, warnings about
//! misspelt `DOCSFAB_` variables, an empty host.yaml, and the `runs list` table.

mod support;

use std::process::Output;

use support::run::{FAST_CATALOG, ONE_STEP, SECRET, Setup, Sim, docsfab_at};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run_in_empty_home(args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    docsfab_at(home.path()).args(args).output().unwrap()
}

#[test]
fn completions_every_shell_names_the_subcommands() {
    for (shell, marker) in [
        ("bash", "complete -F _docsfab"),
        ("zsh", "#compdef docsfab"),
        ("fish", "complete -c docsfab"),
        ("elvish", "edit:completion:arg-completer[docsfab]"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let out = run_in_empty_home(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell} script lacks {marker:?}");
        for sub in ["run", "runs", "doctor", "completions"] {
            assert!(script.contains(sub), "{shell} script lacks {sub}");
        }
        assert!(out.stderr.is_empty(), "{shell}: {}", text(&out.stderr));
    }
}

#[test]
fn completions_bash_script_is_valid_bash() {
    let out = run_in_empty_home(&["completions", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docsfab.bash");
    std::fs::write(&path, &out.stdout).unwrap();
    // `bash -n` parses without running: a syntax error in the script fails here.
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
}

#[test]
fn completions_unknown_shell_is_clap_error_exit_2() {
    let out = run_in_empty_home(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(err.contains("invalid value 'tcsh'"), "{err}");
    assert!(err.contains("bash"), "{err}");
}

#[test]
fn man_page_is_roff_naming_every_subcommand() {
    let out = run_in_empty_home(&["man"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH docsfab 1"), "{page}");
    assert!(page.contains(".SH NAME"));
    for sub in [
        "setup",
        "doctor",
        "run",
        "runs",
        "demo",
        "sim",
        "route",
        "completions",
    ] {
        assert!(page.contains(sub), "man page lacks {sub}");
    }
}

/// A misspelt limit variable is named on stderr with the closest known name, once, on a run that
/// still succeeds; its value, the key variable (host.yaml names it) and known variables are not.
#[test]
fn hardening_unknown_env_var_run_warns_with_closest_name() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer:\n      json: {modules: [lib, count]}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let out = s
        .run_command(&comp)
        .env("DOCSFAB_READ_ONLY_MAX_RETRIE", "value-never-shown-7731")
        .env("DOCSFAB_ROUTE_MAX_CONECTIONS", "8")
        .env("DOCSFAB_READ_ONLY_MAX_RETRIES", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    assert_eq!(
        warnings,
        [
            "warning: DOCSFAB_READ_ONLY_MAX_RETRIE is not a variable docsfab reads, so it has no effect; did you mean DOCSFAB_READ_ONLY_MAX_RETRIES?",
            "warning: DOCSFAB_ROUTE_MAX_CONECTIONS is not a variable docsfab reads, so it has no effect; did you mean DOCSFAB_ROUTE_MAX_CONNECTIONS?",
        ],
        "{stderr}"
    );
    for secret in ["value-never-shown-7731", SECRET] {
        assert!(!stdout.contains(secret) && !stderr.contains(secret));
    }
}

/// Doctor lists the same warning in its report (exit 0: a warning, not an error), and a clean
/// environment gets none.
#[test]
fn hardening_unknown_env_var_doctor_warns_with_closest_name() {
    let home = tempfile::tempdir().unwrap();
    let out = docsfab_at(home.path())
        .arg("doctor")
        .env("DOCSFAB_HOMME", "/secret/path-never-shown")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("warning: DOCSFAB_HOMME is not a variable docsfab reads, so it has no effect; did you mean DOCSFAB_HOME?"),
        "{stdout}"
    );
    assert!(!stdout.contains("path-never-shown"));

    let clean = docsfab_at(home.path()).arg("doctor").output().unwrap();
    assert!(!text(&clean.stdout).contains("is not a variable docsfab reads"));
}

/// An empty host.yaml (zero bytes, or only comments) is called empty by doctor rather than
/// valid, and `run` refuses it in one sentence, exit 2, recording nothing.
#[test]
fn hardening_empty_host_yaml_doctor_says_empty_and_run_refuses() {
    for content in [
        "",
        "# written by hand, then emptied\n\n  # another comment\n",
    ] {
        let s = Setup::new("http://127.0.0.1:9/v1", "");
        std::fs::write(s.home().join("host.yaml"), content).unwrap();

        let out = s.docsfab().arg("doctor").output().unwrap();
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            stdout.contains("(empty: no providers are configured)"),
            "{stdout}"
        );
        assert!(
            stdout.contains(
                "host.yaml is empty: no providers are configured; run `docsfab setup` to write it."
            ),
            "{stdout}"
        );
        assert!(!stdout.contains("(valid)"), "{stdout}");

        let json = s.docsfab().args(["doctor", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(v["hostFile"]["empty"], true);

        let comp = s.composition(ONE_STEP);
        let out = s.run_command(&comp).output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(out.stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("host.yaml is empty, so no provider is configured; run `docsfab setup` to write it, then run again."),
            "{stderr}"
        );
        assert!(
            !s.store().exists(),
            "a refused run must not create the store"
        );
    }
}

/// A host.yaml with content is still plain "valid".
#[test]
fn hardening_empty_host_yaml_written_file_is_valid() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let out = s.docsfab().arg("doctor").output().unwrap();
    let stdout = text(&out.stdout);
    assert!(stdout.contains("host.yaml (valid)"), "{stdout}");
    assert!(!stdout.contains("is empty"), "{stdout}");
}

/// `runs list`: a header, then per run its status, duration in human units, step and attempt
/// counts, newest first; `--limit` caps the rows (default 20) and the `--json` array, whose
/// documented fields stay exactly as they were.
#[test]
fn hardening_runs_list_table_has_header_duration_counts_and_limit() {
    let tmp = tempfile::tempdir().unwrap();
    // Run 1: a contract retry (prose, then JSON) = 1 step, 2 attempts. Run 2: one attempt.
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer:\n      text: not json at all\n  - answer:\n      json: {modules: [lib]}\n  - answer:\n      json: {modules: [lib, count]}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let out = s.run_command(&comp).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        ids.push(text(&out.stdout).lines().next().unwrap().to_owned());
    }

    let out = s.docsfab().args(["runs", "list"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    assert_table_of_the_two_runs(&listing, &ids);

    let limited = s
        .docsfab()
        .args(["runs", "list", "--limit", "1"])
        .output()
        .unwrap();
    let limited = text(&limited.stdout);
    assert_eq!(limited.lines().count(), 2, "{limited}");
    assert!(
        limited.contains(&ids[1]) && !limited.contains(&ids[0]),
        "{limited}"
    );

    assert_json_limited_to_the_newest_run(&s, &ids);

    let zero = s
        .docsfab()
        .args(["runs", "list", "--limit", "0"])
        .output()
        .unwrap();
    assert_eq!(zero.status.code(), Some(2), "{}", text(&zero.stderr));
}

/// `runs list`'s table of the two runs: the header, then newest first (the second run with one
/// attempt, the first with two) each run's id, status, composition, duration in human units and
/// step and attempt counts.
fn assert_table_of_the_two_runs(listing: &str, ids: &[String]) {
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 3, "{listing}");
    let header: Vec<&str> = lines[0]
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        header,
        [
            "RUN ID",
            "STATUS",
            "COMPOSITION",
            "STARTED",
            "DURATION",
            "STEPS",
            "ATTEMPTS"
        ],
        "{listing}"
    );
    // Newest first: the second run (one attempt), then the first (two).
    for (line, id, attempts) in [(lines[1], &ids[1], "1"), (lines[2], &ids[0], "2")] {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[0], id, "{listing}");
        assert_eq!(cells[1], "succeeded", "{listing}");
        assert_eq!(cells[2], "small", "{listing}");
        // A duration may hold a space (`850 ms`, `3m 05s`): it is every cell before the counts.
        let duration = cells[4..cells.len() - 2].join(" ");
        assert!(
            duration.ends_with(" ms") || duration.ends_with('s'),
            "duration {duration:?} in {listing}"
        );
        assert!(
            duration.starts_with(|c: char| c.is_ascii_digit()),
            "{listing}"
        );
        assert_eq!(cells[cells.len() - 2], "1", "steps: {listing}");
        assert_eq!(cells[cells.len() - 1], attempts, "attempts: {listing}");
    }
}

/// `runs list --json --limit 1`: the newest run alone with exactly its documented fields, and a
/// note on stderr that the list was cut (issue 21), which a whole list does not have.
fn assert_json_limited_to_the_newest_run(s: &Setup, ids: &[String]) {
    let json = s
        .docsfab()
        .args(["runs", "list", "--json", "--limit", "1"])
        .output()
        .unwrap();
    let v: Vec<serde_json::Value> = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["runId"], ids[1].as_str());
    // Issue 21: a cut list says so on stderr (stdout stays the JSON), and a whole one does not.
    let note = text(&json.stderr);
    assert!(
        note.contains("the list stops at --limit 1") && note.contains("pass a larger --limit N"),
        "{note}"
    );
    let whole = s
        .docsfab()
        .args(["runs", "list", "--json", "--limit", "2"])
        .output()
        .unwrap();
    assert!(
        !text(&whole.stderr).contains("the list stops"),
        "{}",
        text(&whole.stderr)
    );
    let mut keys: Vec<&str> = v[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["composition", "endedAt", "runId", "startedAt", "status"]
    );
}
