//! Issue 11, "progress a person can follow": what `docsfab run` shows while it goes and when it
//! ends, as real processes against `docsfab sim serve`. Piped runs read stdout and stderr apart;
//! terminal runs go through a real pseudo-terminal (util-linux `script`), where both streams
//! land on one screen, as they do for a person.

mod support;

use std::process::{Command, Output, Stdio};

use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim, looks_like_run_id};

const GREEN: &str = "\u{1b}[32m";
const RED: &str = "\u{1b}[31m";
const RESET: &str = "\u{1b}[0m";

/// A survey that lists and reads, asks for a tool the step does not have and for a file outside
/// the workspace, then answers.
const SURVEY: &str = "responses:
  - answer:
      tool_calls:
        - {name: list_files, arguments: {path: src}}
        - {name: read_file, arguments: {path: src/lib.rs}}
        - {name: grep, arguments: {pattern: fn}}
        - {name: read_file, arguments: {path: ../../etc/passwd}}
  - answer:
      json: {modules: [lib, count]}
";

const ANSWER: &str = "responses:\n  - answer:\n      json: {modules: [lib]}\n";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `cmd` run on a pseudo-terminal as stdin, stdout and stderr at once (TERM=xterm unless `cmd`
/// sets it); returns the exit status and the terminal's transcript.
fn on_pty(cmd: &Command) -> (Option<i32>, String) {
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let mut line = quote(cmd.get_program());
    for a in cmd.get_args() {
        line.push(' ');
        line.push_str(&quote(a));
    }
    let mut script = Command::new("script");
    script
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => script.env(k, v),
            None => script.env_remove(k),
        };
    }
    let out = script.output().expect("util-linux script runs");
    // The terminal turns \n into \r\n; the status line redraws with \r.
    (out.status.code(), text(&out.stdout).replace("\r\n", "\n"))
}

/// A piped run of `scenario` through [`ONE_STEP`] with `args` after `run COMPOSITION`.
fn piped(scenario: &str, args: &[&str]) -> (Output, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), scenario);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let out = s
        .run_command(&s.composition(ONE_STEP))
        .args(args)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    (out, stdout, stderr)
}

/// Every turn line names the tools it ran and their paths; a call that did not run says why
/// (a tool the step lacks, a path outside the workspace). Piped, the lines carry no color.
#[test]
fn issue11_progress_names_each_tool_and_its_path_and_why_a_call_did_not_run() {
    let (out, stdout, stderr) = piped(SURVEY, &[]);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let turn = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("turn 1: completed; "))
        .unwrap_or_else(|| panic!("no turn 1 line in:\n{stderr}"));
    assert!(
        turn.starts_with(
            "    turn 1: completed; list_files src, read_file src/lib.rs, grep \"fn\" (rejected: no such tool in this step), read_file ../../etc/passwd (refused: "
        ),
        "{turn}"
    );
    assert!(!turn.contains("tools requested"), "{turn}");
    assert!(!stderr.contains('\u{1b}') && !stdout.contains('\u{1b}'));
}

/// A failed turn says why it failed, on its own line, as the provider's failure reads.
#[test]
fn issue11_a_failed_turn_names_its_reason() {
    let (out, stdout, stderr) = piped("responses:\n  - status: 400\n", &[]);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let turn = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("turn 1: failed"))
        .unwrap_or_else(|| panic!("no failed turn in:\n{stderr}"));
    let reason = turn
        .trim_start()
        .strip_prefix("turn 1: failed: ")
        .unwrap_or_else(|| panic!("no reason: {turn:?}"));
    assert!(reason.contains("400"), "{turn}");
}

/// The summary gives the run's time in human units, names what the run produced and where to
/// read more (`runs show`; `runs diff` only when a step could write).
#[test]
fn issue11_the_summary_points_to_runs_show_in_human_units() {
    let (out, stdout, stderr) = piped(ANSWER, &[]);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let id = stdout.lines().next().unwrap();
    let head = stdout.lines().nth(1).unwrap();
    let took = head
        .strip_prefix(&format!("Run {id} succeeded in "))
        .and_then(|rest| rest.strip_suffix(" (composition small)"))
        .unwrap_or_else(|| panic!("{head:?}"));
    assert!(took.ends_with(" ms") || took.ends_with(" s"), "{took:?}");
    assert!(
        stdout.contains(&format!("docsfab runs show {id}\n")),
        "{stdout}"
    );
    assert!(!stdout.contains("runs diff"), "read-only: {stdout}");
}

/// `--color always` colors even into a pipe: the step outcome on stderr and the status words
/// of the summary on stdout; without the escapes the text is the plain text.
#[test]
fn issue11_color_always_colors_a_piped_run() {
    let (out, stdout, stderr) = piped(ANSWER, &["--color", "always"]);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("{GREEN}step outline succeeded{RESET}")),
        "{stderr:?}"
    );
    let id = stdout.lines().next().unwrap();
    assert!(looks_like_run_id(id), "the id line stays plain: {id:?}");
    assert!(
        stdout.contains(&format!("Run {id} {GREEN}succeeded{RESET} in ")),
        "{stdout:?}"
    );
    let plain = stderr.replace(GREEN, "").replace(RESET, "");
    assert!(plain.contains("\nstep outline succeeded\n"), "{plain}");
}

/// One run on a terminal: color is on, failed turns are red, and the run id is on the screen
/// once (the stdout id line), not again as a `run ID` progress line. Piped, both stay.
#[test]
fn issue11_on_a_terminal_the_run_id_shows_once_and_status_words_are_colored() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - status: 400\n  - answer: {json: {modules: [lib]}}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let (code, screen) = on_pty(&s.run_command(&comp));
    assert_eq!(code, Some(1), "{screen}");
    // The status line redraws in place (`\r`, erase line): split the screen where it does.
    let pieces: Vec<&str> = screen
        .split(['\r', '\n'])
        .map(|p| p.trim_start_matches("\u{1b}[2K").trim())
        .collect();
    let id = pieces
        .iter()
        .find(|p| looks_like_run_id(p))
        .unwrap_or_else(|| panic!("no id line in {screen:?}"))
        .to_string();
    assert_eq!(pieces.iter().filter(|p| **p == id).count(), 1, "{screen:?}");
    assert!(
        !pieces.iter().any(|p| *p == format!("run {id}")),
        "{screen:?}"
    );
    assert!(
        screen.contains(&format!("{RED}    turn 1: failed: ")),
        "{screen:?}"
    );
    assert!(screen.contains(&format!("{RED}step outline failed{RESET}")));

    // The same run piped keeps the `run ID` line on stderr, as before.
    let out = s.run_command(&comp).output().unwrap();
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    assert!(text(&out.stderr).starts_with(&format!("run {id}\n")));
}

/// NO_COLOR (any non-empty value) and `--color never` turn color off on a terminal; an empty
/// NO_COLOR does not; `--color always` outranks NO_COLOR.
#[test]
fn issue11_no_color_and_color_never_keep_a_terminal_plain() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer: {json: {modules: [lib]}}\n  - answer: {json: {modules: [lib]}}\n  - answer: {json: {modules: [lib]}}\n  - answer: {json: {modules: [lib]}}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let colored = |screen: &str| screen.contains(GREEN);
    let run = |env: Option<&str>, flag: &[&str]| {
        let mut cmd = s.run_command(&comp);
        cmd.args(flag);
        if let Some(v) = env {
            cmd.env("NO_COLOR", v);
        }
        let (code, screen) = on_pty(&cmd);
        assert_eq!(code, Some(0), "{screen}");
        screen
    };
    assert!(!colored(&run(Some("1"), &[])), "NO_COLOR=1");
    assert!(!colored(&run(None, &["--color", "never"])), "--color never");
    assert!(colored(&run(Some(""), &[])), "an empty NO_COLOR is unset");
    assert!(
        colored(&run(Some("1"), &["--color=always"])),
        "--color always"
    );
}

/// A run with a write step names each write in its progress line and ends pointing at
/// `runs diff` as well as `runs show`, after naming the files it wrote.
#[test]
fn issue11_a_write_run_names_its_writes_and_points_to_runs_diff() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/a.md, content: hello}}
  - answer: {text: done}
",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(
        "name: writer\nlimits:\n  timeoutMs: 60000\n  maxTurns: 4\nsteps:\n  - id: pages\n    access: write\n    instructions: Write docs/a.md.\n    tools: [write_file]\n    writeRoots: [docs/]\n",
    );
    let out = s.run_command(&comp).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("\n    turn 1: completed; write_file docs/a.md\n"),
        "{stderr}"
    );
    let id = stdout.lines().next().unwrap();
    assert!(
        stdout.ends_with(&format!(
            "Files written: docs/a.md (5 B)\nEvery attempt, turn and retry decision: docsfab runs show {id}\nWhat it wrote, as a diff: docsfab runs diff {id}\n"
        )),
        "{stdout}"
    );
    // `runs show` names each call of a turn with its outcome.
    let show = s.docsfab().args(["runs", "show", id]).output().unwrap();
    let show = text(&show.stdout);
    assert!(show.contains("\n      tools: write_file (ok)\n"), "{show}");
}

/// Doctor keeps its fixed lines byte for byte and gives their times in human units beside them:
/// the attempt timer on its line, the retry envelope on the line after it (the issue's
/// `12600000ms` reads `3h 30m`).
#[test]
fn issue11_doctor_gives_the_envelope_in_human_units_below_its_exact_line() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let comp = s.composition(
        "name: long\nlimits:\n  timeoutMs: 1800000\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Survey.\n    tools: [read_file]\n",
    );
    let out = s
        .docsfab()
        .args(["doctor", "--composition"])
        .arg(&comp)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "Retry envelope: attempts<=10 contract<=7200000ms transport<=5400000ms total<=12600000ms (exceeds runtime.deadlineMilliseconds=10800000)\n  = contract 2h 00m, transport 1h 30m, total 3h 30m; deadline 3h 00m\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("Attempt timer: 1800000ms = 30m 00s (composition limits.timeoutMs)\n"),
        "{stdout}"
    );
}

/// Issue 12: on a terminal a fan-out gets one live status line per running instance (its
/// step, attempt, turn and replays), and an instance's line goes when it ends.
#[test]
fn issue12_on_a_terminal_each_running_fan_out_instance_has_its_own_live_line() {
    let tmp = tempfile::tempdir().unwrap();
    // Instance `slow` holds its answer longer than `quick`, so for a while both run, and
    // then only `slow` does. `quick` is replayed once first.
    let sim = Sim::start(
        tmp.path(),
        "responses:
  - answer: {json: {modules: [{name: quick}, {name: slow}]}}
lanes:
  - contains: module quick
    responses:
      - status: 503
      - delay_ms: 1500
        answer: {json: {page: quick}}
  - contains: module slow
    responses:
      - delay_ms: 4000
        answer: {json: {page: slow}}
",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(
        "name: fan
limits:
  timeoutMs: 60000
steps:
  - id: outline
    access: read-only
    instructions: List the modules.
    contract:
      schema: {type: object, required: [modules]}
  - id: pages
    access: read-only
    forEach: steps.outline.output.modules
    concurrency: 2
    instructions: \"Describe module {{item.name}}.\"
    contract:
      schema: {type: object, required: [page]}
",
    );
    let (code, screen) = on_pty(&s.run_command(&comp));
    assert_eq!(code, Some(0), "{screen}");
    // indicatif pads each line to the terminal's width rather than ending it, and redraws in
    // place (`\r`, cursor moves, erase line): split the screen where a line ends or is padded.
    let plain = strip_escapes(&screen);
    let pieces: Vec<&str> = plain
        .split(['\r', '\n'])
        .flat_map(|p| p.split("   "))
        .map(|p| {
            p.trim_start_matches(|c| ('\u{2800}'..='\u{28ff}').contains(&c))
                .trim()
        })
        .filter(|p| !p.is_empty())
        .collect();
    let quick = "step pages[0] · attempt 1 (initial) · turn 1 · 1 replay";
    let slow = "step pages[1] · attempt 1 (initial) · turn 1";
    let both = pieces
        .windows(2)
        .any(|w| w[0].contains(quick) && w[1].contains(slow));
    assert!(both, "no frame with both instance lines: {screen:?}");
    // After `quick` ends, frames show `slow` alone.
    let ended = pieces
        .iter()
        .position(|p| p.contains("step pages[0] succeeded"))
        .unwrap_or_else(|| panic!("{screen:?}"));
    let after = &pieces[ended..];
    assert!(after.iter().any(|p| p.contains(slow)), "{screen:?}");
    assert!(
        !after.iter().any(|p| p.contains("step pages[0] ·")),
        "the ended instance's line stayed: {screen:?}"
    );
}

/// `text` without its CSI escape sequences (colors, cursor moves, erase line).
fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
