//! The crafted corpus (tests/corpus/manifest.json): every body gets its expected verdict, read
//! whole, read in the cuts the manifest names, and re-cut at random.

use docsfab_boundary::{BoundaryConfig, Pass, Reason, Secret, Verdict};
use docsfab_record::Api;
use proptest::prelude::*;
use serde_json::Value;
use std::path::PathBuf;

struct Case {
    name: String,
    body: Vec<u8>,
    config: BoundaryConfig,
    expect: String,
    offset: Option<u64>,
    credential: Option<String>,
    reads: Vec<usize>,
}

fn corpus() -> Vec<Case> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let api = match c["api"].as_str().unwrap() {
                "openai-chat" => Api::OpenaiChat,
                "anthropic-messages" => Api::AnthropicMessages,
                other => panic!("unknown api {other}"),
            };
            let secrets: Vec<Secret> = c["secrets"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .map(|s| {
                            Secret::new(s["label"].as_str().unwrap(), s["value"].as_str().unwrap())
                                .unwrap()
                        })
                        .collect()
                })
                .unwrap_or_default();
            let file = c["file"].as_str().unwrap();
            Case {
                name: c["name"].as_str().unwrap().to_owned(),
                body: std::fs::read(dir.join(file)).unwrap(),
                config: BoundaryConfig::new(api, c["model"].as_str().unwrap(), &secrets).unwrap(),
                expect: c["expect"].as_str().unwrap().to_owned(),
                offset: c["offset"].as_u64(),
                credential: c["credential"].as_str().map(str::to_owned),
                reads: c["reads"]
                    .as_array()
                    .map(|v| v.iter().map(|n| n.as_u64().unwrap() as usize).collect())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

fn check_in_reads(config: &BoundaryConfig, body: &[u8], cuts: &[usize]) -> Verdict {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| (*c).min(body.len())).collect();
    cuts.sort_unstable();
    let mut b = config.start();
    let mut at = 0;
    for c in cuts {
        b.feed(&body[at..c]);
        at = c;
    }
    b.feed(&body[at..]);
    b.finish()
}

fn assert_expected(case: &Case, got: &Verdict) {
    match (case.expect.as_str(), got) {
        ("pass-stream", Verdict::Pass(Pass::Stream)) => {}
        ("pass-error-events-only", Verdict::Pass(Pass::ErrorEventsOnly)) => {}
        (want, Verdict::Refuse(r)) if want.strip_prefix("refuse:") == Some(r.reason.code()) => {
            assert_eq!(Some(r.offset), case.offset, "{}: offset of {r}", case.name);
            if let Reason::CredentialMaterial(kind) = &r.reason {
                assert_eq!(
                    Some(kind.code()),
                    case.credential.as_deref(),
                    "{}",
                    case.name
                );
            }
        }
        (want, got) => panic!("{}: expected {want}, got {got:?}", case.name),
    }
}

/// Every corpus case, read whole and in the reads its manifest entry names (a CRLF split
/// across reads among them). Covers BND-1..BND-9 case by case; the manifest notes say which.
#[test]
fn corpus_verdicts_bnd_1_to_9() {
    let cases = corpus();
    assert!(cases.len() >= 50);
    for case in &cases {
        assert_expected(case, &case.config.check(&case.body));
        assert_expected(case, &check_in_reads(&case.config, &case.body, &case.reads));
    }
}

/// The corpus covers every reason code a body can earn by its content, and both passes.
#[test]
fn corpus_covers_every_outcome() {
    let cases = corpus();
    for want in [
        "pass-stream",
        "pass-error-events-only",
        "refuse:not-a-stream",
        "refuse:no-event",
        "refuse:unparsable-data-line",
        "refuse:data-not-an-object",
        "refuse:multi-line-data-event",
        "refuse:missing-model-identity",
        "refuse:model-mismatch",
        "refuse:credential-material",
    ] {
        assert!(cases.iter().any(|c| c.expect == want), "no case for {want}");
    }
}

/// A credential refusal names its kind, never the secret.
#[test]
fn credential_refusal_never_shows_the_secret() {
    for case in corpus() {
        if let Verdict::Refuse(r) = case.config.check(&case.body)
            && r.reason.is_credential()
        {
            let shown = format!("{r} {r:?}");
            for secret in [
                "sk-proj-Dq8f",
                "docsfab-host-secret-7f3a9c21",
                "AKIAIOSFODNN7",
                "MIIEow",
            ] {
                assert!(!shown.contains(secret), "{}: {shown}", case.name);
            }
        }
    }
}

/// Cuts of one read per byte: the most a network can split a body.
#[test]
fn corpus_verdicts_survive_one_byte_reads_bnd_9() {
    for case in corpus() {
        let cuts: Vec<usize> = (0..case.body.len()).collect();
        assert_eq!(
            check_in_reads(&case.config, &case.body, &cuts),
            case.config.check(&case.body),
            "{}",
            case.name
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// BND-9: re-cutting every corpus body at random never changes its verdict.
    #[test]
    fn verdicts_do_not_depend_on_reads_bnd_9(
        cut_sets in proptest::collection::vec(proptest::collection::vec(any::<proptest::sample::Index>(), 0..12), 60..=60)
    ) {
        for (case, cuts) in corpus().iter().zip(cut_sets.iter().cycle()) {
            let cuts: Vec<usize> = cuts.iter().map(|i| i.index(case.body.len() + 1)).collect();
            let got = check_in_reads(&case.config, &case.body, &cuts);
            assert_expected(case, &got);
        }
    }
}
