//! Issue 9, findings 8, 9 and 10, against the real `docsfab` binary and a temporary
//! DOCSFAB_HOME: special files as configuration, refusals that are one clear line in our own
//! words, and `doctor` refusing exactly what `run` refuses.
//!
//! The property tests mutate valid host.yaml and composition files and run `docsfab doctor`
//! on each; whenever doctor refuses, `docsfab run` is run on the same files and must refuse with
//! the same line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use assert_cmd::Command;
use proptest::prelude::*;
use tempfile::TempDir;

/// The variable the test provider reads its key from; always set, so `run` gets past the key.
const KEY_VAR: &str = "HARDENING_TEST_KEY";

/// Library and Rust vocabulary that must never reach an operator.
const INTERNALS: &[&str] = &[
    "serde",
    "u64",
    "u32",
    "usize",
    "Option<",
    "from_str",
    "Depth {",
    "Nodes {",
    "SQL",
    "CREATE ",
    "budget breached",
    "Budget",
    "DuplicateKeyPolicy",
    "externally tagged",
    "deserialize",
    "invalid type",
    "panicked",
    "RUST_BACKTRACE",
];

const HOST: &str = "providers:
  default:
    api: openai-chat
    baseUrl: http://127.0.0.1:9/v1
    apiKeyEnv: HARDENING_TEST_KEY
    model: some-model
readOnlyMaxRetries: 2
catalog:
  retry.maxRetries: 3
  retry.maxTransportRetries: 2
";

const COMPOSITION: &str = "name: quickstart
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
    instructions: Survey the crate.
    tools: [list_files, read_file]
    contract:
      schema: {type: object, required: [modules]}
  - id: pages
    access: write
    instructions: \"Write docs for {{steps.outline.output}}\"
    tools: [read_file, write_file]
    writeRoots: [docs/]
";

struct Scratch {
    home: TempDir,
    files: TempDir,
}

struct Out {
    code: i32,
    stderr: String,
}

impl Scratch {
    fn new() -> Scratch {
        let s = Scratch {
            home: TempDir::new().expect("temp home"),
            files: TempDir::new().expect("temp dir"),
        };
        std::fs::create_dir(s.workspace()).expect("workspace");
        s
    }

    fn workspace(&self) -> PathBuf {
        self.files.path().join("ws")
    }

    fn host_file(&self) -> PathBuf {
        self.home.path().join("host.yaml")
    }

    fn write_host(&self, text: &str) {
        std::fs::write(self.host_file(), text).expect("write host.yaml");
    }

    fn write_composition(&self, text: &str) -> PathBuf {
        let p = self.files.path().join("composition.yaml");
        std::fs::write(&p, text).expect("write composition");
        p
    }

    /// `docsfab ARGS` with a clean environment; a generous kill timer so that a hang fails the
    /// test instead of stalling it (the assertions never depend on how long a command took).
    fn docsfab(&self, args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Out {
        // HARDENING_BIN runs the same checks against another build (the notes' before figures).
        let mut c = match std::env::var_os("HARDENING_BIN") {
            Some(bin) => Command::new(bin),
            None => Command::cargo_bin("docsfab").expect("docsfab binary"),
        };
        c.env_clear()
            .env("DOCSFAB_HOME", self.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(KEY_VAR, "test-key")
            .args(args)
            .timeout(Duration::from_secs(60));
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().expect("run docsfab");
        Out {
            code: o.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    fn doctor(&self, composition: Option<&Path>, env: &[(&str, &str)]) -> Out {
        let mut args: Vec<&std::ffi::OsStr> = vec!["doctor".as_ref()];
        if let Some(p) = composition {
            args.push("--composition".as_ref());
            args.push(p.as_os_str());
        }
        self.docsfab(&args, env)
    }

    fn run(&self, composition: &Path, env: &[(&str, &str)]) -> Out {
        let ws = self.workspace();
        self.docsfab(
            &[
                "run".as_ref(),
                composition.as_os_str(),
                "--workspace".as_ref(),
                ws.as_os_str(),
            ],
            env,
        )
    }
}

/// The refusal standard of the brief: exit 2, one line under 300 characters, no library
/// internals, and none of `secrets` repeated. Returns the line.
fn assert_clear_refusal(out: &Out, secrets: &[&str], what: &str) -> String {
    assert_eq!(
        out.code, 2,
        "{what}: expected exit 2, stderr: {}",
        out.stderr
    );
    let text = out.stderr.trim_end();
    assert_eq!(text.lines().count(), 1, "{what}: not one line: {text}");
    assert!(
        text.chars().count() < 300,
        "{what}: {} characters: {text}",
        text.chars().count()
    );
    // Paths are the operator's own words (and temp directories have random names that can
    // spell `u32` or `SQL`), so internals are looked for in the sentence without its paths.
    let words = without_paths(text);
    for w in INTERNALS {
        assert!(!words.contains(w), "{what}: {w:?} in: {text}");
    }
    for s in secrets {
        assert!(!text.contains(s), "{what}: secret echoed: {text}");
    }
    text.to_string()
}

/// `text` with every absolute path (a word starting with `/`, perhaps after a quote) left out.
fn without_paths(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| !w.trim_start_matches(['`', '"', '\'', '(']).starts_with('/'))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn hardening_refusal_check_ignores_random_temp_names_but_not_the_sentence() {
    let line = "error: /tmp/.tmpdu32zD/host.yaml line 11: a u32 leaked";
    assert_eq!(without_paths(line), "error: line 11: a u32 leaked");
    assert_eq!(without_paths("see `/tmp/SQLx/a`"), "see");
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(status.success());
}

// ---------------------------------------------------------------------------------------------
// Finding 8: special files.

#[test]
fn hardening_special_files_fifo_composition_is_refused_not_waited_on() {
    let s = Scratch::new();
    s.write_host(HOST);
    let fifo = s.files.path().join("fifo.yaml");
    mkfifo(&fifo);
    for out in [s.doctor(Some(&fifo), &[]), s.run(&fifo, &[])] {
        let line = assert_clear_refusal(&out, &[], "fifo composition");
        assert!(
            line.contains("named pipe") && line.contains("fifo.yaml"),
            "{line}"
        );
    }
}

#[test]
fn hardening_special_files_fifo_host_yaml_is_refused_not_waited_on() {
    let s = Scratch::new();
    mkfifo(&s.host_file());
    let line = assert_clear_refusal(&s.doctor(None, &[]), &[], "fifo host.yaml");
    assert!(
        line.contains("named pipe") && line.contains("host.yaml"),
        "{line}"
    );
}

#[test]
fn hardening_special_files_fifo_rules_table_is_refused() {
    let s = Scratch::new();
    mkfifo(&s.home.path().join("retry-policy.yaml"));
    let line = assert_clear_refusal(&s.doctor(None, &[]), &[], "fifo rules table");
    assert!(line.contains("retry-policy.yaml"), "{line}");
}

#[test]
fn hardening_special_files_fifo_and_dev_zero_scenarios_are_refused_by_sim_serve() {
    let s = Scratch::new();
    let fifo = s.files.path().join("scenario.yaml");
    mkfifo(&fifo);
    for path in [fifo.as_os_str(), "/dev/zero".as_ref()] {
        let out = s.docsfab(
            &[
                "sim".as_ref(),
                "serve".as_ref(),
                "--scenario".as_ref(),
                path,
            ],
            &[],
        );
        let line = assert_clear_refusal(&out, &[], "scenario");
        assert!(line.contains("not a regular file"), "{line}");
    }
}

#[test]
fn hardening_special_files_dev_zero_and_directories_are_refused_unread() {
    let s = Scratch::new();
    s.write_host(HOST);
    let line = assert_clear_refusal(
        &s.doctor(Some(Path::new("/dev/zero")), &[]),
        &[],
        "/dev/zero",
    );
    assert!(line.contains("device"), "{line}");
    let line = assert_clear_refusal(&s.doctor(Some(s.files.path()), &[]), &[], "directory");
    assert!(line.contains("directory"), "{line}");
}

#[test]
fn hardening_special_files_a_file_over_one_mib_is_refused() {
    let s = Scratch::new();
    s.write_host(HOST);
    let mut text = COMPOSITION.to_string();
    text.push_str(&"# padding\n".repeat(110_000));
    let p = s.write_composition(&text);
    let line = assert_clear_refusal(&s.doctor(Some(&p), &[]), &[], "oversize");
    assert!(line.contains("larger than 1048576 bytes"), "{line}");
}

// ---------------------------------------------------------------------------------------------
// Finding 9: the refusals the issue lists, one by one.

#[test]
fn hardening_unclear_refusals_limits_name_key_value_and_range() {
    let s = Scratch::new();
    s.write_host(HOST);
    for bad in ["-1", "1.5", "18446744073709551616", "true", "1e400"] {
        let p = s.write_composition(
            &COMPOSITION.replace("timeoutMs: 300000", &format!("timeoutMs: {bad}")),
        );
        let line = assert_clear_refusal(&s.doctor(Some(&p), &[]), &[], bad);
        assert!(line.contains("timeoutMs"), "{bad}: {line}");
        assert!(line.contains(bad), "{bad}: {line}");
        if bad != "1e400" {
            assert!(line.contains("whole number from 1 to"), "{bad}: {line}");
        }
    }
}

#[test]
fn hardening_unclear_refusals_yaml_budget_and_shape_errors_in_our_words() {
    let s = Scratch::new();
    s.write_host(HOST);
    let deep = COMPOSITION.replace(
        "schema: {type: object, required: [modules]}",
        &format!("schema: {}1{}", "{a: ".repeat(70), "}".repeat(70)),
    );
    let cases: Vec<(String, &str)> = vec![
        (deep, "40 levels"),
        (
            COMPOSITION.replace("name: quickstart", "name: ~"),
            "expected text",
        ),
        (
            format!("{COMPOSITION}---\nname: other\n"),
            "more than one YAML document",
        ),
        (
            COMPOSITION.replace("access: read-only", "access: [read-only]"),
            "key access",
        ),
        (
            COMPOSITION.replace("model: some-model", "model: some-model\nmodel: other"),
            "duplicate key",
        ),
    ];
    for (text, expect) in cases {
        let p = s.write_composition(&text);
        let line = assert_clear_refusal(&s.doctor(Some(&p), &[]), &[], expect);
        assert!(line.contains(expect), "{expect}: {line}");
    }
}

#[test]
fn hardening_unclear_refusals_alias_expansion_is_bounded() {
    let s = Scratch::new();
    s.write_host(HOST);
    // The classic "billion laughs": each level doubles the one before through aliases.
    let mut text = String::from("a0: &a0 [x, x]\n");
    for i in 1..40 {
        text.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}]\n", p = i - 1));
    }
    text.push_str(COMPOSITION);
    let p = s.write_composition(&text);
    assert_clear_refusal(&s.doctor(Some(&p), &[]), &[], "alias bomb");
}

#[test]
fn hardening_key_leak_values_that_look_like_keys_are_not_echoed() {
    let secret = "sk-proj-aB3dE5fG7hJ9kL1mN3pQ5";
    let s = Scratch::new();
    s.write_host(HOST);
    let out = s.doctor(None, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", secret)]);
    let line = assert_clear_refusal(&out, &[secret, "aB3dE5fG7h"], "env var");
    assert!(line.contains("DOCSFAB_READ_ONLY_MAX_RETRIES"), "{line}");
    s.write_host(&format!("{HOST}{secret}: 1\n"));
    assert_clear_refusal(&s.doctor(None, &[]), &[secret, "aB3dE5fG7h"], "unknown key");
    s.write_host(&HOST.replace("some-model", secret));
    assert_clear_refusal(&s.doctor(None, &[]), &[secret, "aB3dE5fG7h"], "model");
}

#[test]
fn hardening_unclear_refusals_a_thousand_providers_are_listed_short() {
    let s = Scratch::new();
    let mut host = String::from("providers:\n");
    for i in 0..1000 {
        host.push_str(&format!(
            "  p{i:04}:\n    api: openai-chat\n    baseUrl: http://127.0.0.1:9/v1\n    apiKeyEnv: {KEY_VAR}\n    model: m\n"
        ));
    }
    s.write_host(&host);
    let p = s.write_composition(&COMPOSITION.replace("provider: default", "provider: nope"));
    let line = assert_clear_refusal(&s.doctor(Some(&p), &[]), &[], "1000 providers");
    assert!(line.contains("and 995 more"), "{line}");
    assert_eq!(line, assert_clear_refusal(&s.run(&p, &[]), &[], "run"));
}

#[test]
fn hardening_unclear_refusals_foreign_run_store_is_one_line_without_sql() {
    let s = Scratch::new();
    s.write_host(HOST);
    let db = s.home.path().join("runs.db");
    let conn = rusqlite::Connection::open(&db).expect("sqlite");
    conn.execute_batch("CREATE TABLE runs (x INTEGER); CREATE TABLE attempts (y TEXT);")
        .expect("foreign schema");
    drop(conn);
    let out = s.docsfab(&["runs".as_ref(), "list".as_ref()], &[]);
    let line = assert_clear_refusal(&out, &[], "foreign runs.db");
    assert!(line.contains("runs.db"), "{line}");
    std::fs::write(&db, "not a database at all, just text\n").expect("write");
    let out = s.docsfab(&["runs".as_ref(), "list".as_ref()], &[]);
    assert_clear_refusal(&out, &[], "text runs.db");
}

// ---------------------------------------------------------------------------------------------
// Finding 10: doctor and run agree, and setup refuses the same values.

#[test]
fn hardening_doctor_equals_run_for_the_four_inputs_of_finding_10() {
    let s = Scratch::new();
    let p = s.write_composition(COMPOSITION);
    let key_model = "aB3dE5fG7hJ9kL1mN3pQ5xY";
    let hosts = [
        HOST.replace("http://127.0.0.1:9/v1", "http://"),
        HOST.replace("http://127.0.0.1:9/v1", "http://[::1"),
        HOST.replace("http://127.0.0.1:9/v1", "http://127.0.0.1:99999/v1"),
        HOST.replace("model: some-model", &format!("model: {key_model}")),
    ];
    for host in &hosts {
        s.write_host(host);
        let d = assert_clear_refusal(&s.doctor(Some(&p), &[]), &[key_model], "doctor");
        let plain = assert_clear_refusal(&s.doctor(None, &[]), &[key_model], "doctor");
        let r = assert_clear_refusal(&s.run(&p, &[]), &[key_model], "run");
        assert_eq!(d, r, "doctor and run disagree for {host}");
        assert_eq!(d, plain);
    }
    // setup refuses the same values from its flags.
    for flag in [
        ["--base-url", "http://"],
        ["--base-url", "http://[::1"],
        ["--base-url", "http://127.0.0.1:99999/v1"],
        ["--model", key_model],
    ] {
        std::fs::remove_file(s.host_file()).ok();
        let out = s.docsfab(&["setup".as_ref(), flag[0].as_ref(), flag[1].as_ref()], &[]);
        assert_clear_refusal(&out, &[key_model], flag[1]);
        assert!(
            !s.host_file().exists(),
            "setup wrote a file it then refused"
        );
    }
}

#[test]
fn hardening_doctor_equals_run_a_composition_model_that_looks_like_a_key() {
    let s = Scratch::new();
    s.write_host(HOST);
    let key_model = "aB3dE5fG7hJ9kL1mN3pQ5xY";
    let p = s.write_composition(
        &COMPOSITION.replace("model: some-model", &format!("model: {key_model}")),
    );
    let d = assert_clear_refusal(&s.doctor(Some(&p), &[]), &[key_model], "doctor");
    let r = assert_clear_refusal(&s.run(&p, &[]), &[key_model], "run");
    assert_eq!(d, r);
}

// ---------------------------------------------------------------------------------------------
// The property: any mutation of a valid file is accepted or refused clearly, and doctor and
// run agree on every refusal.

/// A replacement for one value.
fn nasty_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("-1".to_string()),
        Just("1.5".to_string()),
        Just("18446744073709551616".to_string()),
        Just("340282366920938463463374607431768211457".to_string()),
        Just("true".to_string()),
        Just("1e400".to_string()),
        Just("-1e400".to_string()),
        Just(".nan".to_string()),
        Just("0x1F".to_string()),
        Just("null".to_string()),
        Just("~".to_string()),
        Just("\"\"".to_string()),
        Just("[1, 2]".to_string()),
        Just("{a: 1}".to_string()),
        Just("!!binary aGVsbG8=".to_string()),
        Just("*nowhere".to_string()),
        Just("'unterminated".to_string()),
        Just("\"\\u0000\"".to_string()),
        Just("\"a\\nb\"".to_string()),
        Just("\"http://\"".to_string()),
        Just("\"http://[::1\"".to_string()),
        Just("http://127.0.0.1:99999/v1".to_string()),
        (1usize..6000).prop_map(|n| "a".repeat(n)),
        (41usize..200).prop_map(|n| "[".repeat(n) + &"]".repeat(n)),
    ]
}

/// A key-shaped secret: a known prefix plus a random token, or a long mixed-case token.
fn secret() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9]{24,40}".prop_map(|t| format!("sk-proj-{t}")),
        "[a-z]{6}[A-Z]{6}[0-9]{6}[a-zA-Z0-9]{4,20}",
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the value on a `key: value` line.
    Value(usize, String),
    /// Replace the value on a line with a secret.
    SecretValue(usize, String),
    /// Replace the key on a line with a secret.
    SecretKey(usize, String),
    /// A second document after the first.
    SecondDocument,
    /// Nest lists deeper than the budget under a new key.
    Deep(usize),
    /// Aliases doubling level by level.
    Aliases(usize),
    /// Replace the leading spaces of a line with a tab.
    Tab(usize),
    /// Repeat a line (a duplicate key, or a bad indentation).
    Duplicate(usize),
    /// Cut the file after this many bytes.
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (0usize..64, nasty_value()).prop_map(|(l, v)| Mutation::Value(l, v)),
        2 => (0usize..64, secret()).prop_map(|(l, v)| Mutation::SecretValue(l, v)),
        1 => (0usize..64, secret()).prop_map(|(l, v)| Mutation::SecretKey(l, v)),
        1 => Just(Mutation::SecondDocument),
        1 => (41usize..300).prop_map(Mutation::Deep),
        1 => (8usize..40).prop_map(Mutation::Aliases),
        1 => (0usize..64).prop_map(Mutation::Tab),
        1 => (0usize..64).prop_map(Mutation::Duplicate),
        1 => (0usize..1000).prop_map(Mutation::Truncate),
    ]
}

/// Applies `m` to `text`; returns the new text and the secret it inserted, if any.
fn apply(text: &str, m: &Mutation) -> (String, Option<String>) {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let n = lines.len();
    let value_lines: Vec<usize> = (0..n).filter(|&i| lines[i].contains(": ")).collect();
    let pick = |i: usize| value_lines[i % value_lines.len()];
    let mut secret = None;
    match m {
        Mutation::Value(i, v) | Mutation::SecretValue(i, v) => {
            let l = pick(*i);
            let (k, _) = lines[l].split_once(": ").expect("value line");
            lines[l] = format!("{k}: {v}");
            if matches!(m, Mutation::SecretValue(..)) {
                secret = Some(v.clone());
            }
        }
        Mutation::SecretKey(i, v) => {
            let l = pick(*i);
            let (k, rest) = lines[l].split_once(": ").expect("value line");
            let indent = &k[..k.len() - k.trim_start().len()];
            let dash = if k.trim_start().starts_with("- ") {
                "- "
            } else {
                ""
            };
            lines[l] = format!("{indent}{dash}{v}: {rest}");
            secret = Some(v.clone());
        }
        Mutation::SecondDocument => lines.extend(["---".to_string(), "name: other".to_string()]),
        Mutation::Deep(d) => lines.push(format!("deep: {}{}", "[".repeat(*d), "]".repeat(*d))),
        Mutation::Aliases(levels) => {
            let mut pre = vec!["a0: &a0 [x, x]".to_string()];
            for i in 1..*levels {
                pre.push(format!("a{i}: &a{i} [*a{p}, *a{p}]", p = i - 1));
            }
            pre.extend(lines);
            lines = pre;
        }
        Mutation::Tab(i) => {
            let l = i % n;
            let trimmed = lines[l].trim_start().to_string();
            lines[l] = format!("\t{trimmed}");
        }
        Mutation::Duplicate(i) => {
            let l = i % n;
            let copy = lines[l].clone();
            lines.insert(l, copy);
        }
        Mutation::Truncate(at) => {
            let joined = lines.join("\n");
            let mut cut = (*at).min(joined.len());
            while !joined.is_char_boundary(cut) {
                cut -= 1;
            }
            return (joined[..cut].to_string(), None);
        }
    }
    (lines.join("\n") + "\n", secret)
}

/// Checks one mutated pair of files: doctor exits 0 or refuses clearly; on a refusal run
/// refuses with the same line.
fn check_mutated(s: &Scratch, host: &str, composition: &str, secret: Option<&str>) {
    s.write_host(host);
    let p = s.write_composition(composition);
    let secrets: Vec<&str> = secret.into_iter().collect();
    let d = s.doctor(Some(&p), &[]);
    note_outcome(d.code);
    if d.code == 0 {
        return;
    }
    let line = assert_clear_refusal(&d, &secrets, "doctor on a mutated file");
    let r = s.run(&p, &[]);
    assert_eq!(
        assert_clear_refusal(&r, &secrets, "run on a mutated file"),
        line,
        "doctor and run disagree"
    );
}

/// With HARDENING_STATS=FILE, appends each doctor exit code to FILE, to count how many
/// mutations were refused (the figure in the notes); otherwise does nothing.
fn note_outcome(code: i32) {
    use std::io::Write as _;
    if let Some(path) = std::env::var_os("HARDENING_STATS") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("stats file");
        writeln!(f, "{code}").expect("write stats");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn hardening_unclear_refusals_mutated_host_yaml(m in mutation()) {
        let s = Scratch::new();
        let (host, secret) = apply(HOST, &m);
        check_mutated(&s, &host, COMPOSITION, secret.as_deref());
    }

    #[test]
    fn hardening_unclear_refusals_mutated_composition(m in mutation()) {
        let s = Scratch::new();
        let (composition, secret) = apply(COMPOSITION, &m);
        check_mutated(&s, HOST, &composition, secret.as_deref());
    }
}
