//! The admin server: `/metrics` (Prometheus text), `/healthz` (the process is up),
//! `/readyz` (the store answers and the breaker is closed) and the status page: `/` with its
//! `status.css` and `status.js`, drawing `/status.json`. Keep it on a private address.
//!
//! The page's files are compiled into the binary and served with a content security policy
//! that allows nothing but this server: no CDN, no external font, no inline script.
//!
//! Under `/v1/`, the admin API (see the `api` module), behind `[server] admin_token`.

pub(crate) mod api;
pub mod status;

use crate::admin::status::History;
use crate::http::util::{problem_response, status_response, text_response, BoxBody};
use crate::live::Live;
use http::header::{HeaderName, HeaderValue, ALLOW, CACHE_CONTROL};
use http::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use tollgate_tower::{Problem, ProblemKind};

const PAGE_HTML: &str = include_str!("status/page.html");
const PAGE_CSS: &str = include_str!("status/page.css");
const PAGE_JS: &str = include_str!("status/page.js");

/// What a 404 on the admin port suggests.
const PATHS: &str = "try /, /status.json, /metrics, /healthz, /readyz or the admin API under /v1/";

/// Only this server: the page's own stylesheet, script and JSON; SVG built by the script.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// What the admin endpoints read.
#[derive(Clone)]
pub struct Admin {
    /// Once-a-second readings of the limiter's counters, for the status page's rates.
    pub history: Arc<History>,
    /// The serving config, its limiter (metrics, readiness) and the gateway's HTTP metrics;
    /// the admin API under `/v1/` and reloads.
    pub live: Arc<Live>,
}

impl Admin {
    /// Answers one admin request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<BoxBody> {
        if req.uri().path().starts_with("/v1/") {
            return crate::admin::api::handle(&self.live, &req).await;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut resp = problem_response(
                Problem::new(ProblemKind::MethodNotAllowed).detail("use GET or HEAD"),
            );
            resp.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return resp;
        }
        match req.uri().path() {
            "/metrics" => {
                let mut out = String::with_capacity(8 * 1024);
                self.live.limiter().render_metrics(&mut out);
                self.live.http().render(&mut out);
                self.live.render_metrics(&mut out);
                crate::telemetry::render_metrics(&mut out);
                text_response(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    out,
                )
            }
            "/" => page("text/html; charset=utf-8", PAGE_HTML),
            "/status.css" => page("text/css; charset=utf-8", PAGE_CSS),
            "/status.js" => page("text/javascript; charset=utf-8", PAGE_JS),
            "/status.json" => {
                let status =
                    self.history
                        .status(self.live.limiter(), self.live.http(), self.live.status());
                match serde_json::to_string(&status) {
                    Ok(json) => no_store(text_response(StatusCode::OK, "application/json", json)),
                    Err(e) => internal(&e),
                }
            }
            "/healthz" => status_response(StatusCode::OK, "ok\n"),
            "/readyz" => {
                if self.live.limiter().ready().await {
                    status_response(StatusCode::OK, "ready\n")
                } else {
                    status_response(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
                }
            }
            _ => problem_response(Problem::new(ProblemKind::NotFound).detail(PATHS)),
        }
    }
}

/// The status page's data could not be encoded: tollgate's fault, a 500.
fn internal(e: &serde_json::Error) -> Response<BoxBody> {
    problem_response(
        Problem::new(ProblemKind::Internal).detail(format!("the status could not be encoded: {e}")),
    )
}

/// One of the page's files, with the headers that keep it to itself.
fn page(content_type: &'static str, body: &'static str) -> Response<BoxBody> {
    let mut resp = no_store(text_response(
        StatusCode::OK,
        content_type,
        body.to_string(),
    ));
    let h = resp.headers_mut();
    h.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(CSP),
    );
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// Marks a response as not to be cached (the page and its data change with every release
/// and every second).
fn no_store(mut resp: Response<BoxBody>) -> Response<BoxBody> {
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
