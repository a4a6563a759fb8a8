//! `GET /api/runs/{id}/events`: server-sent events of a run's progress, read from the store
//! every 250 ms, so they work for a run on any worker sharing it. Events: `status` (the run's
//! status, first and on every change), `step` (a step started or changed status), `attempt`
//! (an attempt recorded), and `end` (the final status; then the stream closes). A comment line
//! every 15 s keeps proxies from closing a quiet stream. The stream ends when the client goes
//! away (the body is dropped) or the server stops.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse as _, Response};
use docsfab_record::{RunRecord, RunStatus};
use serde_json::json;

use super::reply::ApiError;
use super::state::Shared;

const POLL: Duration = Duration::from_millis(250);
const HEARTBEAT: Duration = Duration::from_secs(15);

/// What the client has been told so far.
#[derive(Debug, Default)]
struct Seen {
    status: Option<RunStatus>,
    /// Per step index: its status and how many attempts were announced.
    steps: Vec<(String, usize)>,
}

/// The events that take a client from `seen` to `record`, and whether the run has ended.
fn diff(seen: &mut Seen, record: &RunRecord) -> (Vec<Event>, bool) {
    let mut out = Vec::new();
    let id = &record.run_id;
    for (index, step) in record.steps.iter().enumerate() {
        let status = step.status.as_str().to_owned();
        if seen.steps.len() <= index {
            seen.steps.push((String::new(), 0));
        }
        let (seen_status, seen_attempts) = &mut seen.steps[index];
        for a in step.attempts.iter().skip(*seen_attempts) {
            out.push(event(
                "attempt",
                json!({"runId": id, "step": index, "stepId": step.step_id, "attempt": a.attempt,
                       "budget": a.budget.as_str(), "status": crate::app::print::name_of(&a.status)}),
            ));
        }
        *seen_attempts = step.attempts.len();
        if *seen_status != status {
            out.push(event(
                "step",
                json!({"runId": id, "step": index, "stepId": step.step_id, "status": status}),
            ));
            *seen_status = status;
        }
    }
    if seen.status != Some(record.status) {
        seen.status = Some(record.status);
        out.push(event(
            "status",
            json!({"runId": id, "status": record.status.as_str()}),
        ));
    }
    let ended = !matches!(record.status, RunStatus::Queued | RunStatus::Running);
    if ended {
        out.push(event(
            "end",
            json!({"runId": id, "status": record.status.as_str(), "endedAt": record.ended_at, "reason": record.end_reason}),
        ));
    }
    (out, ended)
}

fn event(name: &str, data: serde_json::Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

struct Poller {
    shared: Arc<Shared>,
    id: String,
    seen: Seen,
    pending: VecDeque<Event>,
    first: bool,
    ended: bool,
}

impl Poller {
    /// The next event: queued ones first, then the store is read again (every [`POLL`]).
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Poller)> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some((Ok(e), self));
            }
            if self.ended {
                return None;
            }
            if !self.first {
                tokio::select! {
                    () = tokio::time::sleep(POLL) => {}
                    () = self.shared.stopping.cancelled() => return None,
                }
            }
            self.first = false;
            let key = self.id.clone();
            let Ok(Ok(Some(record))) = self
                .shared
                .service
                .with_store(move |s| s.load_run(&key))
                .await
            else {
                // A store that fails now may answer on the next poll; a run that vanished ends it.
                continue;
            };
            let (events, ended) = diff(&mut self.seen, &record);
            self.pending.extend(events);
            self.ended = ended;
        }
    }
}

pub async fn stream(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let key = id.clone();
    match shared.service.with_store(move |s| s.load_run(&key)).await {
        Ok(Ok(Some(_))) => {}
        Ok(Ok(None)) => {
            return ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                format!("there is no run {id:?} in the store; list runs with GET /api/runs."),
            )
            .into_response();
        }
        Ok(Err(e)) => {
            return ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("the run store failed while reading the run ({e}); try again."),
            )
            .into_response();
        }
        Err(e) => {
            return ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e).into_response();
        }
    }
    let poller = Poller {
        shared,
        id,
        seen: Seen::default(),
        pending: VecDeque::new(),
        first: true,
        ended: false,
    };
    let events = futures_util::stream::unfold(poller, Poller::next);
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response()
}
