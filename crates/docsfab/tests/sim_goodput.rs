//! `docsfab sim goodput` as a real process: the table, the JSON shape, reproducibility with
//! `--seed`, a host limit that reaches the simulation, and bad input refused with exit code 2.

mod support;

use serde_json::Value;
use support::run::docsfab_at;

fn goodput(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    docsfab_at(home)
        .args(["sim", "goodput"])
        .args(args)
        .output()
        .expect("docsfab runs")
}

fn json(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn issue14_goodput_json_has_every_policy_and_figure_and_repeats_with_the_seed() {
    let home = tempfile::tempdir().unwrap();
    let args = ["--steps", "2000", "--seed", "9", "--json"];
    let a = json(&goodput(home.path(), &args));
    let b = json(&goodput(home.path(), &args));
    assert_eq!(a, b, "the same seed gives the same figures");
    let names: Vec<&str> = a["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "effective",
            "openai-python",
            "anthropic-python",
            "vercel-ai-sdk",
            "litellm"
        ]
    );
    let p = &a["policies"][0];
    for key in [
        "steps",
        "succeeded",
        "successRate",
        "successCi95",
        "p50StepMs",
        "p99StepMs",
        "requestsPerSuccess",
        "meanAttempts",
        "meanWaitMs",
        "boundsHit",
    ] {
        assert!(!p[key].is_null(), "missing {key}: {p}");
    }
    let (low, high, rate) = (
        p["successCi95"]["low"].as_f64().unwrap(),
        p["successCi95"]["high"].as_f64().unwrap(),
        p["successRate"].as_f64().unwrap(),
    );
    assert!(low <= rate && rate <= high);
}

/// `effective` is the host's resolved configuration: with no transport retries and a general
/// window of one request, an always-503 provider fails every step after one request.
#[test]
fn issue14_goodput_effective_policy_uses_the_hosts_resolved_limits() {
    let home = tempfile::tempdir().unwrap();
    let model = home.path().join("always503.yaml");
    std::fs::write(
        &model,
        "good: {server: 1.0}\nbad: {server: 1.0}\ngoodToBad: 0\nbadToGood: 0\n\
         okLatency: {minMs: 1, maxMs: 1}\nfaultLatency: {minMs: 1, maxMs: 1}\n\
         streamLatency: {minMs: 1, maxMs: 1}\n",
    )
    .unwrap();
    let m = model.to_str().unwrap();
    let base = json(&goodput(
        home.path(),
        &[
            "--fault-model",
            m,
            "--policy",
            "effective",
            "--steps",
            "50",
            "--json",
        ],
    ));
    assert_eq!(base["policies"][0]["succeeded"], 0);
    assert_eq!(base["policies"][0]["meanAttempts"], 7.0);
    let lowered = docsfab_at(home.path())
        .env("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "1")
        .args([
            "sim",
            "goodput",
            "--fault-model",
            m,
            "--policy",
            "effective",
            "--steps",
            "50",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(json(&lowered)["policies"][0]["meanAttempts"], 2.0);
}

#[test]
fn issue14_goodput_table_names_each_policy() {
    let home = tempfile::tempdir().unwrap();
    let out = goodput(home.path(), &["--steps", "500"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("policy "), "{text}");
    for name in [
        "effective",
        "openai-python",
        "anthropic-python",
        "vercel-ai-sdk",
        "litellm",
    ] {
        assert!(text.contains(name), "{text}");
    }
}

#[test]
fn issue14_goodput_bad_input_is_one_sentence_and_exit_2() {
    let home = tempfile::tempdir().unwrap();
    let bad = home.path().join("bad.yaml");
    std::fs::write(&bad, "good: {rateLimit: 2}\n").unwrap();
    let bad_prob = home.path().join("prob.yaml");
    std::fs::write(
        &bad_prob,
        "good: {rateLimit: 1.5}\nbad: {}\ngoodToBad: 0\nbadToGood: 0\n\
         okLatency: {minMs: 1, maxMs: 1}\nfaultLatency: {minMs: 1, maxMs: 1}\n\
         streamLatency: {minMs: 1, maxMs: 1}\n",
    )
    .unwrap();
    let missing = home.path().join("missing.yaml");
    let cases: [(Vec<&str>, &str); 5] = [
        (
            vec!["--fault-model", bad.to_str().unwrap()],
            "is not valid at line",
        ),
        (
            vec!["--fault-model", bad_prob.to_str().unwrap()],
            "good.rateLimit is 1.5",
        ),
        (
            vec!["--fault-model", missing.to_str().unwrap()],
            "cannot read the fault model",
        ),
        (vec!["--policy", "nope"], "is not a policy"),
        (vec!["--steps", "0"], "simulates nothing"),
    ];
    for (args, needle) in cases {
        let out = goodput(home.path(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
        assert!(out.stdout.is_empty());
    }
}

/// `--sweep` resolves each value the way a run does and `--plot` draws both series; a range
/// outside the limit's catalog range is refused before anything runs.
#[test]
fn issue14_goodput_sweep_rows_and_svg_plot() {
    let home = tempfile::tempdir().unwrap();
    let plot = home.path().join("sweep.svg");
    let out = goodput(
        home.path(),
        &[
            "--sweep",
            "retry.maxTransportRetries=0..6",
            "--steps",
            "300",
            "--json",
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    let doc = json(&out);
    let names: Vec<&str> = doc["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 7);
    assert_eq!(names[0], "retry.maxTransportRetries=0");
    assert_eq!(names[6], "retry.maxTransportRetries=6");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 2);

    let refused = goodput(home.path(), &["--sweep", "retry.maxTransportRetries=0..9"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("leaves the range"));
}
