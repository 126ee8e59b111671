//! The admin server: `/metrics` (Prometheus text), `/healthz` (the process is up) and
//! `/readyz` (the store answers and the breaker is closed). Keep it on a private address.

use crate::http_util::{status_response, text_response, BoxBody};
use crate::metrics::HttpMetrics;
use http::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use tollgate::Limiter;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct Admin {
    /// The limiter (its metrics and readiness).
    pub limiter: Limiter,
    /// The gateway's HTTP metrics.
    pub http: Arc<HttpMetrics>,
}

impl Admin {
    /// Answers one admin request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<BoxBody> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return status_response(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        }
        match req.uri().path() {
            "/metrics" => {
                let mut out = String::with_capacity(8 * 1024);
                self.limiter.render_metrics(&mut out);
                self.http.render(&mut out);
                text_response(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    out,
                )
            }
            "/healthz" => status_response(StatusCode::OK, "ok\n"),
            "/readyz" => {
                if self.limiter.ready().await {
                    status_response(StatusCode::OK, "ready\n")
                } else {
                    status_response(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
                }
            }
            _ => status_response(
                StatusCode::NOT_FOUND,
                "not found; try /metrics, /healthz or /readyz\n",
            ),
        }
    }
}
