//! The web page of `docsfab serve` (GET /), the token page answered with a 401, and the
//! OpenAPI description served at /api/openapi.json.
//!
//! Both pages are static files beside this module with one inline `<style>` and one inline
//! `<script>`; the page draws runs from the JSON API with `textContent` only. The
//! Content-Security-Policy allows exactly those inline blocks by their SHA-256 hashes, so no
//! injected markup could run a script even if some text slipped through as HTML. The policy is
//! in each page as a `<meta>` element (it holds whatever the server sends) and `index` also
//! sends it as a header, where `frame-ancestors` works.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use sha2::{Digest as _, Sha256};

const PAGE_TEMPLATE: &str = include_str!("page.html");
const LOGIN_TEMPLATE: &str = include_str!("login.html");
/// Where each template takes its policy.
const CSP_SLOT: &str = "{{CSP}}";

/// OpenAPI 3.1 description of the HTTP API.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// GET /: the page, with its Content-Security-Policy and no caching (it is small, and a stale
/// copy would talk to a changed API).
pub async fn index() -> Response {
    (headers(), Html(page())).into_response()
}

/// The page that asks for the access token; the server answers GET / with it and status 401.
/// It never shows the token: the script moves the field's value into the `docsfab_token`
/// cookie and reloads.
pub fn login() -> String {
    static LOGIN: OnceLock<String> = OnceLock::new();
    LOGIN
        .get_or_init(|| LOGIN_TEMPLATE.replace(CSP_SLOT, &policy(false)))
        .clone()
}

/// The Content-Security-Policy header value for both pages (the login page too, if the server
/// sends a header with it).
pub fn csp() -> String {
    policy(true)
}

/// Headers for a response carrying either page.
pub fn headers() -> [(header::HeaderName, String); 4] {
    [
        (header::CONTENT_SECURITY_POLICY, csp()),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
        (header::REFERRER_POLICY, "no-referrer".to_owned()),
        (header::CACHE_CONTROL, "no-store".to_owned()),
    ]
}

fn page() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| PAGE_TEMPLATE.replace(CSP_SLOT, &policy(false)))
}

/// The policy: nothing but the pages' own inline blocks and same-origin fetches. A `<meta>`
/// policy may not carry `frame-ancestors` (browsers ignore it there with a console error).
fn policy(for_header: bool) -> String {
    let scripts = hashes(&[PAGE_TEMPLATE, LOGIN_TEMPLATE], "script");
    let styles = hashes(&[PAGE_TEMPLATE, LOGIN_TEMPLATE], "style");
    let mut text = format!(
        "default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'"
    );
    if for_header {
        text.push_str("; frame-ancestors 'none'");
    }
    text
}

/// `'sha256-...'` of every `<tag>...</tag>` block (attribute-less opening tag) in `pages`.
fn hashes(pages: &[&str], tag: &str) -> String {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut out = Vec::new();
    for page in pages {
        let mut rest = *page;
        while let Some(start) = rest.find(&open) {
            let body_start = start + open.len();
            let Some(len) = rest[body_start..].find(&close) else {
                break;
            };
            let body = &rest[body_start..body_start + len];
            out.push(format!(
                "'sha256-{}'",
                base64(&Sha256::digest(body.as_bytes()))
            ));
            rest = &rest[body_start + len + close.len()..];
        }
    }
    out.join(" ")
}

/// Standard base64 with padding, as CSP hash sources are written.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The routes `docs/serve.md` and the issue's fixed names list (interfaces.md, "Serve API").
    const ROUTES: &[(&str, &str)] = &[
        ("post", "/api/runs"),
        ("get", "/api/runs"),
        ("get", "/api/runs/{id}"),
        ("get", "/api/runs/{id}/events"),
        ("post", "/api/runs/{id}/cancel"),
        ("post", "/api/runs/{id}/rerun"),
        ("post", "/api/runs/{id}/resume"),
        ("get", "/api/runs/{id}/diff"),
        ("get", "/api/runs/{id}/report"),
        ("get", "/api/openapi.json"),
        ("get", "/healthz"),
        ("get", "/metrics"),
        ("get", "/"),
    ];

    fn openapi() -> Value {
        serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
    }

    #[test]
    fn issue15_openapi_describes_every_serve_route() {
        let doc = openapi();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."));
        let paths = doc["paths"].as_object().unwrap();
        for (method, path) in ROUTES {
            let op = &paths
                .get(*path)
                .unwrap_or_else(|| panic!("openapi.json has no path {path}"))[*method];
            assert!(op.is_object(), "openapi.json has no {method} {path}");
            assert!(
                op["operationId"].is_string(),
                "{method} {path}: operationId"
            );
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path}: responses"
            );
        }
        // Nothing documented that the server does not have.
        let documented: usize = paths
            .values()
            .map(|item| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .filter(|k| ["get", "post", "put", "delete", "patch"].contains(&k.as_str()))
                    .count()
            })
            .sum();
        assert_eq!(documented, ROUTES.len());
    }

    #[test]
    fn issue15_openapi_every_ref_resolves_and_errors_share_one_schema() {
        let doc = openapi();
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for r in &refs {
            let pointer = r
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("external $ref {r}"));
            assert!(
                doc.pointer(pointer).is_some(),
                "$ref {r} resolves to nothing"
            );
        }
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
        let error = &doc["components"]["schemas"]["Error"];
        assert_eq!(error["required"][0], "error");
        // Every 4xx answer of the API is the one-sentence error object.
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let Some(responses) = op["responses"].as_object() else {
                    continue;
                };
                for (code, response) in responses {
                    // GET / answers its 401 with the token page, not JSON.
                    if !code.starts_with('4') || path == "/" {
                        continue;
                    }
                    let response = resolve(&doc, response);
                    let schema = &response["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(
                        schema, "#/components/schemas/Error",
                        "{method} {path} {code}"
                    );
                }
            }
        }
        // POST bodies are capped at 1 MiB: the submit documents its 413.
        assert!(doc["paths"]["/api/runs"]["post"]["responses"]["413"].is_object());
    }

    fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
        match value["$ref"].as_str() {
            Some(r) => doc.pointer(&r[1..]).unwrap(),
            None => value,
        }
    }

    fn collect_refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    if k == "$ref" {
                        out.push(v.as_str().unwrap().to_owned());
                    } else {
                        collect_refs(v, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn issue15_docs_serve_md_lists_every_route() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/serve.md");
        let doc = std::fs::read_to_string(path).unwrap();
        for (method, route) in ROUTES {
            let row = format!("| `{} {route}", method.to_uppercase());
            assert!(doc.contains(&row), "docs/serve.md has no table row {row}");
        }
    }

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }

    #[test]
    fn issue15_policy_allows_exactly_the_pages_inline_blocks() {
        let header = csp();
        // One script and one style per page, each allowed by its hash and nothing broader.
        assert_eq!(header.matches("'sha256-").count(), 4, "{header}");
        assert!(!header.contains("unsafe-inline") && !header.contains("unsafe-eval"));
        assert!(header.starts_with("default-src 'none';"));
        assert!(header.ends_with("frame-ancestors 'none'"));
        // The empty-body hash would mean the extraction found an empty block.
        assert!(!header.contains("47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="));
        for page in [page().to_owned(), login()] {
            assert!(!page.contains(CSP_SLOT));
            assert!(page.contains("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'sha256-"));
            assert!(
                !page.contains("frame-ancestors"),
                "ignored in a meta policy"
            );
        }
    }

    #[test]
    fn issue15_pages_load_nothing_external_and_insert_text_only() {
        for page in [PAGE_TEMPLATE, LOGIN_TEMPLATE] {
            for banned in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                " style=\"",
                " onclick=",
                " onload=",
                "src=\"http",
                "href=\"http",
                "<script src",
                "<link",
            ] {
                assert!(!page.contains(banned), "a page contains {banned:?}");
            }
            assert_eq!(page.matches("<script>").count(), 1);
            assert_eq!(page.matches("<style>").count(), 1);
        }
    }

    #[test]
    fn issue15_every_form_field_has_a_label() {
        for page in [PAGE_TEMPLATE, LOGIN_TEMPLATE] {
            for tag in ["<input", "<textarea", "<select"] {
                for (at, _) in page.match_indices(tag) {
                    let end = at + page[at..].find('>').unwrap();
                    let element = &page[at..end];
                    let id = element
                        .split("id=\"")
                        .nth(1)
                        .and_then(|rest| rest.split('"').next())
                        .unwrap_or_else(|| panic!("a field without an id: {element}"));
                    assert!(
                        page.contains(&format!("<label for=\"{id}\""))
                            || page.contains(&format!("for=\"{id}\">")),
                        "field {id} has no label"
                    );
                }
            }
        }
    }

    #[test]
    fn issue15_login_page_never_prefills_or_echoes_a_token() {
        let page = login();
        assert!(page.contains("type=\"password\" id=\"token\""));
        assert!(!page.contains("value=\""));
        assert!(page.contains("docsfab_token=\" + value + \"; Path=/; SameSite=Strict"));
    }
}
