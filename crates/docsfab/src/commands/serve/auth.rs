//! The bearer token: read once at startup from the variable `--token-env` names, then required
//! on every request (header or cookie), compared in constant time. The token never appears in
//! a log line, a page or an error.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse as _, Response};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::reply::error_response;
use crate::app::error::CliError;

/// The cookie the web page stores the token in.
pub const COOKIE: &str = "docsfab_token";

/// The expected token, kept as its SHA-256: comparing digests takes the same time whatever the
/// presented token's length or content.
pub struct Token {
    digest: [u8; 32],
}

impl Token {
    fn new(text: &str) -> Token {
        Token {
            digest: Sha256::digest(text.as_bytes()).into(),
        }
    }

    pub fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        bool::from(self.digest.ct_eq(&digest))
    }
}

/// The token from `var`; `None` when no variable is named. A named variable that is unset or
/// empty is bad input (the message names the variable, never a value).
pub fn read_token(var: Option<&str>) -> Result<Option<Token>, CliError> {
    let Some(var) = var else { return Ok(None) };
    match std::env::var(var) {
        Ok(t) if !t.trim().is_empty() => Ok(Some(Token::new(t.trim()))),
        Ok(_) | Err(std::env::VarError::NotPresent) => Err(CliError::bad_input(format!(
            "--token-env names the environment variable {var}, which is not set (or empty); export {var} with the token clients will send, then start docsfab serve again."
        ))),
        Err(std::env::VarError::NotUnicode(_)) => Err(CliError::bad_input(format!(
            "--token-env names the environment variable {var}, which is not valid UTF-8; set {var} to the token as plain text."
        ))),
    }
}

/// The tokens a request presents: `Authorization: Bearer T` and every `docsfab_token` cookie.
fn presented(headers: &HeaderMap) -> Vec<&str> {
    let bearer = headers
        .get_all(header::AUTHORIZATION)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let cookies = headers
        .get_all(header::COOKIE)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name.trim() == COOKIE).then(|| value.trim())
        });
    bearer.chain(cookies).collect()
}

/// Refuses what a browser sends on behalf of another site: a request whose `Origin` is not this
/// server's own (`http://` + its `Host`), or that the browser marks `Sec-Fetch-Site:
/// cross-site`; and, when no token guards the server, a `Host` that is not a loopback name, so
/// a page that rebinds its own domain name to 127.0.0.1 cannot read the API. Without this, any
/// page open in the operator's browser could queue or cancel runs on a loopback server.
pub async fn same_site(
    State(token): State<Option<Arc<Token>>>,
    req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let host = text(header::HOST).unwrap_or("");
    // A person following a link from another site (a wiki, a chat) to a report is a top-level
    // GET navigation: it changes nothing and its answer goes to that person, not to the other
    // site's script, so it is let through. Everything else from another site is refused.
    let navigation = req.method() == axum::http::Method::GET
        && text(header::HeaderName::from_static("sec-fetch-mode")) == Some("navigate");
    let cross_site = !navigation
        && text(header::HeaderName::from_static("sec-fetch-site")) == Some("cross-site");
    let foreign_origin = text(header::ORIGIN)
        .is_some_and(|origin| !origin.eq_ignore_ascii_case(&format!("http://{host}")));
    if cross_site || foreign_origin {
        return error_response(
            StatusCode::FORBIDDEN,
            "this request comes from another site, which docsfab serve does not accept; use the server's own page or a client that sends no foreign Origin.",
        );
    }
    if token.is_none() && !is_loopback_host(host) {
        return error_response(
            StatusCode::FORBIDDEN,
            "this server has no token, so it answers only requests addressed to a loopback host (127.0.0.1, [::1], localhost); use one, or start it with --token-env.",
        );
    }
    next.run(req).await
}

/// `127.0.0.1:8700`, `[::1]:8700`, `localhost:8700` (port optional).
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Lets the request through when no token is configured or it presents the token; else 401
/// (the token page for `GET /`, one JSON sentence for everything else).
pub async fn require(
    State(token): State<Option<Arc<Token>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = token else {
        return next.run(req).await;
    };
    if presented(req.headers())
        .into_iter()
        .any(|t| token.matches(t))
    {
        return next.run(req).await;
    }
    let challenge = [(header::WWW_AUTHENTICATE, "Bearer")];
    if req.method() == Method::GET && req.uri().path() == "/" {
        return (
            StatusCode::UNAUTHORIZED,
            challenge,
            super::page::headers(),
            Html(super::page::login()),
        )
            .into_response();
    }
    let mut response = error_response(
        StatusCode::UNAUTHORIZED,
        "this server needs its access token: send it as Authorization: Bearer TOKEN or in the docsfab_token cookie.",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue15_loopback_hosts_are_told_from_rebound_names() {
        for ok in [
            "127.0.0.1:8700",
            "127.0.0.1",
            "[::1]:80",
            "localhost:1",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8700",
            "",
            "10.0.0.1:80",
            "[::2]:1",
            "127.0.0.1.evil.example",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn issue15_token_is_found_in_header_or_cookie_and_compared_whole() {
        let token = Token::new("s3cret-token");
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            "Bearer s3cret-token".parse().unwrap(),
        );
        assert!(presented(&h).into_iter().any(|t| token.matches(t)));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=b; docsfab_token=s3cret-token".parse().unwrap(),
        );
        assert!(presented(&h).into_iter().any(|t| token.matches(t)));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer s3cret-toke".parse().unwrap());
        h.insert(
            header::COOKIE,
            "docsfab_tokenx=s3cret-token".parse().unwrap(),
        );
        assert!(!presented(&h).into_iter().any(|t| token.matches(t)));
    }
}
