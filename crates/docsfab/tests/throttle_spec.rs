//! Issue 20: the shared throttle obeys the retry spec, end to end. Real `docsfab sim serve` and
//! real `docsfab run` processes, on both APIs, with `throttle: shared`, each case once for a
//! single step and once for a fan-out step whose instances send at once (each instance has its
//! own lane script in the simulator, so its requests are told apart).
//!
//! Every case also checks the gap rule of docs/throttle.md ("The rule it keeps"): the gap on the
//! wire between a failed request and its replay is the replay's `waitMs + heldMs`, and between
//! two attempts it is the attempt's `waitMs` plus the next attempt's first hold. Times come from
//! the simulator's request log (`time_unix_ms`: when it had read the request); the only
//! wall-clock claims are these gaps and the spec's own ceilings.

mod support;

use std::collections::HashSet;
use std::path::Path;

use docsfab_sim::CAPACITY_ENTRY;
use serde_json::Value;
use support::run::{Setup, Sim};

const APIS: [&str; 2] = ["openai-chat", "anthropic-messages"];

/// How far a measured gap may be from the record's account of it: the time a request takes
/// from the end of its wait to the simulator having read it (a throttle transaction, a connect
/// and a write on loopback, a thread waking on a loaded machine). Measured on the project's
/// shared 2-core machine with other builds running: within a turn +4 to +37 ms (median +10),
/// between attempts +4 to +38 ms (median +10). The step wait once started only after the
/// attempt's durable commit, which put up to +53 ms between attempts; it now counts from the
/// attempt's end (docsfab-runtime executor).
const TOLERANCE_MS: i64 = 50;

/// The scripted delay before the first response of every lane: long enough that all the
/// instances of a fan-out have sent their first request before any of them hears back, so
/// they really send at once (checked by [`assert_sent_at_once`]). The gap rule adds it back.
const FIRST_DELAY_MS: u64 = 150;

/// A generous capacity (nothing is refused) whose rate-limit headers tell the throttle the
/// provider's limits from the first answer on, so it does not probe one request at a time and
/// the instances go together.
const WIDE_CAPACITY: &str = "capacity:\n  requestsPerMinute: 6000\n";

/// One request as the simulator logged it.
#[derive(Debug, Clone)]
struct Req {
    index: u64,
    time: u64,
    sha: String,
    entry: String,
}

fn read_log(path: &Path) -> Vec<Req> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| Req {
            index: v["index"].as_u64().unwrap(),
            time: v["time_unix_ms"].as_u64().unwrap(),
            sha: v["sha256"].as_str().unwrap().to_owned(),
            entry: v["entry"].as_str().unwrap().to_owned(),
        })
        .collect()
}

/// The lane a log entry names: `lanes[2] responses[0]` is lane 2.
fn lane_of(entry: &str) -> Option<usize> {
    let rest = entry.strip_prefix("lanes[")?;
    rest[..rest.find(']')?].parse().ok()
}

/// Every request of lane `lane`, in log order: those its script answered, and the capacity
/// refusals of the same bytes (a refusal is logged before any script sees it, so it names no
/// lane; a turn's requests are byte-identical, REP-12).
fn lane_requests(log: &[Req], lane: usize) -> Vec<&Req> {
    let shas: HashSet<&str> = log
        .iter()
        .filter(|r| lane_of(&r.entry) == Some(lane))
        .map(|r| r.sha.as_str())
        .collect();
    log.iter()
        .filter(|r| {
            lane_of(&r.entry) == Some(lane)
                || (r.entry == CAPACITY_ENTRY && shas.contains(r.sha.as_str()))
        })
        .collect()
}

/// A lane's script: each entry as YAML (one line after `- `) and the delay before its response.
#[derive(Clone)]
struct Script(Vec<(String, u64)>);

impl Script {
    /// The scripted delay before the response to a request the log labels `entry`.
    fn delay_of(&self, entry: &str) -> u64 {
        if entry == CAPACITY_ENTRY {
            return 0;
        }
        let Some(i) = entry
            .split("responses[")
            .nth(1)
            .and_then(|r| r[..r.find(']')?].parse::<usize>().ok())
        else {
            return 0;
        };
        self.0.get(i).map_or(0, |(_, d)| *d)
    }
}

/// A lane script: `status 429, Retry-After S` for each of `retry_after_s`, then a JSON answer;
/// the first entry answers after [`FIRST_DELAY_MS`], the rest at once.
fn throttled_then_answer(retry_after_s: &[u64], name: &str) -> Script {
    let mut entries: Vec<(String, u64)> = retry_after_s
        .iter()
        .map(|s| {
            (
                format!("status: 429\n        headers: {{retry-after: {s}}}"),
                0,
            )
        })
        .collect();
    entries.push((format!("answer: {{json: {{page: {name}}}}}"), 0));
    entries[0].1 = FIRST_DELAY_MS;
    Script(entries)
}

fn lane_yaml(marker: &str, script: &Script) -> String {
    let mut s = format!("  - contains: \"{marker}\"\n    responses:\n");
    for (entry, delay) in &script.0 {
        s.push_str(&format!("      - {entry}\n"));
        if *delay > 0 {
            s.push_str(&format!("        delay_ms: {delay}\n"));
        }
    }
    s
}

/// The lane marker of an instance named `name`.
fn marker(name: &str) -> String {
    format!("[lane-{name}]")
}

const OUTLINE_MARKER: &str = "[outline]";

/// The shape a case runs in.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// One step.
    Single,
    /// An outline step, then a fan-out step of this many instances at this concurrency.
    FanOut(usize),
}

impl Shape {
    fn names(self) -> Vec<String> {
        match self {
            Shape::Single => vec!["solo".to_owned()],
            Shape::FanOut(n) => (0..n).map(|i| format!("i{i}")).collect(),
        }
    }
}

/// The composition for `shape`: read-only steps, no tools, `timeoutMs` as given.
fn composition(shape: Shape, timeout_ms: u64) -> String {
    let head = format!("name: spec\nlimits:\n  timeoutMs: {timeout_ms}\nsteps:\n");
    match shape {
        Shape::Single => format!(
            "{head}  - id: ask\n    access: read-only\n    instructions: \"Answer for {}.\"\n",
            marker("solo")
        ),
        Shape::FanOut(n) => format!(
            "{head}  - id: outline\n    access: read-only\n    instructions: \"List the modules {OUTLINE_MARKER}.\"\n    contract:\n      schema: {{type: object, required: [modules]}}\n  - id: pages\n    access: read-only\n    forEach: steps.outline.output.modules\n    concurrency: {n}\n    instructions: \"Answer for [lane-{{{{item.name}}}}].\"\n"
        ),
    }
}

/// The scenario: `head` (a capacity), then a lane per instance with `script` (and, for a
/// fan-out, a first lane answering the outline with the instance names after `outline_delay_ms`).
fn scenario(
    head: &str,
    shape: Shape,
    outline_delay_ms: u64,
    script: &dyn Fn(&str) -> Script,
) -> (String, Vec<Lane>) {
    let mut lanes = Vec::new();
    let mut text = format!("{head}responses:\n  - answer: {{text: unused}}\nlanes:\n");
    if let Shape::FanOut(_) = shape {
        let modules: Vec<String> = shape
            .names()
            .iter()
            .map(|n| format!("{{name: {n}}}"))
            .collect();
        let outline = Script(vec![(
            format!("answer: {{json: {{modules: [{}]}}}}", modules.join(", ")),
            outline_delay_ms,
        )]);
        text.push_str(&lane_yaml(OUTLINE_MARKER, &outline));
        lanes.push(Lane {
            step_id: "outline".to_owned(),
            script: outline,
        });
    }
    for (i, name) in shape.names().iter().enumerate() {
        let s = script(name);
        text.push_str(&lane_yaml(&marker(name), &s));
        lanes.push(Lane {
            step_id: match shape {
                Shape::Single => "ask".to_owned(),
                Shape::FanOut(_) => format!("pages[{i}]"),
            },
            script: s,
        });
    }
    (text, lanes)
}

/// A lane of the scenario and the step (or instance) whose requests it answers.
struct Lane {
    step_id: String,
    script: Script,
}

/// What one case run left behind.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    record: Value,
    log: Vec<Req>,
    lanes: Vec<Lane>,
}

impl Outcome {
    fn context(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}\n--- log\n{:#?}\n--- record\n{}",
            self.code,
            self.stdout,
            self.stderr,
            self.log,
            serde_json::to_string_pretty(&self.record).unwrap()
        )
    }

    fn step(&self, id: &str) -> &Value {
        self.record["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stepId"] == id)
            .unwrap_or_else(|| panic!("no step {id} in the record\n{}", self.context()))
    }

    /// The instances (or the single step) with their lane's requests.
    fn work(&self) -> Vec<(&Lane, &Value, Vec<&Req>)> {
        self.lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| l.step_id != "outline")
            .map(|(i, l)| (l, self.step(&l.step_id), lane_requests(&self.log, i)))
            .collect()
    }
}

/// A case: the scenario's head (a capacity) and lane scripts, host.yaml's catalog lines and
/// the composition's `timeoutMs`.
struct Case<'a> {
    head: &'a str,
    outline_delay_ms: u64,
    script: &'a dyn Fn(&str) -> Script,
    catalog: &'a str,
    timeout_ms: u64,
}

/// Runs `case` in `shape` on `api`.
fn run_case(api: &str, shape: Shape, case: &Case<'_>) -> Outcome {
    let tmp = tempfile::tempdir().unwrap();
    let log_path = tmp.path().join("requests.jsonl");
    let (text, lanes) = scenario(case.head, shape, case.outline_delay_ms, case.script);
    let sim = Sim::start_logging(tmp.path(), &text, &log_path);
    let s = Setup::with_api(
        api,
        &sim.base_url,
        &format!("    throttle: shared\ncatalog:\n{}", case.catalog),
    );
    let comp = s.composition(&composition(shape, case.timeout_ms));
    let out = s.run_command(&comp).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let id = stdout.lines().next().unwrap_or_default().to_owned();
    let record = if id.starts_with("run-") {
        s.show_json(&id)
    } else {
        Value::Null
    };
    drop(sim);
    Outcome {
        code: out.status.code(),
        stdout,
        stderr,
        record,
        log: read_log(&log_path),
        lanes,
    }
}

/// One gap on the wire and the record's account of it.
#[derive(Debug)]
struct Gap {
    /// Log indexes of the two requests.
    from: u64,
    to: u64,
    /// `replay` (inside a turn) or `attempt` (between two attempts).
    kind: &'static str,
    measured_ms: i64,
    /// waitMs + heldMs (+ the scripted delay of the earlier request's response).
    expected_ms: i64,
    /// For a gap between attempts, where its time went by the record's clock: from the earlier
    /// request's arrival to the end of its attempt, from there to the next attempt's start, and
    /// from that start to the next request's arrival.
    split_ms: Option<(i64, i64, i64)>,
}

impl Gap {
    fn off_by(&self) -> i64 {
        self.measured_ms - self.expected_ms
    }
}

/// How many requests a recorded turn sent: `1 + providerRetries` for a completed turn; a failed
/// one says it in its reason (`... after 2 requests`; no count when nothing was sent).
fn requests_of_turn(turn: &Value) -> usize {
    let replays = turn["replays"].as_array().unwrap().len();
    match turn["reason"].as_str() {
        None => replays + 1,
        Some(reason) => match reason.rsplit_once(" after ") {
            Some((_, n)) => n.split(' ').next().unwrap().parse().unwrap(),
            None => 0,
        },
    }
}

fn ms(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// Milliseconds since the Unix epoch of a record time (`2026-12-02T04:46:46.285Z`).
fn unix_ms(rfc3339: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| rfc3339[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant), for dates after 1970.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    secs * 1000 + n(20..23)
}

/// The gap rule for one step: walks its recorded attempts, turns and replays over its requests
/// (in log order), checks that each turn's requests are byte-identical and that every request
/// is accounted for, and returns every gap the rule speaks of.
fn gaps(step: &Value, reqs: &[&Req], script: &Script) -> Vec<Gap> {
    let mut out = Vec::new();
    let mut next = 0usize;
    // The last request sent, the wait recorded after the attempt that sent it, and when that
    // attempt ended.
    let mut before: Option<(&Req, i64, i64)> = None;
    for attempt in step["attempts"].as_array().unwrap() {
        let started = unix_ms(attempt["startedAt"].as_str().unwrap());
        for (t, turn) in attempt["turns"].as_array().unwrap().iter().enumerate() {
            let n = requests_of_turn(turn);
            let sent = &reqs[next..next + n];
            next += n;
            assert!(
                sent.iter().all(|r| r.sha == sent[0].sha),
                "a turn's requests differ: {sent:?}"
            );
            let replays = turn["replays"].as_array().unwrap();
            if t == 0
                && let (Some((prev, wait, ended)), Some(first)) = (before, sent.first())
            {
                let replays_held: i64 = replays.iter().map(|r| ms(&r["heldMs"])).sum();
                let first_hold = ms(&turn["heldMs"]) - replays_held;
                out.push(Gap {
                    from: prev.index,
                    to: first.index,
                    kind: "attempt",
                    // Between attempts the gap runs from the failed attempt's recorded end
                    // (its last response and the bookkeeping after it are the attempt's own
                    // time, in its durationMs) to the next attempt's first request.
                    measured_ms: first.time as i64 - ended,
                    expected_ms: wait + first_hold,
                    split_ms: Some((
                        ended - prev.time as i64,
                        started - ended,
                        first.time as i64 - started,
                    )),
                });
            }
            for (j, pair) in sent.windows(2).enumerate() {
                let r = &replays[j];
                out.push(Gap {
                    from: pair[0].index,
                    to: pair[1].index,
                    kind: "replay",
                    measured_ms: pair[1].time as i64 - pair[0].time as i64,
                    expected_ms: ms(&r["waitMs"])
                        + ms(&r["heldMs"])
                        + script.delay_of(&pair[0].entry) as i64,
                    split_ms: None,
                });
            }
            if let Some(last) = sent.last() {
                let ended = started + ms(&attempt["durationMs"]);
                before = Some((last, ms(&attempt["waitMs"]), ended));
            }
        }
    }
    assert_eq!(
        next,
        reqs.len(),
        "the record accounts for {next} requests of {}, the log has {}: {reqs:?}",
        step["stepId"],
        reqs.len()
    );
    out
}

/// Checks the gap rule on every instance of `o`, printing each gap (`--nocapture`).
fn assert_gap_rule(o: &Outcome, label: &str) {
    for (lane, step, reqs) in o.work() {
        let g = gaps(step, &reqs, &lane.script);
        let summary: Vec<String> = g
            .iter()
            .map(|g| {
                let split = g.split_ms.map_or(String::new(), |(a, b, c)| {
                    format!(" [to attempt end {a}, to next start {b}, to arrival {c}]")
                });
                format!(
                    "{} #{}->#{} {} ms (record {} ms, {:+}){split}",
                    g.kind,
                    g.from,
                    g.to,
                    g.measured_ms,
                    g.expected_ms,
                    g.off_by()
                )
            })
            .collect();
        eprintln!("{label} {}: {}", lane.step_id, summary.join("; "));
        let bad: Vec<&Gap> = g
            .iter()
            .filter(|g| g.off_by().abs() > TOLERANCE_MS)
            .collect();
        assert!(
            bad.is_empty(),
            "{label} {}: gaps on the wire that are not waitMs + heldMs (within {TOLERANCE_MS} ms): {bad:#?}\n{}",
            lane.step_id,
            o.context()
        );
    }
}

/// A fan-out's instances sent their first requests together: each was read before any first
/// response could have reached its client (the first entry answers after [`FIRST_DELAY_MS`]).
fn assert_sent_at_once(o: &Outcome, shape: Shape) {
    let Shape::FanOut(n) = shape else { return };
    let firsts: Vec<u64> = o.work().iter().map(|(_, _, reqs)| reqs[0].time).collect();
    assert_eq!(firsts.len(), n);
    let (lo, hi) = (firsts.iter().min().unwrap(), firsts.iter().max().unwrap());
    assert!(
        hi - lo < FIRST_DELAY_MS,
        "the instances did not send at once (first requests read at {firsts:?}), so the case does not test what it says\n{}",
        o.context()
    );
}

fn assert_succeeded(o: &Outcome) {
    assert_eq!(o.code, Some(0), "{}", o.context());
    assert_eq!(o.record["status"], "succeeded", "{}", o.context());
}

fn waits(turn: &Value) -> Vec<u64> {
    turn["replays"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["waitMs"].as_u64().unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// REP-8: a Retry-After lengthens the wait, still clamped by providerAttempt.maxDelayMs.

fn rep_8(api: &str, shape: Shape) {
    let o = run_case(
        api,
        shape,
        &Case {
            head: WIDE_CAPACITY,
            outline_delay_ms: 0,
            script: &|name| throttled_then_answer(&[1, 5], name),
            catalog: "  providerAttempt.maxDelayMs: 2000\n",
            timeout_ms: 60_000,
        },
    );
    let label = format!("REP-8 {api} {shape:?}");
    assert_succeeded(&o);
    assert_sent_at_once(&o, shape);
    for (lane, step, reqs) in o.work() {
        let attempts = step["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{}: {}", lane.step_id, o.context());
        let turn = &attempts[0]["turns"][0];
        // 500 ms backoff lengthened to Retry-After 1 s; then 1,000 ms lengthened to 5 s and
        // clamped to maxDelayMs.
        assert_eq!(
            waits(turn),
            [1000, 2000],
            "{}: {}",
            lane.step_id,
            o.context()
        );
        assert_eq!(reqs.len(), 3, "{}: {reqs:?}", lane.step_id);
        // The replay after the 5 s Retry-After left at the 2,000 ms ceiling: the throttle's
        // hold for that Retry-After did not keep it longer (its patience was 0).
        assert_eq!(turn["replays"][1]["heldMs"], 0, "{}", o.context());
        let gap = reqs[2].time as i64 - reqs[1].time as i64;
        assert!(
            (2000..=2000 + TOLERANCE_MS).contains(&gap),
            "{label} {}: the second replay left {gap} ms after the 5 s 429, not ~2,000 ms\n{}",
            lane.step_id,
            o.context()
        );
    }
    assert_gap_rule(&o, &label);
}

#[test]
fn rep_8_retry_after_clamped_to_max_delay_single_step_both_apis() {
    for api in APIS {
        rep_8(api, Shape::Single);
    }
}

#[test]
fn rep_8_retry_after_clamped_to_max_delay_fan_out_both_apis() {
    for api in APIS {
        rep_8(api, Shape::FanOut(3));
    }
}

// ---------------------------------------------------------------------------------------------
// REP-10 / STP-11 / STP-15: a 429 asking for 30 s inside a 2 s attempt.

fn rep_10(api: &str, shape: Shape) {
    let o = run_case(
        api,
        shape,
        &Case {
            head: WIDE_CAPACITY,
            outline_delay_ms: 0,
            script: &|name| throttled_then_answer(&[30], name),
            catalog: "  retry.transportMaxDelayMs: 500\n",
            timeout_ms: 2000,
        },
    );
    let label = format!("REP-10 {api} {shape:?}");
    assert_succeeded(&o);
    assert_sent_at_once(&o, shape);
    for (lane, step, reqs) in o.work() {
        let attempts = step["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{}: {}", lane.step_id, o.context());
        let first = &attempts[0];
        // The wait the 429 asks for (30 s, clamped to 20 s) would cross the 2 s deadline: it is
        // not started (no replay), the turn ends, and the attempt records the 429 with its
        // Retry-After, which the transport budget judges (STP-15, capped at 500 ms).
        let turn = &first["turns"][0];
        assert_eq!(turn["providerRetries"], 0, "{}", o.context());
        assert_eq!(first["status"], "failed", "{}", o.context());
        assert_eq!(first["httpStatus"], 429, "{}", o.context());
        assert_eq!(first["providerErrorClass"], "rate-limit", "{}", o.context());
        assert_eq!(first["retryAfterMs"], 30_000, "{}", o.context());
        assert_eq!(first["timeoutKind"], Value::Null, "{}", o.context());
        assert_eq!(first["retryDecision"], "scheduled", "{}", o.context());
        assert_eq!(first["waitMs"], 500, "{}", o.context());
        assert_eq!(attempts[1]["budget"], "transport", "{}", o.context());
        assert_eq!(attempts[1]["status"], "succeeded", "{}", o.context());
        assert_eq!(reqs.len(), 2, "{}: {reqs:?}", lane.step_id);
        // The retry reached the simulator within 500 ms of the first attempt's end (the 429's
        // response, after its scripted delay), not at the deadline or the Retry-After.
        let gap = reqs[1].time as i64 - reqs[0].time as i64 - FIRST_DELAY_MS as i64;
        assert!(
            gap <= 500 + TOLERANCE_MS,
            "{label} {}: the retry left {gap} ms after the 429, more than transportMaxDelayMs 500\n{}",
            lane.step_id,
            o.context()
        );
    }
    assert_gap_rule(&o, &label);
}

#[test]
fn rep_10_stp_11_stp_15_deadline_bounds_the_wait_single_step_both_apis() {
    for api in APIS {
        rep_10(api, Shape::Single);
    }
}

#[test]
fn rep_10_stp_11_stp_15_deadline_bounds_the_wait_fan_out_both_apis() {
    for api in APIS {
        rep_10(api, Shape::FanOut(3));
    }
}

// ---------------------------------------------------------------------------------------------
// STP-15 / STP-6: the step retry's wait is lengthened to the Retry-After but capped at
// retry.transportMaxDelayMs, and the throttle's hold does not stretch it.

fn stp_15(api: &str, shape: Shape) {
    let o = run_case(
        api,
        shape,
        &Case {
            head: WIDE_CAPACITY,
            outline_delay_ms: 0,
            script: &|name| throttled_then_answer(&[5, 5], name),
            catalog: "  providerAttempt.maxDelayMs: 1000\n  providerAttempt.maxThrottledAttemptsPerTurn: 2\n  retry.transportMaxDelayMs: 300\n",
            timeout_ms: 60_000,
        },
    );
    let label = format!("STP-15 {api} {shape:?}");
    assert_succeeded(&o);
    assert_sent_at_once(&o, shape);
    for (lane, step, reqs) in o.work() {
        let attempts = step["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{}: {}", lane.step_id, o.context());
        let first = &attempts[0];
        assert_eq!(waits(&first["turns"][0]), [1000], "{}", o.context());
        assert_eq!(first["httpStatus"], 429, "{}", o.context());
        assert_eq!(first["retryAfterMs"], 5000, "{}", o.context());
        assert_eq!(first["waitMs"], 300, "{}", o.context());
        assert_eq!(attempts[1]["budget"], "transport", "{}", o.context());
        assert_eq!(reqs.len(), 3, "{}: {reqs:?}", lane.step_id);
        let gap = reqs[2].time as i64 - reqs[1].time as i64;
        assert!(
            gap <= 300 + TOLERANCE_MS,
            "{label} {}: the next attempt left {gap} ms after the turn's last 429, not within 300 ms\n{}",
            lane.step_id,
            o.context()
        );
    }
    assert_gap_rule(&o, &label);
}

#[test]
fn stp_15_stp_6_step_wait_capped_by_transport_max_delay_single_step_both_apis() {
    for api in APIS {
        stp_15(api, Shape::Single);
    }
}

#[test]
fn stp_15_stp_6_step_wait_capped_by_transport_max_delay_fan_out_both_apis() {
    for api in APIS {
        stp_15(api, Shape::FanOut(3));
    }
}

// ---------------------------------------------------------------------------------------------
// The provider zoo: a dozen instances against a rate-limited shape, counted in the log.

/// The shipped zoo scenario `file` with `timeScale` added to its capacity, its answers moved to
/// one lane per instance (the same `Done.` after 200 ms as its own script, as JSON for the
/// read-only steps) so each instance's requests are told apart.
fn zoo_head(file: &str, time_scale: f64) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docsfab-sim/scenarios/zoo")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("capacity:\n") && !text.contains("timeScale"));
    let capacity_start = text.find("capacity:\n").unwrap();
    let responses = text.find("\nresponses:").unwrap();
    text[capacity_start..=responses].replace(
        "capacity:\n",
        &format!("capacity:\n  timeScale: {time_scale}\n"),
    )
}

/// The zoo files' answer delay.
const ZOO_ANSWER_MS: u64 = 200;

fn zoo(api: &str, file: &str, time_scale: f64, max_refusals: usize) {
    const INSTANCES: usize = 12;
    let shape = Shape::FanOut(INSTANCES);
    let head = zoo_head(file, time_scale);
    // Every admitted request is answered after 200 ms, the outline too, as the zoo file says.
    let o = run_case(
        api,
        shape,
        &Case {
            head: &head,
            outline_delay_ms: ZOO_ANSWER_MS,
            script: &|name| {
                Script(vec![(
                    format!("answer: {{json: {{page: {name}}}}}"),
                    ZOO_ANSWER_MS,
                )])
            },
            catalog: "",
            timeout_ms: 60_000,
        },
    );
    let label = format!("zoo {file} {api}");
    assert_succeeded(&o);
    let work = o.work();
    assert_eq!(work.len(), INSTANCES);
    for (lane, step, _) in &work {
        assert_eq!(
            step["status"],
            "succeeded",
            "{}: {}",
            lane.step_id,
            o.context()
        );
    }
    let refusals = o.log.iter().filter(|r| r.entry == CAPACITY_ENTRY).count();
    let t0 = o.log.first().map_or(0, |r| r.time);
    let timeline: Vec<String> = o
        .log
        .iter()
        .map(|r| {
            let who = if r.entry == CAPACITY_ENTRY {
                "429"
            } else {
                "ok"
            };
            format!("+{}:{who}", r.time - t0)
        })
        .collect();
    eprintln!("{label}: {}", timeline.join(" "));
    eprintln!("{label}: {refusals} refusals of {} requests", o.log.len());
    assert!(
        refusals <= max_refusals,
        "{label}: {refusals} requests refused over capacity (at most {max_refusals})\n{}",
        o.context()
    );
    assert_gap_rule(&o, &label);
}

// `timeScale` stays 1: with headers the throttle paces by the header's per-minute `limit`,
// which the simulator keeps per simulated minute, so a faster scale only gives it more room
// than it uses and the run no shorter; without headers the learnt rate is anchored on the
// whole-second Retry-After (real time), and `timeScale: 4` ran 6.8 s against 8 s. Both runs
// take the capacity's own floor (13 admitted requests at two a second).

#[test]
fn issue20_zoo_burst1_with_headers_a_dozen_instances_at_most_two_refusals() {
    // Two, not none: the throttle plans each send for an instant and the provider charges it
    // when it arrives; on a loaded machine a send can arrive some 25 ms late and its successor
    // on time. `throttle: off` is refused dozens of times on the same work.
    zoo("openai-chat", "burst1-openai.yaml", 1.0, 2);
    zoo("anthropic-messages", "burst1-anthropic.yaml", 1.0, 2);
}

#[test]
fn issue20_zoo_no_headers_a_dozen_instances_at_most_three_refusals() {
    for api in APIS {
        zoo(api, "no-headers.yaml", 1.0, 3);
    }
}
