//! The status page at `/`: one HTML page, its script and its style sheet, embedded in
//! the binary (no build step, nothing to install beside the gateway).
//!
//! The page holds no data: it reads `GET /v1/dashboard`, `GET /v1/jobs` and `GET
//! /v1/jobs/{id}` from the browser, with the gateway's token when it has one (asked
//! for once and kept in the tab's session storage), so its three files are served
//! without a token. Everything a job produced (model text, tool output) is put on the
//! page as text, never as HTML, and the content security policy allows no script but
//! the page's own: an agent's output cannot run code in an operator's browser.

use axum::http::header;
use axum::response::IntoResponse;

/// The page's paths (served without a token: they hold no data).
pub const PATHS: [&str; 3] = ["/", "/ui/app.js", "/ui/app.css"];

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/app.css");

/// Only the page's own script and style, data from this origin, nothing framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// `GET /`: the page.
pub async fn index() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/app.js`: its script.
pub async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/app.css`: its style sheet.
pub async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE)
}
