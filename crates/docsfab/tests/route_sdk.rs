//! The composition route in front of real SDK clients: the openai and anthropic Python SDKs
//! (pinned in compat/requirements.txt, installed by compat/install.sh) stream through
//! `docsfab route serve`, which forwards to `docsfab sim serve`. A normal answer is delivered
//! event by event and ends cleanly; a stream with a chunk from another model never reaches the
//! SDK: it raises on the route's error response, which names the refusal (BND-1, BND-4).
//!
//! Both servers run as the `docsfab` binary cargo built for this test; the SDK clients come from
//! docsfab-compat's installer (into target/compat when missing).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use docsfab_compat::{compat_dir, install_clients, repo_root};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

const MODEL: &str = "sel-model";
const KEY_VAR: &str = "ROUTE_SDK_TEST_KEY";
const KEY: &str = "routekey-sdk-3c9d1e7f5a";
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Spawns a docsfab server command and returns it with the `ADDR` of its
/// `listening on http://ADDR/v1` line.
async fn spawn_server(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start docsfab");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .await
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .and_then(|a| a.strip_suffix("/v1"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, addr)
}

struct Stack {
    _dir: tempfile::TempDir,
    _sim: Child,
    _route: Child,
    route_addr: String,
}

/// Simulator (answer, then an answer with a chunk from another model) and a route for `api`.
async fn stack(bin: &Path, api: &str) -> Stack {
    let dir = tempfile::Builder::new()
        .prefix(&format!("docsfab-route-sdk-{api}-"))
        .tempdir()
        .unwrap();
    let scenario = dir.path().join("scenario.yaml");
    std::fs::write(
        &scenario,
        "responses:\n  - answer: {text: \"Three modules: core, cli, docs.\"}\n  - answer: {text: \"hidden text\", foreign_model: other-model}\n",
    )
    .unwrap();
    let (sim, sim_addr) = spawn_server(
        Command::new(bin)
            .args(["sim", "serve", "--listen", "127.0.0.1:0", "--scenario"])
            .arg(&scenario),
    )
    .await;
    std::fs::write(
        dir.path().join("host.yaml"),
        format!("providers:\n  default:\n    api: {api}\n    baseUrl: http://{sim_addr}/v1\n    apiKeyEnv: {KEY_VAR}\n    model: {MODEL}\n"),
    )
    .unwrap();
    let composition = dir.path().join("composition.yaml");
    std::fs::write(
        &composition,
        "name: route-sdk\nprovider: default\nlimits:\n  timeoutMs: 60000\n  maxTurns: 4\n  maxOutputTokens: 256\n  sourceReadBytes: 65536\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Survey the code.\n    tools: [list_files]\n    contract:\n      schema:\n        type: object\n",
    )
    .unwrap();
    let (route, route_addr) = spawn_server(
        Command::new(bin)
            .args(["route", "serve", "--listen", "127.0.0.1:0", "--composition"])
            .arg(&composition)
            .env("DOCSFAB_HOME", dir.path())
            .env(KEY_VAR, KEY),
    )
    .await;
    Stack {
        _dir: dir,
        _sim: sim,
        _route: route,
        route_addr,
    }
}

/// Runs compat/py_client.py over `requests` (one JSON object a line) and returns its lines.
async fn py_client(root: &Path, requests: &str) -> Vec<Value> {
    let mut cmd = Command::new(compat_dir(root).join("venv/bin/python"));
    cmd.args(["-W", "ignore"])
        .arg(root.join("compat/py_client.py"))
        .arg("--batch");
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("start the Python client");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(requests.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .expect("the Python client did not finish")
        .unwrap();
    assert!(
        out.status.success(),
        "py_client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn lines_of<'a>(lines: &'a [Value], case: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["case"] == case).collect()
}

/// The text an event delivers: an OpenAI chunk's content delta or an Anthropic text delta.
fn delta_text(event: &Value) -> String {
    let openai = event["choices"][0]["delta"]["content"].as_str();
    let anthropic = event["delta"]["text"].as_str();
    openai.or(anthropic).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn real_sdks_stream_through_the_route_and_get_a_clear_refusal_bnd_1_bnd_4() {
    let root = repo_root();
    install_clients(&root);
    let bin = Path::new(env!("CARGO_BIN_EXE_docsfab"));
    for api in ["openai-chat", "anthropic-messages"] {
        let s = stack(bin, api).await;
        // The openai SDK appends /chat/completions to its base URL; the anthropic SDK /v1/messages.
        let base_url = match api {
            "openai-chat" => format!("http://{}/v1", s.route_addr),
            _ => format!("http://{}", s.route_addr),
        };
        let requests: String = ["answer", "foreign"]
            .iter()
            .map(|case| {
                format!(
                    "{}\n",
                    serde_json::json!({"case": case, "api": api, "base_url": base_url, "model": "client-model"})
                )
            })
            .collect();
        let lines = py_client(&root, &requests).await;

        let answer = lines_of(&lines, "answer");
        let last = answer.last().expect("output for the answer");
        assert_eq!(last["kind"], "end", "{api}: {answer:?}");
        let events: Vec<&Value> = answer
            .iter()
            .filter(|l| l["kind"] == "event")
            .map(|l| &l["event"])
            .collect();
        let text: String = events.iter().map(|e| delta_text(e)).collect();
        assert_eq!(text, "Three modules: core, cli, docs.", "{api}: {answer:?}");
        // The SDK saw the selected model, whatever it asked for.
        let model = events
            .iter()
            .find_map(|e| e["model"].as_str().or(e["message"]["model"].as_str()))
            .unwrap();
        assert_eq!(model, MODEL);

        let foreign = lines_of(&lines, "foreign");
        assert!(
            foreign.iter().all(|l| l["kind"] != "event"),
            "{api}: the SDK got part of a refused stream: {foreign:?}"
        );
        let error = foreign.last().expect("output for the foreign case");
        assert_eq!(error["kind"], "error", "{api}: {foreign:?}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("502"), "{api}: {message}");
        assert!(message.contains("model-mismatch"), "{api}: {message}");
        assert!(!message.contains("hidden text"), "{api}: {message}");
        assert!(!message.contains(KEY));
    }
}
