//! HTTP-level metrics of the gateway (`tollgate_http_*`), rendered after the limiter's own
//! families on `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Response counts by status code and upstream failures by kind.
pub struct HttpMetrics {
    by_status: Vec<AtomicU64>,
    upstream: [AtomicU64; 3],
}

const UPSTREAM_KINDS: [&str; 3] = ["connect", "response", "timeout"];

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            by_status: (0..600).map(|_| AtomicU64::new(0)).collect(),
            upstream: Default::default(),
        }
    }
}

impl HttpMetrics {
    /// Counts one response.
    pub fn response(&self, status: u16) {
        if let Some(c) = self.by_status.get(usize::from(status)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Responses sent with `status` so far.
    pub fn count(&self, status: u16) -> u64 {
        self.by_status
            .get(usize::from(status))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Counts one upstream failure (`connect`, `response` or `timeout`).
    pub fn upstream_error(&self, kind: &str) {
        if let Some(i) = UPSTREAM_KINDS.iter().position(|k| *k == kind) {
            self.upstream[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Appends the Prometheus text of both families.
    pub fn render(&self, out: &mut String) {
        out.push_str(
            "# HELP tollgate_http_responses_total Responses sent by the gateway, by status code.\n",
        );
        out.push_str("# TYPE tollgate_http_responses_total counter\n");
        for (code, c) in self.by_status.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                let _ = writeln!(out, "tollgate_http_responses_total{{code=\"{code}\"}} {n}");
            }
        }
        out.push_str(
            "# HELP tollgate_http_upstream_errors_total Failed upstream requests, by kind.\n",
        );
        out.push_str("# TYPE tollgate_http_upstream_errors_total counter\n");
        for (kind, c) in UPSTREAM_KINDS.iter().zip(&self.upstream) {
            let _ = writeln!(
                out,
                "tollgate_http_upstream_errors_total{{kind=\"{kind}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
    }
}
