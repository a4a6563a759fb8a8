//! Issue 12: the shared provider throttle's host.yaml settings (`providers.NAME.throttle`,
//! `providers.NAME.maxConcurrentRequests`) as real `docsfab doctor`, `setup` and `run`
//! processes against a temporary DOCSFAB_HOME: what doctor prints, what setup writes, and the
//! one-sentence refusals (exit 2, nothing on stdout, no run recorded).

use assert_cmd::Command;
use serde_json::Value;
use tempfile::TempDir;

/// A provider entry on loopback (no DNS lookup), followed by `extra` lines.
fn provider(name: &str, extra: &str) -> String {
    format!(
        "  {name}:\n    api: openai-chat\n    baseUrl: http://127.0.0.1:9/v1\n    apiKeyEnv: DOCSFAB_TEST_KEY\n    model: m\n{extra}"
    )
}

struct Home {
    dir: TempDir,
    files: TempDir,
}

impl Home {
    fn with_host(text: &str) -> Home {
        let h = Home {
            dir: TempDir::new().expect("temp home"),
            files: TempDir::new().expect("temp dir"),
        };
        if !text.is_empty() {
            std::fs::write(h.host_file(), text).expect("write host.yaml");
        }
        h
    }

    fn host_file(&self) -> std::path::PathBuf {
        self.dir.path().join("host.yaml")
    }

    fn run(&self, args: &[&str]) -> Out {
        let o = Command::cargo_bin("docsfab")
            .expect("docsfab binary")
            .env_clear()
            .env("DOCSFAB_HOME", self.dir.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .current_dir(self.files.path())
            .args(args)
            .output()
            .expect("run docsfab");
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn ok(&self) -> &Out {
        assert_eq!(
            self.code, 0,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }

    /// Exit 2, nothing on stdout, exactly `sentence` on stderr.
    fn refused_with(&self, sentence: &str) {
        assert_eq!(
            self.code, 2,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert_eq!(self.stdout, "", "{}", self.stderr);
        assert_eq!(self.stderr, format!("error: {sentence}\n"));
    }
}

#[test]
fn issue12_doctor_prints_each_providers_throttle_with_its_source() {
    let host = format!(
        "providers:\n{}{}{}",
        provider("a", ""),
        provider("b", "    maxConcurrentRequests: 16\n    throttle: off\n"),
        provider("c", "    maxConcurrentRequests: 2\n"),
    );
    let h = Home::with_host(&host);
    let o = h.run(&["doctor"]);
    o.ok();
    for want in [
        "Provider a throttle=shared maxConcurrentRequests=8 (default)\n",
        "Provider b throttle=off maxConcurrentRequests=16 (host.yaml)\n",
        "Provider c throttle=shared maxConcurrentRequests=2 (throttle: default, maxConcurrentRequests: host.yaml)\n",
    ] {
        assert!(o.stdout.contains(want), "{want}\n{}", o.stdout);
    }
    // The existing provider line is unchanged, and the new line follows that provider's lines.
    let lines: Vec<&str> = o.stdout.lines().collect();
    let at = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix)).unwrap();
    assert!(lines.contains(
        &"Provider b: api=openai-chat baseUrl=http://127.0.0.1:9/v1 model=m apiKeyEnv=DOCSFAB_TEST_KEY (not set)"
    ));
    assert!(
        at("Provider b:") < at("Provider b throttle=")
            && at("Provider b throttle=") < at("Provider c:")
    );

    let o = h.run(&["doctor", "--json"]);
    o.ok();
    let v: Value = serde_json::from_str(&o.stdout).expect("one JSON object");
    let throttle = |name: &str| {
        v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["throttle"].clone())
            .unwrap()
    };
    assert_eq!(
        throttle("a"),
        serde_json::json!({"mode": "shared", "maxConcurrentRequests": 8,
            "sources": {"mode": "default", "maxConcurrentRequests": "default"}})
    );
    assert_eq!(
        throttle("b"),
        serde_json::json!({"mode": "off", "maxConcurrentRequests": 16,
            "sources": {"mode": "host.yaml", "maxConcurrentRequests": "host.yaml"}})
    );
    assert_eq!(throttle("c")["sources"]["mode"], "default");
}

#[test]
fn issue12_out_of_range_max_concurrent_requests_is_refused_by_doctor_and_run() {
    let host = format!(
        "providers:\n{}",
        provider("default", "    maxConcurrentRequests: 65\n")
    );
    let h = Home::with_host(&host);
    let path = h.host_file().display().to_string();
    let sentence = format!(
        "{path} line 7: providers.default.maxConcurrentRequests: 65 is outside the allowed range 1..64; give the requests in flight at once as a whole number from 1 through 64 (default 8); fix the value or rerun `docsfab setup`."
    );
    h.run(&["doctor"]).refused_with(&sentence);

    let composition = h.files.path().join("c.yaml");
    std::fs::write(
        &composition,
        "name: c\nsteps:\n  - id: s\n    access: read-only\n    instructions: Look.\n    tools: [list_files]\n",
    )
    .unwrap();
    h.run(&["run", composition.to_str().unwrap()])
        .refused_with(&sentence);
    assert!(
        !h.dir.path().join("runs.db").exists(),
        "a refused run leaves no run store behind"
    );
}

#[test]
fn issue12_bad_throttle_values_are_one_sentence_each() {
    let cases = [
        (
            "    maxConcurrentRequests: 0\n",
            "providers.p.maxConcurrentRequests: 0 is outside the allowed range 1..64; give the requests in flight at once as a whole number from 1 through 64 (default 8)",
        ),
        (
            "    maxConcurrentRequests: 4.5\n",
            "providers.p.maxConcurrentRequests: \"4.5\" is not a whole number; give the requests in flight at once as a whole number from 1 through 64 (default 8)",
        ),
        (
            "    throttle: adaptive\n",
            "providers.p.throttle: \"adaptive\" is not a throttle mode; use shared or off (default shared)",
        ),
        (
            "    throttle: false\n",
            "providers.p.throttle: \"false\" is not a throttle mode; use shared or off (default shared)",
        ),
    ];
    for (extra, reason) in cases {
        let h = Home::with_host(&format!("providers:\n{}", provider("p", extra)));
        let path = h.host_file().display().to_string();
        h.run(&["doctor"]).refused_with(&format!(
            "{path} line 7: {reason}; fix the value or rerun `docsfab setup`."
        ));
    }
}

#[test]
fn issue12_setup_writes_the_throttle_flags_and_keeps_them() {
    let h = Home::with_host("");
    let o = h.run(&[
        "setup",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--max-concurrent-requests",
        "4",
        "--throttle",
        "off",
    ]);
    o.ok();
    assert!(
        o.stdout
            .contains("\nProvider default throttle=off maxConcurrentRequests=4\n"),
        "{}",
        o.stdout
    );
    let text = std::fs::read_to_string(h.host_file()).unwrap();
    assert!(
        text.contains("    maxConcurrentRequests: 4\n    throttle: \"off\"\n"),
        "{text}"
    );
    // A later setup without the flags keeps them.
    h.run(&["setup", "--model", "m2"]).ok();
    let o = h.run(&["doctor"]);
    o.ok();
    assert!(
        o.stdout
            .contains("Provider default throttle=off maxConcurrentRequests=4 (host.yaml)\n"),
        "{}",
        o.stdout
    );
}

#[test]
fn issue12_setup_refuses_bad_throttle_flags_and_writes_nothing() {
    let h = Home::with_host("");
    h.run(&["setup", "--max-concurrent-requests", "0"]).refused_with(
        "--max-concurrent-requests: 0 is outside the allowed range 1..64; give the requests in flight at once as a whole number from 1 through 64 (default 8).",
    );
    h.run(&["setup", "--throttle", "on"]).refused_with(
        "--throttle: \"on\" is not a throttle mode; use shared or off (default shared).",
    );
    assert!(!h.host_file().exists());
}
