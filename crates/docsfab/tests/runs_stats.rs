//! `docsfab runs stats` (issue 13) over real runs against `docsfab sim serve` with known
//! faults: the figures are exact counts of what the simulator did.

mod support;

use serde_json::{Value, json};
use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim};

fn stats(s: &Setup, args: &[&str]) -> Value {
    let out = s
        .docsfab()
        .args(["runs", "stats", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// One run meets 503, 503 and then answers; a later one meets 429, 429 and then answers.
#[test]
fn issue13_runs_stats_counts_the_faults_the_simulator_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:
  - status: 503
  - status: 503
  - answer: {json: {modules: [lib]}}
  - status: 429
  - status: 429
  - answer: {json: {modules: [lib]}}
",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let run = || {
        let out = s.run_command(&comp).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run();
    // Scaled wait: the first run starts well over 2 s before the second.
    std::thread::sleep(std::time::Duration::from_millis(3000));
    run();

    let all = stats(&s, &[]);
    assert_eq!(all["runs"], 2);
    assert_eq!(all["runsByProvider"], json!({"default": 2}));
    assert_eq!(all["requests"], 6);
    assert_eq!(all["turns"], 2);
    assert_eq!(all["replays"]["total"], 4);
    assert_eq!(
        all["replays"]["byClass"],
        json!({"rate-limit": 2, "server": 2})
    );
    assert_eq!(
        all["replays"]["byCause"],
        json!({"HTTP 429": 2, "HTTP 503": 2})
    );
    assert_eq!(all["stepRetries"]["total"], 0);
    assert_eq!(all["exhaustedSteps"]["total"], 0);
    assert_eq!(all["faultBursts"]["beforeSuccess"], json!({"2": 2}));
    assert_eq!(all["faultBursts"]["beforeGiveUp"], json!({}));
    // The first 429's next request got a 429, the second's answered; FAST_CATALOG waits
    // are well under a second.
    assert_eq!(
        all["rateLimitRepeats"][0],
        json!({"wait": "<1s", "after429": 2, "another429": 1, "probability": 0.5})
    );
    assert_eq!(
        all["failedAttemptTokens"],
        json!({"inputTokens": 0, "outputTokens": 0, "cacheWriteTokens": 0, "cacheReadTokens": 0,
            "attempts": 0, "unknownUsageAttempts": 0, "estimatedAttempts": 0,
            "costUsd": null, "unpricedAttempts": 0})
    );
    let waits = &all["waitingMs"];
    assert_eq!(waits["stepBackoffs"], 0);
    assert_eq!(waits["total"], waits["replayWaits"]);

    // --since keeps the second run only.
    let recent = stats(&s, &["--since", "2s"]);
    assert_eq!(recent["runs"], 1);
    assert_eq!(recent["replays"]["byCause"], json!({"HTTP 429": 2}));
    assert_eq!(stats(&s, &["--since", "7d"])["runs"], 2);

    // --provider matches the record's provider name.
    assert_eq!(stats(&s, &["--provider", "default"])["runs"], 2);
    let other = stats(&s, &["--provider", "other"]);
    assert_eq!(other["runs"], 0);
    assert_eq!(other["requests"], 0);

    // The readable view says the same.
    let out = s.docsfab().args(["runs", "stats"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("Requests: 6 in 2 turns, 2 attempts, 2 steps"),
        "{text}"
    );
    assert!(text.contains("  <1s    1 of 2 (50 %)"), "{text}");
}

/// Two attempts give up after 7 requests of HTTP 503 each (the replay window of FAST_CATALOG
/// allows 6 replays) and are retried by the step; the third answers at once.
#[test]
fn issue13_runs_stats_counts_step_retries_bursts_that_gave_up_and_backoffs() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - status: 503\n    repeat: 14\n  - answer: {json: {modules: [lib]}}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let out = s.run_command(&s.composition(ONE_STEP)).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = stats(&s, &[]);
    assert_eq!(
        (st["attempts"].clone(), st["turns"].clone()),
        (json!(3), json!(3))
    );
    assert_eq!(st["requests"], 15);
    assert_eq!(st["replays"]["total"], 12);
    assert_eq!(st["stepRetries"]["total"], 2);
    assert_eq!(st["stepRetries"]["byRule"], json!({"class-server": 2}));
    assert_eq!(st["faultBursts"]["beforeGiveUp"], json!({"7": 2}));
    assert_eq!(st["faultBursts"]["beforeSuccess"], json!({"0": 1}));
    assert_eq!(st["exhaustedSteps"]["total"], 0);
    // The step's backoffs, as its record gives them.
    let id = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_owned();
    let record = s.show_json(&id);
    let backoffs: u64 = record["steps"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["waitMs"].as_u64())
        .sum();
    assert!(backoffs > 0);
    assert_eq!(st["waitingMs"]["stepBackoffs"], backoffs);
}

/// Issue 34: `run --reuse` on an unchanged tree carries the step over; the stats count it as a
/// reused step of a run that reused, and give the rate over every step.
#[test]
fn issue34_runs_stats_counts_reused_steps_and_the_reuse_rate() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer: {json: {modules: [lib]}}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    for extra in [&[][..], &["--reuse"][..]] {
        let out = s.run_command(&comp).args(extra).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let st = stats(&s, &[]);
    assert_eq!(
        (st["runs"].clone(), st["steps"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(st["reusedSteps"], 1);
    assert_eq!(st["runsWithReusedSteps"], 1);
    assert_eq!(st["reuseRate"], 0.5);
    // The reused step sent nothing: one attempt in all.
    assert_eq!(st["attempts"], 1);
    let out = s.docsfab().args(["runs", "stats"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Reused steps: 1 of 2 (50 %), carried over by 1 run(s)"),
        "{text}"
    );
}

/// A --since that is not a duration is refused in one sentence with exit 2, before the store
/// is read or created.
#[test]
fn issue13_a_bad_since_exits_2_with_one_sentence() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    for bad in ["7", "1.5h", "7w", "yesterday", "0d"] {
        let out = s
            .docsfab()
            .args(["runs", "stats", "--since", bad])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("is not a duration"), "{stderr}");
        assert!(stderr.trim_end().ends_with('.'), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    assert!(!s.store().exists(), "the run store was created");
}
