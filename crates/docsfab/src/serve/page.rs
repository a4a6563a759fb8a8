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

/// Headers for a response carrying either page.
pub fn headers() -> [(axum::http::header::HeaderName, String); 4] {
    use axum::http::header;
    [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; frame-ancestors 'none'".to_owned(),
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
        (header::REFERRER_POLICY, "no-referrer".to_owned()),
        (header::CACHE_CONTROL, "no-store".to_owned()),
    ]
}
