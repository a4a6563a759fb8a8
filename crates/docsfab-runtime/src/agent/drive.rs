//! The async driver of the agent loop: it performs the loop's actions (a provider turn with its
//! in-turn replays, a tool batch) and passes the loop's turn events to the observer.

use std::sync::atomic::{AtomicBool, Ordering};

use docsfab_provider::driver::{DriverEvent, Gate, TurnResult, run_turn_gated};
use docsfab_provider::{Payload, Spend};
use tokio::time::Instant;

use super::ending::Ending;
use super::input::{AttemptInput, TurnEvent};
use super::state::{Action, AgentLoop};
use crate::batch;
use crate::tools::StepTools;

/// Performs the agent loop's actions: the provider turns (with their replays, bounded by the
/// attempt deadline and the cancellation) and the tool batches, and passes the loop's turn
/// events to the observer as they happen.
pub(super) async fn drive(
    input: &AttemptInput<'_>,
    lp: &mut AgentLoop<'_>,
    tools: &mut StepTools<'_>,
) -> Ending {
    let mut action = lp.start();
    loop {
        for event in lp.take_events() {
            (input.observer)(event);
        }
        action = match action {
            Action::Finish(ending) => return ending,
            Action::BeginTurn if input.cancel.is_cancelled() => lp.cancelled(),
            Action::BeginTurn => {
                let now = Instant::now().into_std();
                lp.begin_turn(tools.preflight(), now)
            }
            Action::Send { turn, payload } => {
                let result = send_turn(input, lp.deadline(), turn, &payload).await;
                lp.turn_ended(turn, result)
            }
            Action::RunTools { calls } => {
                let ran = batch::run_batch_with(tools, lp.lease_mut(), &calls, input.before_write);
                lp.batch_ran(ran)
            }
            Action::AfterTools => lp.after_tools(
                tools.supervisor().no_progress(),
                input.cancel.is_cancelled(),
                Instant::now().into_std(),
            ),
        };
    }
}

/// Sends turn `turn` with its in-turn replays, bounded by the attempt `deadline` and the
/// cancellation, and tells the observer of the request and of what the replay driver reports.
async fn send_turn(
    input: &AttemptInput<'_>,
    deadline: std::time::Instant,
    turn: u32,
    payload: &Payload,
) -> TurnResult {
    (input.observer)(TurnEvent::Request {
        turn,
        digest: payload.digest().to_hex(),
        payload: payload.bytes().clone(),
    });
    let observer = input.observer;
    let mut on_event = |e: DriverEvent<'_>| {
        if let Some(event) = driver_event(turn, e) {
            observer(event);
        }
    };
    // The step retry's ceiling bounds only the attempt's first request.
    let gate = input.gate.map(|g| Gate {
        first_patience: g.first_patience.filter(|_| turn == 1),
        ..g
    });
    let spend = input.spend.budget.map(|budget| Spend {
        budget,
        max_output_tokens: u64::from(input.limits.max_output_tokens),
    });
    run_turn_gated(
        input.transport,
        &input.replay_limits,
        payload,
        input.cancel,
        Some(Instant::from_std(deadline)),
        gate,
        spend,
        &mut on_event,
    )
    .await
}

/// The turn event for what the replay driver reported, if the observer hears of it.
fn driver_event(turn: u32, e: DriverEvent<'_>) -> Option<TurnEvent> {
    /// One warning per process: the operator needs to know once, not per request.
    static THROTTLE_WARNED: AtomicBool = AtomicBool::new(false);
    match e {
        DriverEvent::Replay(entry) => Some(TurnEvent::Replay {
            turn,
            entry: *entry,
        }),
        DriverEvent::Held { held_ms, reason } => Some(TurnEvent::Held {
            turn,
            held_ms,
            reason: reason.map_or("hold", |r| r.as_str()),
        }),
        DriverEvent::ThrottleUnavailable(message) => (!THROTTLE_WARNED
            .swap(true, Ordering::Relaxed))
        .then(|| TurnEvent::ThrottleUnavailable {
            message: message.to_owned(),
        }),
    }
}
