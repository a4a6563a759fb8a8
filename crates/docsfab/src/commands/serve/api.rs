//! The HTTP API of `docsfab serve` (docs/serve.md): JSON in and out, every error one sentence as
//! `{"error": "..."}`. Handlers reach the store through the job service's `with_store`, on a
//! blocking thread; what they queue, the job runner of `crate::app::jobs` claims.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use docsfab_record::RunStatus;
use docsfab_route::http_server::{BodyRefusal, read_body};
use docsfab_runtime::store::{CancelRequest, JobWorkspace, ResumeMode, RunListing, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Token;
use super::reply::{ApiError, error_response};
use super::state::Shared;
use crate::app::carry::ResumeFlags;

/// The largest request body accepted (a composition is a small YAML file).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The most runs one listing returns.
const MAX_LIMIT: u32 = 1000;
const DEFAULT_LIMIT: u32 = 50;

pub fn router(shared: Arc<Shared>, token: Option<Arc<Token>>) -> Router {
    Router::new()
        .route("/", get(super::page::index))
        .route("/api/openapi.json", get(openapi))
        .route("/api/runs", post(submit).get(list))
        .route("/api/runs/{id}", get(show))
        .route("/api/runs/{id}/events", get(super::events::stream))
        .route("/api/runs/{id}/cancel", post(cancel))
        .route("/api/runs/{id}/rerun", post(rerun))
        .route("/api/runs/{id}/resume", post(resume))
        .route("/api/runs/{id}/diff", get(diff))
        .route("/api/runs/{id}/report", get(report))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            token.clone(),
            super::auth::require,
        ))
        // Outermost: a foreign site's request is refused before anything else.
        .layer(axum::middleware::from_fn_with_state(
            token,
            super::auth::same_site,
        ))
        .with_state(shared)
}

/// A store failure in words, naming what was being done.
fn store_failed(doing: &str, e: &StoreError) -> ApiError {
    ApiError::internal(format!(
        "the run store failed while {doing} ({e}); try again, and check the server's store if it persists."
    ))
}

type ApiResult = Result<Response, ApiError>;

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "no such endpoint; see GET /api/openapi.json for the API.",
    )
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::page::OPENAPI_JSON,
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Submission {
    composition: String,
    workspace: SubmittedWorkspace,
    /// `auto`: another worker resumes the run, once, if its worker dies (docs/resume.md).
    #[serde(default)]
    resume: Option<ResumeMode>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SubmittedWorkspace {
    Path {
        path: String,
    },
    Git {
        git: String,
        #[serde(rename = "ref")]
        reference: String,
    },
}

const SUBMISSION_SHAPE: &str = "send {\"composition\": \"<YAML text>\", \"workspace\": {\"path\": \"DIR\"}} or a workspace {\"git\": \"URL\", \"ref\": \"REF\"}";

/// `POST /api/runs`: checked like `docsfab run` checks its inputs, then queued.
async fn submit(State(shared): State<Arc<Shared>>, req: Request) -> ApiResult {
    // Only JSON: a browser may send text/plain across sites without asking first.
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a run submission must be sent with Content-Type: application/json.",
        ));
    }
    let body = read_capped(&shared, req.into_body()).await?;
    let submission: Submission = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the request body is not a run submission ({}); {SUBMISSION_SHAPE}.",
                crate::app::error::plain_reason(&e.to_string(), "not JSON")
            ),
        )
    })?;
    let workspace = match submission.workspace {
        SubmittedWorkspace::Path { path } => JobWorkspace::Path { path },
        SubmittedWorkspace::Git { git, reference } => JobWorkspace::Git { git, reference },
    };
    let home = shared.service.home.clone();
    let root = shared.service.workspace_root.clone();
    let yaml = submission.composition;
    let mut spec = tokio::task::spawn_blocking(move || {
        crate::app::jobs::submit::check(&home, root.as_deref(), &yaml, workspace)
    })
    .await
    .map_err(ApiError::internal)??;
    spec.resume = submission.resume;
    let run_id = shared
        .service
        .with_store(move |s| s.enqueue(&spec))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| store_failed("queueing the run", &e))?;
    shared.service.wake.notify_one();
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({ "runId": run_id, "status": "queued" })),
    )
        .into_response())
}

/// The body, at most [`MAX_BODY_BYTES`], within the body timeout.
async fn read_capped(shared: &Shared, body: Body) -> Result<axum::body::Bytes, ApiError> {
    read_body(body, MAX_BODY_BYTES, shared.body_timeout, &shared.stopping)
        .await
        .map_err(|refusal| match refusal {
            BodyRefusal::TooLarge { limit } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body is larger than {limit} bytes; submit a smaller composition."
                ),
            ),
            BodyRefusal::TooSlow { timeout } => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} ms; send it at once.",
                    timeout.as_millis()
                ),
            ),
            BodyRefusal::Cancelled => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is stopping; submit the run to another server or try again later.",
            ),
            BodyRefusal::Broken => ApiError::new(
                StatusCode::BAD_REQUEST,
                "the request body could not be read; send it again.",
            ),
        })
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    status: Option<String>,
    limit: Option<String>,
}

/// A status as records spell it.
fn parse_status(text: &str) -> Option<RunStatus> {
    serde_json::from_value(Value::String(text.to_owned())).ok()
}

/// `GET /api/runs?status=S&limit=N`, newest first.
async fn list(State(shared): State<Arc<Shared>>, Query(q): Query<ListQuery>) -> ApiResult {
    let status = match q.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(parse_status(s).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("{s:?} is not a run status; use queued, running, succeeded, failed, cancelled or interrupted."),
            )
        })?),
    };
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "limit {l:?} is not a number from 1 to {MAX_LIMIT}; pass e.g. limit=50."
                    ),
                )
            })?,
    };
    let rows = shared
        .service
        .with_store(move |s| s.list_run_rows_where(status, limit))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| store_failed("listing runs", &e))?;
    let runs: Vec<Value> = rows.iter().map(listing_json).collect();
    Ok(axum::Json(json!({ "runs": runs })).into_response())
}

fn listing_json(row: &RunListing) -> Value {
    let s = &row.summary;
    json!({
        "runId": s.run_id,
        "composition": s.composition,
        "status": s.status.as_str(),
        "startedAt": s.started_at,
        "endedAt": s.ended_at,
        "steps": row.steps,
        "attempts": row.attempts,
        "durationMs": row.duration_ms,
        "resumedFrom": s.resumed_from.as_ref().map(|l| l.run_id.as_str()),
    })
}

/// The run's record, or 404.
async fn record_of(shared: &Arc<Shared>, id: &str) -> Result<docsfab_record::RunRecord, ApiError> {
    let key = id.to_owned();
    shared
        .service
        .with_store(move |s| s.load_run(&key))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| store_failed("reading the run", &e))?
        .ok_or_else(|| ApiError::unknown_run(id))
}

/// `GET /api/runs/{id}`: exactly `docsfab runs show ID --json`.
async fn show(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult {
    let record = record_of(&shared, &id).await?;
    let text = crate::app::print::to_json(&record)?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        format!("{text}\n"),
    )
        .into_response())
}

/// `POST /api/runs/{id}/cancel`.
async fn cancel(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult {
    let key = id.clone();
    let done = shared
        .service
        .with_store(move |s| {
            let done = s.request_cancel(&key)?;
            let status = s.load_run(&key)?.map(|r| r.status);
            Ok::<_, StoreError>((done, status))
        })
        .await
        .map_err(ApiError::internal)?;
    let (done, status) = match done {
        Ok(d) => d,
        Err(StoreError::UnknownRun(_)) => return Err(ApiError::unknown_run(&id)),
        Err(e) => return Err(store_failed("cancelling the run", &e)),
    };
    let outcome = match done {
        CancelRequest::CancelledQueued => "cancelled",
        CancelRequest::Requested => "requested",
        CancelRequest::AlreadyEnded(_) => "already-ended",
    };
    let status = status.map(RunStatus::as_str);
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({ "runId": id, "outcome": outcome, "status": status })),
    )
        .into_response())
}

/// `POST /api/runs/{id}/rerun`: a new queued run with the same spec.
async fn rerun(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult {
    let key = id.clone();
    let queued = shared
        .service
        .with_store(move |s| {
            if s.load_run(&key)?.is_none() {
                return Ok(Err(false));
            }
            match s.job_spec(&key)? {
                Some(spec) => s.enqueue(&spec).map(Ok),
                None => Ok(Err(true)),
            }
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| store_failed("queueing the run again", &e))?;
    match queued {
        Ok(run_id) => {
            shared.service.wake.notify_one();
            Ok((
                StatusCode::ACCEPTED,
                axum::Json(json!({ "runId": run_id, "status": "queued", "rerunOf": id })),
            )
                .into_response())
        }
        Err(false) => Err(ApiError::unknown_run(&id)),
        Err(true) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "run {id} keeps no composition (it was recorded before docsfab kept them), so there is nothing to run again; submit its composition with POST /api/runs."
            ),
        )),
    }
}

/// The flags of `POST /api/runs/{id}/resume`, as `docsfab runs resume` has them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResumeQuery {
    #[serde(default)]
    rerun_changed: bool,
    #[serde(default)]
    accept_workspace: bool,
}

/// `POST /api/runs/{id}/resume[?rerunChanged=true&acceptWorkspace=true]`: queues a new run that
/// carries over the finished steps of run `id`, refused as `docsfab runs resume` refuses.
async fn resume(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<ResumeQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let axum::extract::Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the resume's query is not understood ({}); pass rerunChanged=true and acceptWorkspace=true, or nothing.",
                crate::app::error::plain_reason(&e.body_text(), "bad query")
            ),
        )
    })?;
    let flags = ResumeFlags {
        rerun_changed: query.rerun_changed,
        accept_workspace: query.accept_workspace,
    };
    let root = shared.service.workspace_root.clone();
    let key = id.clone();
    let queued = shared
        .service
        .with_store(move |s| crate::app::jobs::resume::queue(s, &key, flags, root.as_deref()))
        .await
        .map_err(ApiError::internal)??;
    shared.service.wake.notify_one();
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({ "runId": queued, "status": "queued", "resumeOf": id })),
    )
        .into_response())
}

/// `GET /api/runs/{id}/diff`: what the run wrote, as `docsfab runs diff` prints it.
async fn diff(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult {
    let (record, rows) = record_and_writes(&shared, &id).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        crate::app::diff::render(&record, &rows, false),
    )
        .into_response())
}

/// `GET /api/runs/{id}/report`: the HTML timeline of `runs show --html`.
async fn report(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult {
    let (record, rows) = record_and_writes(&shared, &id).await?;
    let page = crate::app::report::render(&record, &crate::app::diff::per_file(&rows))?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        page,
    )
        .into_response())
}

async fn record_and_writes(
    shared: &Arc<Shared>,
    id: &str,
) -> Result<
    (
        docsfab_record::RunRecord,
        Vec<docsfab_runtime::written::StoredWrite>,
    ),
    ApiError,
> {
    let key = id.to_owned();
    let (record, rows) = shared
        .service
        .with_store(move |s| {
            let record = s.load_run(&key)?;
            let rows = match record {
                Some(_) => s.written_files(&key)?,
                None => Vec::new(),
            };
            Ok::<_, StoreError>((record, rows))
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| store_failed("reading the run", &e))?;
    let record = record.ok_or_else(|| ApiError::unknown_run(id))?;
    Ok((record, rows))
}

/// `GET /healthz`: 200 while serving with a reachable store, 503 while draining or when the
/// store fails.
async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.service.draining.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "draining" })),
        )
            .into_response();
    }
    match shared.service.with_store(|s| s.count_by_status()).await {
        Ok(Ok(_)) => axum::Json(json!({ "status": "ok" })).into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "store-failed", "error": format!("the run store cannot be read ({e}).") })),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "store-failed", "error": e })),
        )
            .into_response(),
    }
}

/// `GET /metrics`.
async fn metrics(State(shared): State<Arc<Shared>>) -> ApiResult {
    let counts = shared
        .service
        .with_store(|s| s.count_by_status())
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| store_failed("counting runs", &e))?;
    let text = crate::app::jobs::metrics::render(
        &counts,
        shared.service.running_here.load(Ordering::SeqCst),
        &shared.service.metrics,
    );
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
