//! The replay driver against the docsfab simulator on real sockets (real time, lowered delays).
//! The first test is the done-when: seven 408s then an answer, one turn.

use std::time::Duration;

use docsfab_policy::replay::{ReplayLimits, StopReason};
use docsfab_provider::driver::{TurnEnd, TurnResult, run_turn};
use docsfab_provider::{HttpConfig, HttpTransport, Message, Payload, TurnRequest};
use docsfab_record::{Api, FaultKind, ProviderErrorClass, ReplayCause, TurnStatus};
use docsfab_sim::{RequestLogEntry, Scenario, SimServer};
use tokio_util::sync::CancellationToken;

fn limits() -> ReplayLimits {
    ReplayLimits {
        base_delay_ms: 5,
        max_delay_ms: 40,
        max_total_delay_ms: 1_000,
        max_attempts_per_turn: 8,
        max_throttled_attempts_per_turn: 24,
        max_throttled_total_delay_ms: 2_000,
    }
}

fn payload(api: Api) -> Payload {
    Payload::build(
        api,
        &TurnRequest {
            include_usage: true,
            prompt_cache_key: None,
            response_format: None,
            tool_choice: None,
            model: "sim-model".into(),
            max_output_tokens: 64,
            system: None,
            messages: vec![Message::User {
                text: "Summarize the crate.".into(),
            }],
            tools: vec![],
        },
    )
    .expect("payload")
}

async fn turn_against(
    api: Api,
    yaml: &str,
    limits: ReplayLimits,
) -> (TurnResult, Vec<RequestLogEntry>) {
    let scenario = Scenario::from_yaml_str(yaml, "test scenario").expect("scenario");
    let sim = SimServer::start("127.0.0.1:0".parse().expect("addr"), scenario, None)
        .await
        .expect("simulator");
    let transport = HttpTransport::new(HttpConfig {
        read_timeout: Duration::from_millis(1_000),
        ..HttpConfig::new(api, sim.base_url(), None)
    })
    .expect("transport");
    let p = payload(api);
    let r = run_turn(&transport, &limits, &p, &CancellationToken::new(), None).await;
    let log = sim.requests();
    sim.shutdown().await;
    (r, log)
}

async fn seven_408s_then_answer(api: Api) {
    let yaml = "responses:\n  - status: 408\n    repeat: 7\n  - answer:\n      text: Done.\n";
    let (r, log) = turn_against(api, yaml, limits()).await;

    assert_eq!(log.len(), 8, "eight requests in the simulator's log");
    let digest = payload(api).digest().to_hex();
    assert!(
        log.iter().all(|e| e.sha256 == digest),
        "one payload digest across all eight (REP-12)"
    );
    assert_eq!(
        log[0].path,
        format!("/v1{}", docsfab_provider::request::endpoint_path(api))
    );
    assert!(log.iter().all(|e| e.stream));

    assert_eq!(r.record.status, TurnStatus::Completed);
    assert_eq!(r.record.provider_retries, 7);
    assert_eq!(r.record.payload_digest, digest);
    let waits: Vec<u64> = r.record.replays.iter().map(|e| e.wait_ms).collect();
    assert_eq!(
        waits,
        vec![5, 10, 20, 40, 40, 40, 40],
        "doubling from the base, capped at max_delay_ms"
    );
    assert!(r.record.replays.iter().all(|e| {
        e.cause == ReplayCause::Status(408) && e.provider_error_class == ProviderErrorClass::Timeout
    }));
    // The simulator saw the waits too: each gap is at least the scheduled wait.
    for (pair, wait) in log.windows(2).zip(&waits) {
        assert!(pair[1].time_unix_ms - pair[0].time_unix_ms >= *wait);
    }
    match r.end {
        TurnEnd::Completed(o) => assert_eq!(o.text, "Done."),
        other => panic!("expected the answer, got {other:?}"),
    }
}

// Proves REP-1, REP-12, REP-13.
#[tokio::test]
async fn sim_seven_408s_then_answer_openai_rep_1_rep_12_rep_13() {
    seven_408s_then_answer(Api::OpenaiChat).await;
}

// Proves REP-1, REP-12, REP-13.
#[tokio::test]
async fn sim_seven_408s_then_answer_anthropic_rep_1_rep_12_rep_13() {
    seven_408s_then_answer(Api::AnthropicMessages).await;
}

// Proves REP-1.
#[tokio::test]
async fn sim_eight_408s_fail_the_turn_after_eight_requests_rep_1() {
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let yaml = "responses:\n  - status: 408\n    repeat: 8\n  - answer:\n      text: late\n";
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 8);
        assert_eq!(r.record.status, TurnStatus::Failed);
        assert!(matches!(
            r.record.stop_reason,
            Some(StopReason::AttemptsExhausted { attempts: 8, .. })
        ));
    }
}

// Proves REP-2, CLS-5.
#[tokio::test]
async fn sim_drops_resets_and_stream_errors_are_replayed_rep_2_cls_5() {
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let yaml = "responses:
  - drop: close
  - drop: reset
  - stream_error:
      type: service_unavailable
      code: 503
  - answer:
      text: fine
";
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 4, "{api:?}");
        assert_eq!(r.record.status, TurnStatus::Completed, "{:?}", r.record);
        let causes: Vec<ReplayCause> = r.record.replays.iter().map(|e| e.cause).collect();
        assert_eq!(
            causes,
            vec![
                ReplayCause::Fault(FaultKind::ConnectionDropped),
                // The simulator's RST is labelled `reset` (issue 11); its class is still network.
                ReplayCause::Fault(FaultKind::Reset),
                ReplayCause::Fault(FaultKind::ErrorEvent),
            ],
            "{api:?}"
        );
        assert_eq!(
            r.record.replays[2].provider_error_class,
            ProviderErrorClass::Server
        );
    }
}

// Proves REP-3.
#[tokio::test]
async fn sim_terminal_status_is_sent_once_rep_3() {
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let yaml = "responses:\n  - status: 401\n  - answer:\n      text: never\n";
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 1);
        assert_eq!(r.record.stop_reason, Some(StopReason::NotReplayable));
        assert_eq!(
            r.record.failure.map(|f| f.class),
            Some(ProviderErrorClass::Authentication)
        );
    }
}

fn outcome(r: &TurnResult) -> &docsfab_provider::StreamOutcome {
    match &r.end {
        TurnEnd::Completed(o) => o,
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[tokio::test]
async fn sim_tool_calls_and_truncated_arguments_are_read_on_both_apis() {
    let yaml = "responses:
  - answer:
      text: Reading.
      tool_calls:
        - id: call_1
          name: read_file
          arguments: {path: src/lib.rs}
        - id: call_2
          name: write_file
          arguments: {path: docs/a.md, content: '# A'}
          truncate_arguments: 12
";
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 1);
        let o = outcome(&r);
        assert_eq!(o.text, "Reading.");
        assert_eq!(
            o.finish_reason,
            Some(docsfab_provider::FinishReason::ToolCalls)
        );
        assert_eq!(o.tool_calls.len(), 2, "{api:?}");
        assert_eq!(o.tool_calls[0].id, "call_1");
        assert_eq!(o.tool_calls[0].name, "read_file");
        let args: serde_json::Value =
            serde_json::from_str(&o.tool_calls[0].arguments).expect("complete arguments");
        assert_eq!(args, serde_json::json!({"path": "src/lib.rs"}));
        assert!(!o.tool_calls[0].truncated);
        assert!(o.tool_calls[1].truncated, "{api:?}: {:?}", o.tool_calls[1]);
        assert_eq!(o.models, vec!["sim-model".to_string()]);
    }
}

// Proves BND-6.
#[tokio::test]
async fn sim_odd_line_framing_still_reads_the_answer_bnd_6() {
    let yaml = "responses:
  - answer: {text: one, line_ending: cr}
  - answer: {text: two, line_ending: mixed, bom: {count: 2, lines: data}}
  - answer: {text: three, line_ending: crlf, bom: {count: 1, lines: all}}
";
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let scenario = Scenario::from_yaml_str(yaml, "framing").expect("scenario");
        let sim = SimServer::start("127.0.0.1:0".parse().expect("addr"), scenario, None)
            .await
            .expect("simulator");
        let t = HttpTransport::new(HttpConfig::new(api, sim.base_url(), None)).expect("t");
        let p = payload(api);
        for want in ["one", "two", "three"] {
            let r = run_turn(&t, &limits(), &p, &CancellationToken::new(), None).await;
            let o = outcome(&r);
            assert_eq!(o.text, want, "{api:?}");
            assert!(o.done && o.finish_reason.is_some(), "{api:?} {want}");
        }
        sim.shutdown().await;
    }
}

// Proves CLS-2, REP-14.
#[tokio::test]
async fn sim_clean_close_after_content_is_stream_incomplete_and_not_replayed_cls_2_rep_14() {
    let yaml = "responses:
  - answer: {text: The first half of an ans, omit_finish_reason: true, omit_done: true}
  - answer: {text: never}
";
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 1);
        let f = r.record.failure.expect("failure");
        assert_eq!(f.class, ProviderErrorClass::StreamIncomplete, "{api:?}");
        assert!(f.content_published);
        assert_eq!(r.record.stop_reason, Some(StopReason::ContentPublished));
    }
}

// Proves REP-14, CLS-5.
#[tokio::test]
async fn sim_error_event_after_content_is_not_replayed_rep_14_cls_5() {
    let yaml = "responses:
  - answer:
      text: partial
      error_event: {type: service_unavailable, code: 503}
      omit_finish_reason: true
  - answer: {text: never}
";
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 1);
        let f = r.record.failure.expect("failure");
        assert_eq!(
            (f.fault, f.class, f.declared_status),
            (FaultKind::ErrorEvent, ProviderErrorClass::Server, Some(503)),
            "{api:?}"
        );
        assert_eq!(r.record.stop_reason, Some(StopReason::ContentPublished));
    }
}

// Proves REP-6.
#[tokio::test]
async fn sim_quota_error_event_is_terminal_rep_6() {
    let yaml = "responses:
  - stream_error: {type: insufficient_quota, code: 429, done: false}
  - answer: {text: never}
";
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 1, "{api:?}");
        assert_eq!(
            r.record.failure.map(|f| f.class),
            Some(ProviderErrorClass::RateLimit)
        );
        assert_eq!(r.record.stop_reason, Some(StopReason::NotReplayable));
    }
}

// Proves REP-2.
#[tokio::test]
async fn sim_cut_and_stall_before_content_are_replayed_rep_2() {
    let yaml = "responses:
  - answer: {text: hello}
    cut: {after_bytes: 0, with: reset}
  - answer: {text: hello}
    cut: {after_bytes: 0, with: close}
  - drop: close
    delay_ms: 2000
  - answer: {text: hello}
";
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let (r, log) = turn_against(api, yaml, limits()).await;
        assert_eq!(log.len(), 4, "{api:?}");
        assert_eq!(r.record.status, TurnStatus::Completed);
        let causes: Vec<ReplayCause> = r.record.replays.iter().map(|e| e.cause).collect();
        assert_eq!(
            causes,
            vec![
                ReplayCause::Fault(FaultKind::BodyCut),
                ReplayCause::Fault(FaultKind::BodyCut),
                ReplayCause::Fault(FaultKind::RequestTimeout),
            ],
            "{api:?}"
        );
        assert_eq!(outcome(&r).text, "hello");
    }
}

// Proves REP-8.
#[tokio::test]
async fn sim_retry_after_ms_sets_the_wait_rep_8() {
    let yaml = "responses:
  - status: 429
    headers: {retry-after-ms: 120}
  - answer: {text: ok}
";
    let limits = ReplayLimits {
        max_delay_ms: 1_000,
        ..limits()
    };
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let (r, log) = turn_against(api, yaml, limits).await;
        assert_eq!(log.len(), 2);
        assert_eq!(r.record.replays[0].retry_after_ms, Some(120));
        assert_eq!(r.record.replays[0].wait_ms, 120);
        assert!(log[1].time_unix_ms - log[0].time_unix_ms >= 120);
    }
}

// Proves CLS-1.
#[tokio::test]
async fn sim_content_filter_finish_is_terminal_cls_1() {
    for (api, reason) in [
        (Api::OpenaiChat, "content_filter"),
        (Api::AnthropicMessages, "refusal"),
    ] {
        let yaml = format!(
            "responses:\n  - answer: {{text: hm, finish_reason: {reason}}}\n  - answer: {{text: never}}\n"
        );
        let (r, log) = turn_against(api, &yaml, limits()).await;
        assert_eq!(log.len(), 1);
        assert_eq!(
            r.record.failure.map(|f| f.class),
            Some(ProviderErrorClass::ContentFilter)
        );
        assert_eq!(r.record.stop_reason, Some(StopReason::NotReplayable));
    }
}

// Proves REP-1.
#[tokio::test]
async fn sim_seeded_fault_bursts_each_end_in_one_completed_turn_rep_1() {
    // Twelve episodes of 0..=7 faults (408 or 503), each followed by an answer: every burst fits
    // the 8-attempt window, so each turn completes with one replay per fault of its burst.
    let yaml = "responses:
  - name: storm
    random:
      seed: 7
      episodes: 12
      burst: {length: [0, 7], statuses: [408, 503]}
      then:
        answer: {text: recovered}
";
    let api = Api::OpenaiChat;
    let scenario = Scenario::from_yaml_str(yaml, "storm").expect("scenario");
    let sim = SimServer::start("127.0.0.1:0".parse().expect("addr"), scenario, None)
        .await
        .expect("simulator");
    let t = HttpTransport::new(HttpConfig::new(api, sim.base_url(), None)).expect("t");
    let p = payload(api);
    let mut seen = 0;
    let mut total_faults = 0;
    for episode in 0..12 {
        let r = run_turn(&t, &limits(), &p, &CancellationToken::new(), None).await;
        let log = sim.requests();
        let this: Vec<_> = log[seen..].to_vec();
        seen = log.len();
        let faults = this.iter().filter(|e| e.entry.contains(".fault[")).count();
        total_faults += faults;
        assert_eq!(r.record.status, TurnStatus::Completed, "episode {episode}");
        assert_eq!(
            r.record.provider_retries as usize, faults,
            "episode {episode}"
        );
        assert!(this.last().is_some_and(|e| e.entry.ends_with(".then")));
        assert!(this.iter().all(|e| e.sha256 == p.digest().to_hex()));
    }
    assert!(
        total_faults > 12,
        "the seed gives real bursts: {total_faults}"
    );
    sim.shutdown().await;
}
