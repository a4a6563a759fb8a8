//! Placeholder for the web page of `docsfab serve` (h15-web writes the real one; the lead keeps
//! theirs at merge). Only the items `serve` mounts.

use axum::response::{Html, IntoResponse as _, Response};

/// OpenAPI description of the HTTP API.
pub const OPENAPI_JSON: &str = "{\"openapi\": \"3.1.0\", \"info\": {\"title\": \"docsfab serve\", \"version\": \"0\"}, \"paths\": {}}";

/// GET /: the page.
pub async fn index() -> Response {
    Html("<!doctype html><title>docsfab serve</title><p>docsfab serve</p>").into_response()
}

/// The page answered with a 401: asks for the token.
pub fn login() -> String {
    "<!doctype html><title>docsfab serve: token</title><p>This server needs its access token.</p>"
        .to_owned()
}
