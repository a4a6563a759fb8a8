//! The ceiling on one 200 body, over real HTTP against the simulator on 127.0.0.1: a provider
//! that streams past it is cut off, the turn fails as `unknown`, and it is never replayed.

use bytes::Bytes;
use docsfab_policy::replay::ReplayLimits;
use docsfab_provider::driver::run_turn;
use docsfab_provider::{HttpConfig, HttpTransport, Payload, TurnEnd};
use docsfab_record::{Api, FaultKind, ProviderErrorClass};
use docsfab_sim::{Scenario, SimServer};
use tokio_util::sync::CancellationToken;

async fn sim(text_len: usize) -> SimServer {
    let text = "word ".repeat(text_len / 5);
    let scenario = format!("responses:\n  - answer: {{text: {text:?}}}\n");
    SimServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Scenario::from_yaml_str(&scenario, "inline").unwrap(),
        None,
    )
    .await
    .unwrap()
}

fn transport(sim: &SimServer, max_body_bytes: usize) -> HttpTransport {
    HttpTransport::new(HttpConfig {
        keep_raw_body: true,
        max_body_bytes,
        ..HttpConfig::new(Api::OpenaiChat, sim.base_url(), None)
    })
    .unwrap()
}

fn payload() -> Payload {
    Payload::from_bytes(
        Api::OpenaiChat,
        Bytes::from_static(br#"{"model":"m","stream":true,"messages":[]}"#),
    )
}

/// A body past the ceiling ends the turn as `unknown` after one request: never replayed
/// (REP-5: the class decides, and `unknown` is not a transport class).
#[tokio::test]
async fn a_body_past_the_ceiling_is_cut_off_and_not_replayed_rep_5() {
    let sim = sim(20_000).await;
    let t = transport(&sim, 4_096);
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    match r.end {
        TurnEnd::Failed { failure, .. } => {
            assert_eq!(failure.failure.class, ProviderErrorClass::Unknown);
            assert_eq!(failure.failure.fault, FaultKind::BodyCut);
        }
        other => panic!("expected a failed turn, got {other:?}"),
    }
    assert!(
        r.record
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("exceeded 4096 bytes"),
        "{:?}",
        r.record.detail
    );
    assert_eq!(r.record.provider_retries, 0);
    assert_eq!(sim.requests().len(), 1);
}

/// The same answer under the default ceiling completes: the ceiling only stops runaway bodies.
#[tokio::test]
async fn the_same_body_under_the_default_ceiling_completes() {
    let sim = sim(20_000).await;
    let t = HttpTransport::new(HttpConfig {
        keep_raw_body: true,
        ..HttpConfig::new(Api::OpenaiChat, sim.base_url(), None)
    })
    .unwrap();
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    assert!(matches!(r.end, TurnEnd::Completed(_)), "{:?}", r.end);
}
