//! The shape of every refusal of `docsfab serve`: a status and one sentence, answered as
//! `{"error": "..."}` after the redactor has read it. The router, the token check and the
//! event stream all answer through it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::app::error::ErrorKind;

/// `{"error": message}` with `status`.
pub fn error_response(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// A refusal: its status and one sentence.
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn internal(message: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message.to_string())
    }

    pub fn unknown_run(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("there is no run {id:?} in the store; list runs with GET /api/runs."),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let line = docsfab_boundary::redact::Redactor::default().line(&self.message);
        error_response(self.status, &line)
    }
}

impl From<crate::app::error::CliError> for ApiError {
    fn from(e: crate::app::error::CliError) -> ApiError {
        let status = match e.kind {
            ErrorKind::BadInput => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.message)
    }
}
