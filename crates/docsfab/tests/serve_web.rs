//! Issue 15: the web page of `docsfab serve`, used in headless Chromium as a person would. A real
//! `docsfab serve` runs against a real `docsfab sim serve`; playwright-core (npm) drives Debian's
//! `chromium` through `tests/web/serve_page.mjs`: submit a composition through the form, watch
//! the status change to `succeeded`, open the report link, submit a run that waits on the
//! provider and cancel it with the keyboard, see `cancelled`, rerun the first one, and see the
//! server's sentence for a refused submission next to the form; axe-core finds no WCAG 2.1 A/AA
//! violation on the page (nor on the sign-in page). The store is then read with
//! `docsfab runs show` to prove the page showed what happened. Issue 34 adds the Resume button
//! (`tests/web/resume_page.mjs`): a failed run resumed from the page, its lineage on the page
//! and in the resumed run's report.
//!
//! Needs `node`, `/usr/bin/chromium` (or `chromium` on PATH), and playwright-core and axe-core
//! from npm: `npm install --prefix target/web-tools playwright-core@1.65.1 axe-core@4.14.1`
//! (or in the directory `DOCSFAB_PLAYWRIGHT_DIR` names). Without them the tests print a line and
//! pass, unless `DOCSFAB_REQUIRE_BROWSER=1` (CI), where they fail saying what to install.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim, bin};

/// The quick run takes the first answer; every later request (the long run's) waits ten minutes,
/// far past the test, so only a cancel ends that run.
const SCENARIO: &str = "responses:\n  - answer:\n      json: {modules: [lib, count]}\n  - answer:\n      json: {modules: [late]}\n    delay_ms: 600000\nfallback: repeat-last\n";

const TOKEN_VAR: &str = "DOCSFAB_TEST_SERVE_TOKEN";
const TOKEN: &str = "web-test-token-7f3a9c";

/// What the browser test needs: node, the browser, and playwright-core.
struct Tools {
    node: PathBuf,
    chromium: PathBuf,
    playwright_dir: PathBuf,
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The tools, or `None` (after a line on stderr) when one is missing and CI did not ask for them.
fn tools() -> Option<Tools> {
    let target = bin().parent().unwrap().parent().unwrap().to_path_buf();
    let playwright_dir = std::env::var_os("DOCSFAB_PLAYWRIGHT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("web-tools"));
    let chromium = std::env::var_os("DOCSFAB_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/bin/chromium")).filter(|p| p.is_file()))
        .or_else(|| on_path("chromium"));
    let node = on_path("node");
    let has_playwright = ["playwright-core", "axe-core"].iter().all(|package| {
        playwright_dir
            .join("node_modules")
            .join(package)
            .join("package.json")
            .is_file()
    });
    let missing: Vec<&str> = [
        (node.is_none(), "node"),
        (chromium.is_none(), "Debian's chromium (apt-get install -y chromium)"),
        (
            !has_playwright,
            "playwright-core and axe-core (npm install --prefix target/web-tools playwright-core@1.65.1 axe-core@4.14.1, or set DOCSFAB_PLAYWRIGHT_DIR)",
        ),
    ]
    .into_iter()
    .filter_map(|(gone, what)| gone.then_some(what))
    .collect();
    if missing.is_empty() {
        return Some(Tools {
            node: node.unwrap(),
            chromium: chromium.unwrap(),
            playwright_dir,
        });
    }
    let sentence = format!(
        "the serve web page test drives a real browser and is missing {}.",
        missing.join(", ")
    );
    if std::env::var("DOCSFAB_REQUIRE_BROWSER").as_deref() == Ok("1") {
        panic!("{sentence} DOCSFAB_REQUIRE_BROWSER=1 is set, so this fails instead of skipping.");
    }
    eprintln!("skipping: {sentence}");
    None
}

/// A `docsfab serve` process on 127.0.0.1:0; killed on drop.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start(setup: &Setup, extra: &[&str], stderr_log: &Path) -> Serve {
        let mut child = setup
            .docsfab()
            .env(TOKEN_VAR, TOKEN)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .arg("--workspace-root")
            .arg(setup.dir.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(stderr_log).unwrap())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let Some(url) = first.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            panic!(
                "unexpected first line from docsfab serve: {first:?}; stderr: {}",
                std::fs::read_to_string(stderr_log).unwrap_or_default()
            );
        };
        Serve {
            url: url.to_owned(),
            child,
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the page's screenshot goes: `DOCSFAB_SERVE_SCREENSHOT`, else
/// `target/report-screenshots/serve-page[-token].png`.
fn screenshot_path(name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os("DOCSFAB_SERVE_SCREENSHOT") {
        return PathBuf::from(path);
    }
    let dir = bin()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("report-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs the browser script against a fresh server and returns what it reported, after checking
/// the store agrees with what the page showed.
fn drive_page(tools: &Tools, with_token: bool, shot: &str) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), SCENARIO);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let quick = setup.dir.path().join("quick.yaml");
    std::fs::write(&quick, ONE_STEP).unwrap();
    let long = setup.dir.path().join("long.yaml");
    std::fs::write(
        &long,
        ONE_STEP.replace("name: small", "name: waits-for-cancel"),
    )
    .unwrap();
    let profile = setup.dir.path().join("chromium-profile");
    std::fs::create_dir_all(&profile).unwrap();
    let serve_log = setup.dir.path().join("serve.stderr");
    let mut extra = vec!["--jobs", "2"];
    if with_token {
        extra.extend(["--token-env", TOKEN_VAR]);
    }
    let serve = Serve::start(&setup, &extra, &serve_log);

    let mut script = Command::new(&tools.node);
    script
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/serve_page.mjs"))
        .env("DOCSFAB_SERVE_URL", &serve.url)
        .env("DOCSFAB_PLAYWRIGHT_DIR", &tools.playwright_dir)
        .env("DOCSFAB_CHROMIUM", &tools.chromium)
        .env("DOCSFAB_WORKSPACE", setup.workspace())
        .env("DOCSFAB_QUICK_COMPOSITION", &quick)
        .env("DOCSFAB_LONG_COMPOSITION", &long)
        .env("DOCSFAB_PROFILE", &profile)
        .env("DOCSFAB_SCREENSHOT", screenshot_path(shot))
        .env_remove("DOCSFAB_TOKEN");
    if with_token {
        script.env("DOCSFAB_TOKEN", TOKEN);
    }
    let out = script.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "serve_page.mjs failed:\n{stderr}\n{stdout}\nserver stderr:\n{}",
        std::fs::read_to_string(&serve_log).unwrap_or_default()
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();

    // The store agrees with the page: one run succeeded, the other was cancelled.
    let succeeded = setup.show_json(report["succeeded"].as_str().unwrap());
    assert_eq!(succeeded["status"], "succeeded");
    assert_eq!(succeeded["composition"], "small");
    assert_eq!(succeeded["steps"][0]["output"]["modules"][1], "count");
    let cancelled = setup.show_json(report["cancelled"].as_str().unwrap());
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["composition"], "waits-for-cancel");
    // The attempt the cancel ended is recorded, and the page counted it.
    assert_eq!(cancelled["steps"][0]["attempts"][0]["status"], "cancelled");
    assert_eq!(report["cancelledAttempts"], "1", "{report}");
    // The Rerun button queued a new run of the succeeded one's submission.
    let rerun = setup.show_json(report["rerun"].as_str().unwrap());
    assert_eq!(rerun["composition"], "small");
    assert!(["queued", "running"].contains(&rerun["status"].as_str().unwrap()));
    // The page showed the server's own sentence for a refused submission.
    assert!(
        report["refused"]
            .as_str()
            .unwrap()
            .contains("is not under the workspace root"),
        "{report}"
    );
    drop(serve);
    let log = std::fs::read_to_string(&serve_log).unwrap_or_default();
    assert!(!log.contains(TOKEN), "the server logged the token: {log}");
    report
}

/// The page, without a token: submit, watch `succeeded`, open the report, cancel a running run.
#[test]
fn issue15_web_page_submits_follows_reports_and_cancels_runs_in_chromium() {
    let Some(tools) = tools() else { return };
    let report = drive_page(&tools, false, "serve-page.png");
    assert!(report["axeRulesPassed"].as_u64().unwrap() > 0);
    assert!(
        report["reportTitle"]
            .as_str()
            .unwrap()
            .contains(report["succeeded"].as_str().unwrap())
    );
}

/// With `--token-env`, GET / answers the sign-in page (401); the token entered there becomes the
/// `docsfab_token` cookie, and the page's API calls and the report link work with it.
#[test]
fn issue15_web_page_signs_in_with_the_token_cookie_in_chromium() {
    let Some(tools) = tools() else { return };
    let report = drive_page(&tools, true, "serve-page-token.png");
    assert_eq!(report["signedIn"], true);
    assert!(report["axeRulesPassedOnSignIn"].as_u64().unwrap() > 0);
}

/// One HTTP/1.1 POST on loopback (the test's own client, so it needs no HTTP crate): the status
/// and body.
fn post(base: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let addr = base.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_owned())
}

/// A run submitted through the API; its id.
fn submit(base: &str, composition: &str, workspace: &Path) -> String {
    let body = serde_json::json!({"composition": composition, "workspace": {"path": workspace}});
    let (status, answer) = post(base, "/api/runs", &body.to_string());
    assert_eq!(status, 202, "{answer}");
    // The body may be chunked; the JSON object is the part between the braces.
    let json = &answer[answer.find('{').unwrap()..=answer.rfind('}').unwrap()];
    serde_json::from_str::<Value>(json).unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A page of another site open in the operator's browser sends the cross-site requests any page
/// may send (text/plain POSTs) to queue a run and cancel one: the store must not change.
fn foreign_page_changes_nothing(tools: &Tools, with_token: bool) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    // Every request waits: the first run stays running, the second queued behind it.
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer:\n      json: {modules: [late]}\n    delay_ms: 600000\n",
    );
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let quick = setup.dir.path().join("quick.yaml");
    std::fs::write(&quick, ONE_STEP).unwrap();
    let profile = setup.dir.path().join("chromium-profile");
    std::fs::create_dir_all(&profile).unwrap();
    let serve_log = setup.dir.path().join("serve.stderr");
    let mut extra = vec!["--jobs", "1"];
    if with_token {
        extra.extend(["--token-env", TOKEN_VAR]);
    }
    let serve = Serve::start(&setup, &extra, &serve_log);
    let first = submit(&serve.url, ONE_STEP, &setup.workspace());
    let victim = submit(&serve.url, ONE_STEP, &setup.workspace());

    let mut script = Command::new(&tools.node);
    script
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/foreign_page.mjs"))
        .env("DOCSFAB_SERVE_URL", &serve.url)
        .env("DOCSFAB_PLAYWRIGHT_DIR", &tools.playwright_dir)
        .env("DOCSFAB_CHROMIUM", &tools.chromium)
        .env("DOCSFAB_WORKSPACE", setup.workspace())
        .env("DOCSFAB_QUICK_COMPOSITION", &quick)
        .env("DOCSFAB_PROFILE", &profile)
        .env("DOCSFAB_VICTIM_RUN", &victim)
        .env_remove("DOCSFAB_TOKEN");
    if with_token {
        script.env("DOCSFAB_TOKEN", TOKEN);
    }
    let out = script.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "foreign_page.mjs failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();

    let runs = setup.list_json();
    let ids: Vec<&str> = runs.iter().filter_map(|r| r["runId"].as_str()).collect();
    assert_eq!(
        ids.len(),
        2,
        "a foreign page queued a run: {runs:?} (it saw {seen})"
    );
    assert!(ids.contains(&first.as_str()) && ids.contains(&victim.as_str()));
    assert_eq!(
        setup.show_json(&victim)["status"],
        "queued",
        "a foreign page cancelled a run (it saw {seen})"
    );
    assert!(
        seen["read"].as_str().unwrap().starts_with("blocked"),
        "a foreign page read the run list: {seen}"
    );
    drop(serve);
    seen
}

/// Without a token (loopback only), a foreign site's page can neither queue nor cancel runs.
#[test]
fn issue15_a_foreign_page_in_the_browser_cannot_queue_or_cancel_runs() {
    let Some(tools) = tools() else { return };
    foreign_page_changes_nothing(&tools, false);
}

/// With a token, the browser's `SameSite=Strict` cookie is not sent on another site's requests.
#[test]
fn issue15_a_foreign_page_cannot_use_the_signed_in_cookie() {
    let Some(tools) = tools() else { return };
    foreign_page_changes_nothing(&tools, true);
}

/// Three read-only steps; the last one's request carries the marker its simulator lane answers.
const THREE_STEPS: &str = "name: lineage\nlimits:\n  timeoutMs: 60000\n  maxTurns: 6\nsteps:\n  - id: survey\n    access: read-only\n    instructions: Survey the code.\n    contract:\n      schema: {type: object, required: [modules]}\n  - id: inventory\n    access: read-only\n    instructions: \"List the files of {{steps.survey.output}}.\"\n    contract:\n      schema: {type: object, required: [modules]}\n  - id: outline\n    access: read-only\n    instructions: \"Outline the modules of {{steps.survey.output}}.\"\n    contract:\n      schema: {type: object, required: [modules]}\n";

/// The first two steps answer; the outline's first request is refused for good (a terminal 400,
/// so the run fails there) and its next one, the resume's, answers.
const FAILS_THE_LAST_STEP: &str = "responses:\n  - answer: {json: {modules: [lib, count]}}\nlanes:\n  - contains: \"Outline the modules\"\n    responses:\n      - status: 400\n        body: '{\"error\": {\"message\": \"bad request\", \"type\": \"invalid_request_error\"}}'\n      - answer: {json: {modules: [outlined]}}\n";

/// The `entry` of every request in the simulator's log (which lane and answer took it).
fn sim_entries(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["entry"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The run's record once it shows `status` (read with `docsfab runs show`, as the page's server
/// writes it).
fn wait_for_status(setup: &Setup, id: &str, status: &str) -> Value {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let record = setup.show_json(id);
        if record["status"] == status {
            return record;
        }
        assert!(
            std::time::Instant::now() < end,
            "run {id} never reached {status}: {record}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Runs `tests/web/resume_page.mjs` against the server; what it reported.
fn drive_resume(tools: &Tools, serve: &Serve, setup: &Setup, failed: &str, log: &Path) -> Value {
    let profile = setup.dir.path().join("chromium-profile");
    std::fs::create_dir_all(&profile).unwrap();
    let out = Command::new(&tools.node)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/resume_page.mjs"))
        .env("DOCSFAB_SERVE_URL", &serve.url)
        .env("DOCSFAB_PLAYWRIGHT_DIR", &tools.playwright_dir)
        .env("DOCSFAB_CHROMIUM", &tools.chromium)
        .env("DOCSFAB_PROFILE", &profile)
        .env("DOCSFAB_FAILED_RUN", failed)
        .env("DOCSFAB_REUSED_STEPS", "survey,inventory")
        .env("DOCSFAB_REPORT_FILE", setup.dir.path().join("report.html"))
        .env(
            "DOCSFAB_SCREENSHOT",
            screenshot_path("serve-page-resume.png"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "resume_page.mjs failed:\n{}\n{stdout}\nserver stderr:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(log).unwrap_or_default()
    );
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap()
}

/// The store agrees with what the page and the report showed: the resume carried the two
/// finished steps over from the failed run, without attempts, and ran only the failed one.
fn assert_lineage_in_the_store(setup: &Setup, failed: &str, resumed: &str) {
    let record = setup.show_json(resumed);
    docsfab_runtime::record::validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["resumedFrom"]["runId"], failed, "{record}");
    let steps = record["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{record}");
    for (step, id) in steps.iter().zip(["survey", "inventory"]) {
        assert_eq!(step["stepId"], id);
        assert_eq!(step["status"], "succeeded");
        assert_eq!(step["reusedFrom"]["runId"], failed, "{step}");
        assert_eq!(step["reusedFrom"]["stepId"], id, "{step}");
        assert_eq!(step["attempts"].as_array().unwrap().len(), 0, "{step}");
    }
    assert!(steps[2]["reusedFrom"].is_null(), "{}", steps[2]);
    assert_eq!(steps[2]["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(steps[2]["output"]["modules"][0], "outlined");
}

/// Issue 34: the Resume button and the lineage, in Chromium. A run submitted through the API
/// fails at its last step (the simulator refuses that step's request with a terminal 400); the
/// page lists it as failed with a Resume button, a click queues a resume, which the page follows
/// to `succeeded`; its row names the run it resumed (a link to that run's report, which the
/// script follows) and offers Rerun but no Resume; its report (`GET /api/runs/{id}/report`, the
/// page `runs show --html` writes) says it resumed the failed run and reused its two finished
/// steps. axe-core finds no WCAG 2.1 A/AA violation on the page before and after, nor on the
/// report. The simulator's log proves the resume sent only the failed step's request.
#[test]
fn issue34_resume_button_queues_a_resume_whose_lineage_the_page_and_its_report_show_in_chromium() {
    let Some(tools) = tools() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let sim_log = tmp.path().join("requests.jsonl");
    let sim = Sim::start_logging(tmp.path(), FAILS_THE_LAST_STEP, &sim_log);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let serve_log = setup.dir.path().join("serve.stderr");
    let serve = Serve::start(&setup, &["--jobs", "1"], &serve_log);

    let failed = submit(&serve.url, THREE_STEPS, &setup.workspace());
    let record = wait_for_status(&setup, &failed, "failed");
    let statuses: Vec<&str> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["succeeded", "succeeded", "failed"], "{record}");
    assert_eq!(sim_entries(&sim_log).len(), 3);

    let seen = drive_resume(&tools, &serve, &setup, &failed, &serve_log);
    let resumed = seen["resumed"].as_str().unwrap().to_owned();
    assert_eq!(seen["lineage"], format!("resumed from {failed}"), "{seen}");
    assert_eq!(seen["steps"], "3", "{seen}");
    assert_eq!(seen["attempts"], "1", "only the failed step ran: {seen}");
    for state in [
        "axeRulesPassedFailed",
        "axeRulesPassedResumed",
        "axeRulesPassedReport",
    ] {
        assert!(seen[state].as_u64().unwrap() > 0, "{state}: {seen}");
    }
    assert_lineage_in_the_store(&setup, &failed, &resumed);
    // The resume asked the provider for the failed step only, and was answered by its lane.
    let sent = sim_entries(&sim_log);
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert_eq!(sent[3], "lanes[0] responses[1]", "{sent:?}");
    // The report the browser was served is the page `runs show --html -` writes.
    let cli = setup
        .docsfab()
        .args(["runs", "show", &resumed, "--html", "-"])
        .output()
        .unwrap();
    assert!(cli.status.success());
    let served = std::fs::read(setup.dir.path().join("report.html")).unwrap();
    assert!(
        served == cli.stdout,
        "the served report differs from runs show --html"
    );
    drop(serve);
}
