//! The replay driver against the docsfab simulator on real sockets (real time, lowered delays).
//! The first test is the done-when: seven 408s then an answer, one turn.

use std::time::Duration;

use docsfab_policy::class::{FaultKind, ProviderErrorClass};
use docsfab_policy::replay::{ReplayLimits, StopReason};
use docsfab_provider::driver::{ReplayCause, TurnEnd, TurnResult, TurnStatus, run_turn};
use docsfab_provider::{Api, HttpConfig, HttpTransport, Message, Payload, TurnRequest};
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
        read_timeout: Duration::from_millis(500),
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
    assert_eq!(log[0].path, format!("/v1{}", api.path()));
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

#[tokio::test]
async fn sim_seven_408s_then_answer_openai_rep_1_rep_12_rep_13() {
    seven_408s_then_answer(Api::OpenaiChat).await;
}

#[tokio::test]
async fn sim_seven_408s_then_answer_anthropic_rep_1_rep_12_rep_13() {
    seven_408s_then_answer(Api::AnthropicMessages).await;
}

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
                ReplayCause::Fault(FaultKind::ConnectionDropped),
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
