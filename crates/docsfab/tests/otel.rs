//! Issue 13, OpenTelemetry: real `docsfab` processes export to a real OTLP/HTTP receiver that
//! the test starts on loopback (axum), and the receiver decodes every body with the official
//! OpenTelemetry proto definitions (`opentelemetry-proto`'s prost types).
//!
//! The demo's run must arrive as one trace with the span tree run > steps > attempts > chat
//! turns > tool calls, the GenAI and retry attributes, its replays as span events, and the
//! metrics; a run with the hardening canary as its API key must leak no piece of it in any
//! exported byte; a collector that is not there costs one warning line and nothing else.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use support::run::{FAST_CATALOG, KEY_VAR, ONE_STEP, Setup, Sim, docsfab_at, looks_like_run_id};

/// A metric's data points: each one's attributes (as text) and value.
type Points = Vec<(HashMap<String, String>, f64)>;

/// What a receiver got: each body by path (`/v1/traces`, `/v1/metrics`), and the
/// `x-docsfab-team` header of each request.
#[derive(Default)]
struct Inbox {
    bodies: Mutex<Vec<(String, Vec<u8>)>>,
    team_headers: Mutex<Vec<Option<String>>>,
}

/// An OTLP/HTTP receiver on 127.0.0.1, on a runtime of its own; stops when dropped.
struct Receiver {
    _rt: tokio::runtime::Runtime,
    inbox: Arc<Inbox>,
    endpoint: String,
}

impl Receiver {
    fn start() -> Receiver {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let inbox: Arc<Inbox> = Arc::default();
        let store = |path: &'static str| {
            move |State(inbox): State<Arc<Inbox>>, headers: HeaderMap, body: Bytes| async move {
                let team = headers
                    .get("x-docsfab-team")
                    .map(|v| v.to_str().unwrap().to_owned());
                inbox.team_headers.lock().unwrap().push(team);
                inbox
                    .bodies
                    .lock()
                    .unwrap()
                    .push((path.to_owned(), body.to_vec()));
                // An empty Export*ServiceResponse: full success.
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        };
        let app = Router::new()
            .route("/v1/traces", post(store("/v1/traces")))
            .route("/v1/metrics", post(store("/v1/metrics")))
            .with_state(Arc::clone(&inbox));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        rt.spawn(async move { axum::serve(listener, app).await });
        Receiver {
            _rt: rt,
            inbox,
            endpoint,
        }
    }

    fn bodies(&self, path: &str) -> Vec<Vec<u8>> {
        self.inbox
            .bodies
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }

    fn spans(&self) -> Vec<Span> {
        self.bodies("/v1/traces")
            .iter()
            .flat_map(|b| {
                ExportTraceServiceRequest::decode(b.as_slice())
                    .unwrap()
                    .resource_spans
            })
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans)
            .collect()
    }

    /// Every data point of every exported metric, by metric name: each point's attributes and
    /// its value (a sum's value, a histogram's count).
    fn metrics(&self) -> HashMap<String, Points> {
        let mut out: HashMap<String, Points> = HashMap::new();
        for body in self.bodies("/v1/metrics") {
            let req = ExportMetricsServiceRequest::decode(body.as_slice()).unwrap();
            for m in req
                .resource_metrics
                .into_iter()
                .flat_map(|r| r.scope_metrics)
                .flat_map(|s| s.metrics)
            {
                let points: Vec<_> = match m.data {
                    Some(metric::Data::Sum(s)) => s
                        .data_points
                        .into_iter()
                        .map(|p| {
                            let v = match p.value {
                                Some(
                                    opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(i),
                                ) => i as f64,
                                Some(
                                    opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(d),
                                ) => d,
                                None => 0.0,
                            };
                            (attrs(&p.attributes), v)
                        })
                        .collect(),
                    Some(metric::Data::Histogram(h)) => h
                        .data_points
                        .into_iter()
                        .map(|p| (attrs(&p.attributes), p.count as f64))
                        .collect(),
                    _ => Vec::new(),
                };
                out.entry(m.name).or_default().extend(points);
            }
        }
        out
    }
}

/// Attributes as text (`"7"` for an integer).
fn attrs(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn attr(span: &Span, key: &str) -> Option<String> {
    attrs(&span.attributes).remove(key)
}

/// The span tree as indented lines (name, then its replay events), printed by the demo test.
fn tree(spans: &[Span], s: &Span, depth: usize, out: &mut String) {
    out.push_str(&format!("{}{}", "  ".repeat(depth), s.name));
    for e in &s.events {
        let a = attrs(&e.attributes);
        out.push_str(&format!(
            " [{} {} {} wait {} ms]",
            e.name,
            a["docsfab.replay.class"],
            a["http.response.status_code"],
            a["docsfab.replay.wait_ms"]
        ));
    }
    out.push('\n');
    for c in children(spans, s) {
        tree(spans, c, depth + 1, out);
    }
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    let mut c: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect();
    c.sort_by_key(|s| s.start_time_unix_nano);
    c
}

/// REP-1, STP-5, CLS-4: the demo's run as one trace: `invoke_agent quickstart` over its two
/// steps, the outline's three attempts with their budgets and retry decisions, `chat` client
/// spans with the GenAI attributes, the 408/408/503 and the 429 as replay events, the tool calls
/// as `execute_tool` spans, and the four metrics.
#[test]
fn issue13_the_demo_arrives_as_one_trace_with_the_span_tree_and_metrics() {
    let receiver = Receiver::start();
    let run_id = demo_exporting_to(&receiver);

    let traces = receiver.bodies("/v1/traces");
    let service = ExportTraceServiceRequest::decode(traces[0].as_slice()).unwrap();
    let resource = attrs(
        &service.resource_spans[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes,
    );
    assert_eq!(resource["service.name"], "docsfab");

    let spans = receiver.spans();
    let trace_ids: std::collections::HashSet<_> = spans.iter().map(|s| &s.trace_id).collect();
    assert_eq!(trace_ids.len(), 1, "one trace");
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1);
    let run = roots[0];
    assert_eq!(run.name, "invoke_agent quickstart");
    assert_eq!(attr(run, "gen_ai.operation.name").unwrap(), "invoke_agent");
    assert_eq!(attr(run, "gen_ai.agent.name").unwrap(), "quickstart");
    assert_eq!(attr(run, "docsfab.run.id").unwrap(), run_id);
    assert_eq!(attr(run, "docsfab.run.status").unwrap(), "succeeded");

    let mut shown = String::new();
    tree(&spans, run, 0, &mut shown);
    eprintln!("{shown}");

    let steps = children(&spans, run);
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["step outline", "step pages"]);
    let a1 = outline_attempts_with_their_budgets(&spans, steps[0]);

    let turns = children(&spans, a1);
    assert_eq!(turns.len(), 3);
    for t in &turns {
        assert_chat_span_within(t, a1);
    }
    assert_replay_events_and_tool_spans(&spans, &turns);
    assert_demo_metrics(&receiver.metrics(), &spans);
    assert_eq!(attr(run, "docsfab.run.reused_steps").unwrap(), "0");
}

/// Runs `docsfab demo` exporting to `receiver` (with no OpenTelemetry warning); its run id.
fn demo_exporting_to(receiver: &Receiver) -> String {
    let home = tempfile::tempdir().unwrap();
    let out = docsfab_at(home.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .arg("demo")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("OpenTelemetry"), "{stderr}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_owned()
}

/// The outline step's three attempts (initial, transport, contract) with their retry
/// decisions; the first attempt, whose stream was cut short.
fn outline_attempts_with_their_budgets<'a>(spans: &'a [Span], outline: &Span) -> &'a Span {
    let attempts = children(spans, outline);
    let budgets: Vec<String> = attempts
        .iter()
        .map(|a| attr(a, "docsfab.retry.budget").unwrap())
        .collect();
    assert_eq!(budgets, ["initial", "transport", "contract"]);
    let a1 = attempts[0];
    assert_eq!(attr(a1, "docsfab.retry.decision").unwrap(), "scheduled");
    assert_eq!(
        attr(a1, "docsfab.retry.rule").unwrap(),
        "class-stream-incomplete"
    );
    assert_eq!(attr(a1, "docsfab.retry.wait_ms").unwrap(), "500");
    assert_eq!(attr(a1, "error.type").unwrap(), "stream-incomplete");
    assert_eq!(
        attr(attempts[1], "docsfab.failure.code").unwrap(),
        "contract-prose"
    );
    assert_eq!(attr(attempts[2], "docsfab.retry.decision").unwrap(), "none");
    a1
}

/// A `chat` client span with the GenAI attributes, inside its attempt's time.
fn assert_chat_span_within(t: &Span, a1: &Span) {
    assert_eq!(t.name, "chat demo-model");
    assert_eq!(t.kind, SpanKind::Client as i32);
    let a = attrs(&t.attributes);
    assert_eq!(a["gen_ai.operation.name"], "chat");
    assert_eq!(a["gen_ai.provider.name"], "openai");
    assert_eq!(a["gen_ai.request.model"], "demo-model");
    assert_eq!(a["server.address"], "127.0.0.1");
    assert!(a["server.port"].parse::<u16>().unwrap() > 0);
    assert!(a.contains_key("gen_ai.usage.input_tokens"));
    assert!(a.contains_key("gen_ai.usage.output_tokens"));
    assert!(t.start_time_unix_nano <= t.end_time_unix_nano);
    assert!(a1.start_time_unix_nano <= t.start_time_unix_nano);
    assert!(t.end_time_unix_nano <= a1.end_time_unix_nano);
}

/// The first attempt's turns: the 408/408/503 and the 429 as replay events, the cut stream's
/// class, and the tool calls as `execute_tool` spans (no attribute of the write names its path).
fn assert_replay_events_and_tool_spans(spans: &[Span], turns: &[&Span]) {
    // Turn 1: two 408s and a 503 replayed; turn 2: a 429 whose Retry-After was honoured.
    let replays = |t: &Span| -> Vec<(String, String)> {
        t.events
            .iter()
            .map(|e| {
                assert_eq!(e.name, "docsfab.replay");
                let a = attrs(&e.attributes);
                (
                    a["docsfab.replay.class"].clone(),
                    a["http.response.status_code"].clone(),
                )
            })
            .collect()
    };
    let pair = |c: &str, s: &str| (c.to_owned(), s.to_owned());
    assert_eq!(
        replays(turns[0]),
        [
            pair("timeout", "408"),
            pair("timeout", "408"),
            pair("server", "503")
        ]
    );
    assert_eq!(replays(turns[1]), [pair("rate-limit", "429")]);
    assert_eq!(
        attrs(&turns[1].events[0].attributes)["docsfab.replay.retry_after_ms"],
        "1000"
    );
    // The stream cut short: the turn failed with the attempt's class.
    assert_eq!(attr(turns[2], "error.type").unwrap(), "stream-incomplete");

    let tools = children(spans, turns[0]);
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "execute_tool list_files");
    assert_eq!(
        attr(tools[0], "gen_ai.operation.name").unwrap(),
        "execute_tool"
    );
    assert_eq!(attr(tools[0], "gen_ai.tool.name").unwrap(), "list_files");
    assert!(!attr(tools[0], "gen_ai.tool.call.id").unwrap().is_empty());
    assert_eq!(children(spans, turns[1])[0].name, "execute_tool read_file");
    let write = spans
        .iter()
        .find(|s| s.name == "execute_tool write_file")
        .expect("the pages step's write_file call");
    assert!(
        attrs(&write.attributes)
            .values()
            .all(|v| !v.contains("docs/"))
    );
}

/// The four metrics: chat durations, token usage, replays by class and step retries by rule, and
/// every step counted, none of them reused (issue 34).
fn assert_demo_metrics(metrics: &HashMap<String, Points>, spans: &[Span]) {
    let total = |name: &str| -> f64 { metrics[name].iter().map(|(_, v)| v).sum() };
    let chat_turns = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .count();
    assert_eq!(total("gen_ai.client.operation.duration"), chat_turns as f64);
    let token_types: std::collections::HashSet<String> = metrics["gen_ai.client.token.usage"]
        .iter()
        .map(|(a, _)| a["gen_ai.token.type"].clone())
        .collect();
    assert_eq!(
        token_types,
        ["input".to_owned(), "output".to_owned()].into()
    );
    assert_eq!(total("docsfab.replays"), 4.0);
    let by_class: HashMap<String, f64> = metrics["docsfab.replays"]
        .iter()
        .map(|(a, v)| (a["docsfab.replay.class"].clone(), *v))
        .collect();
    assert_eq!(by_class["timeout"], 2.0);
    let retries = &metrics["docsfab.step_retries"];
    assert_eq!(total("docsfab.step_retries"), 2.0);
    assert!(
        retries.iter().any(
            |(a, _)| a["docsfab.retry.rule"] == "class-stream-incomplete"
                && a["error.type"] == "stream-incomplete"
        ),
        "{retries:?}"
    );
    // Issue 34: every step is counted, none of them reused.
    assert_eq!(total("docsfab.steps"), 2.0);
    assert!(
        metrics["docsfab.steps"]
            .iter()
            .all(|(a, _)| a["docsfab.step.reused"] == "false")
    );
}

/// Issue 34: a `run --reuse` that carries its one step over says so on its run and step spans
/// and in the `docsfab.steps` counter, so a backend can read the reuse rate.
#[test]
fn issue34_a_reused_step_is_counted_on_the_spans_and_in_the_steps_metric() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        "responses:\n  - answer: {json: {modules: [lib]}}\n",
    );
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let composition = setup.composition(ONE_STEP);
    let first = setup.run_command(&composition).output().unwrap();
    assert_eq!(first.status.code(), Some(0));
    let out = setup
        .run_command(&composition)
        .arg("--reuse")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("OpenTelemetry"), "{stderr}");
    let spans = receiver.spans();
    let run = spans
        .iter()
        .find(|s| s.parent_span_id.is_empty())
        .expect("a run span");
    assert_eq!(attr(run, "docsfab.run.steps").unwrap(), "1");
    assert_eq!(attr(run, "docsfab.run.reused_steps").unwrap(), "1");
    let steps = children(&spans, run);
    assert_eq!(steps.len(), 1);
    assert_eq!(attr(steps[0], "docsfab.step.reused").unwrap(), "true");
    assert!(children(&spans, steps[0]).is_empty(), "no attempt span");
    let metrics = receiver.metrics();
    let points = &metrics["docsfab.steps"];
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0].0["docsfab.step.reused"], "true");
    assert_eq!(points[0].0["docsfab.step.status"], "succeeded");
    assert_eq!(points[0].1, 1.0);
}

/// The long canary of the hardening tests (160 letters and digits, no key shape).
fn long_canary() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..160)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// Where `hay` holds a 16-character piece of `key`.
fn key_piece_in(hay: &[u8], key: &str) -> Option<usize> {
    (0..=key.len() - 16).find_map(|i| {
        let piece = &key.as_bytes()[i..i + 16];
        hay.windows(16).position(|w| w == piece)
    })
}

/// Runs `scenario` against `docsfab sim serve` with `key` as the API key and OTLP export to
/// `endpoint`; the exit code and the output.
fn run_exporting(key: &str, scenario: &str, endpoint: &str) -> std::process::Output {
    run_exporting_with(key, scenario, endpoint, &[])
}

fn run_exporting_with(
    key: &str,
    scenario: &str,
    endpoint: &str,
    vars: &[(&str, &str)],
) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), scenario);
    let setup = Setup::new(
        &sim.base_url,
        &format!("{FAST_CATALOG}  retry.maxTransportRetries: 1\n"),
    );
    let composition = setup.composition(ONE_STEP);
    setup
        .run_command(&composition)
        .env(KEY_VAR, key)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .envs(vars.iter().copied())
        .output()
        .unwrap()
}

/// Issue 9's canary, now for telemetry: the key in a replayed 503's error body, in a tool call's
/// id (a turn the boundary refuses) and in a terminal 400's error object reaches no exported
/// byte, traces or metrics. The same runs show `OTEL_SERVICE_NAME` and
/// `OTEL_EXPORTER_OTLP_HEADERS` honoured.
#[test]
fn issue13_the_canary_key_appears_in_no_exported_byte() {
    let key = long_canary();
    let part = &key[20..60];
    let body = format!(
        r#"{{"error":{{"message":"bad key {key}","type":"{key}","code":"{key}","param":"{key}"}}}}"#
    );
    let receiver = Receiver::start();
    let replayed = format!(
        "responses:\n  - status: 503\n    body: '{body}'\n  - answer:\n      tool_calls: [{{name: list_files, arguments: {{path: src}}}}]\n  - answer: {{json: {{modules: [lib]}}}}\n"
    );
    // The response boundary refuses this turn (a credential in a call id) before any tool runs.
    let tool_id = format!(
        "responses:\n  - answer:\n      tool_calls: [{{id: 'call-{part}', name: list_files, arguments: {{path: src}}}}]\n"
    );
    let terminal = format!("responses:\n  - status: 400\n    body: '{body}'\n");
    let mut codes = Vec::new();
    for scenario in [replayed, tool_id, terminal] {
        let out = run_exporting_with(
            &key,
            &scenario,
            &receiver.endpoint,
            &[
                ("OTEL_SERVICE_NAME", "docs-ci"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-docsfab-team=docs"),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            looks_like_run_id(stdout.lines().next().unwrap_or("")),
            "{stdout}"
        );
        codes.push(out.status.code());
    }
    assert_eq!(codes, [Some(0), Some(1), Some(1)]);
    // The standard variables are honoured: the service name and the extra header.
    let teams = receiver.inbox.team_headers.lock().unwrap().clone();
    assert!(
        teams.iter().all(|t| t.as_deref() == Some("docs")),
        "{teams:?}"
    );
    let first =
        ExportTraceServiceRequest::decode(receiver.bodies("/v1/traces")[0].as_slice()).unwrap();
    let resource = attrs(
        &first.resource_spans[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes,
    );
    assert_eq!(resource["service.name"], "docs-ci");
    let received = receiver.inbox.bodies.lock().unwrap();
    let traces = received.iter().filter(|(p, _)| p == "/v1/traces").count();
    let metrics = received.iter().filter(|(p, _)| p == "/v1/metrics").count();
    assert!(
        traces >= 3 && metrics >= 3,
        "{traces} trace and {metrics} metric exports"
    );
    for (path, bytes) in received.iter() {
        assert_eq!(
            key_piece_in(bytes, &key),
            None,
            "a piece of the key in {path}"
        );
    }
}

/// A collector that is not there (a closed port): the run ends as it would without telemetry
/// (exit code, summary, record) and stderr gets exactly one warning line about the export.
#[test]
fn issue13_an_unreachable_collector_costs_one_warning_line_and_nothing_else() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let scenario = "responses:\n  - status: 503\n  - answer:\n      json: {modules: [lib]}\n";
    let out = run_exporting("sk-otel-test", scenario, &endpoint);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let id = stdout.lines().next().unwrap();
    assert!(stdout.contains(&format!("Run {id} succeeded")), "{stdout}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("OpenTelemetry"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert_eq!(
        warnings[0],
        format!(
            "warning: OpenTelemetry export to {endpoint} (OTEL_EXPORTER_OTLP_ENDPOINT) failed: traces: network error; metrics: not delivered; the run and its record are not affected."
        )
    );
}

/// A protocol docsfab does not speak is bad input, refused before the run: exit 2, one sentence,
/// nothing recorded; `doctor --composition` refuses a bad endpoint the same way.
#[test]
fn issue13_an_unsupported_otlp_protocol_is_refused_before_the_run() {
    let setup = Setup::new("http://127.0.0.1:9/v1", "");
    let composition = setup.composition(ONE_STEP);
    let out = setup
        .run_command(&composition)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL is \"grpc\", but docsfab exports OpenTelemetry only as http/protobuf"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    assert!(!setup.store().exists(), "nothing recorded");
    // doctor --composition runs the same startup checks.
    let doctor = setup
        .docsfab()
        .args(["doctor", "--composition"])
        .arg(&composition)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&doctor.stderr);
    assert_eq!(doctor.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_ENDPOINT is \"localhost:4318\", which is not an http:// or https:// URL"),
        "{stderr}"
    );
}

/// Issue 15: runs of `docsfab serve` are exported like `docsfab run`'s, one trace per run, each
/// root span naming its run, after the run's record is committed; the server keeps serving.
#[test]
fn issue15_each_served_run_is_exported_as_its_own_trace() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        "responses:\n  - status: 503\n  - answer:\n      json: {modules: [lib]}\nfallback: repeat-last\n",
    );
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut serve = setup
        .docsfab()
        .args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
        .arg(setup.dir.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let base = support::run::listening_on(&mut serve);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::blocking::Client::new();
    let ws = setup.workspace();
    let ws = ws.strip_prefix(setup.dir.path()).unwrap();
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let body = serde_json::json!({"composition": ONE_STEP, "workspace": {"path": ws}});
            let r: serde_json::Value = http
                .post(format!("{base}/api/runs"))
                .json(&body)
                .send()
                .unwrap()
                .json()
                .unwrap();
            r["runId"].as_str().unwrap().to_owned()
        })
        .collect();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let roots = loop {
        let spans = receiver.spans();
        let roots: Vec<String> = spans
            .iter()
            .filter(|s| s.parent_span_id.is_empty())
            .filter_map(|s| attr(s, "docsfab.run.id"))
            .collect();
        if roots.len() >= 2 || std::time::Instant::now() > until {
            break roots;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let _ = serve.kill();
    let _ = serve.wait();
    let mut roots = roots;
    roots.sort();
    let mut ids = ids;
    ids.sort();
    assert_eq!(roots, ids, "one root span per served run");
    // The replayed 503 of each run is on its trace, as for `docsfab run`.
    let spans = receiver.spans();
    let replays = spans
        .iter()
        .flat_map(|s| &s.events)
        .filter(|e| {
            attrs(&e.attributes)
                .get("http.response.status_code")
                .map(String::as_str)
                == Some("503")
        })
        .count();
    assert!(replays >= 1, "no replay event exported");
}
