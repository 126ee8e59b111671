//! HTTP-level metrics of the gateway (`tollgate_http_*`), rendered after the limiter's own
//! families on `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Response counts by status code and upstream failures by kind.
pub struct HttpMetrics {
    by_status: Vec<AtomicU64>,
    upstream: [AtomicU64; UpstreamError::ALL.len()],
}

/// Why a proxied request got no answer from the upstream: the `kind` label of
/// `tollgate_http_upstream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection to the upstream (refused, unreachable): a 502.
    Connect,
    /// Connected, but the exchange broke before a response head arrived: a 502.
    Response,
    /// No response head within `upstream_timeout`: a 504.
    Timeout,
}

impl UpstreamError {
    /// Every kind, in metric order.
    pub const ALL: [UpstreamError; 3] = [
        UpstreamError::Connect,
        UpstreamError::Response,
        UpstreamError::Timeout,
    ];

    /// The metric label (and the log field).
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Response => "response",
            UpstreamError::Timeout => "timeout",
        }
    }
}

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

    /// Counts one upstream failure.
    pub fn upstream_error(&self, kind: UpstreamError) {
        self.upstream[kind as usize].fetch_add(1, Ordering::Relaxed);
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
        for (kind, c) in UpstreamError::ALL.iter().zip(&self.upstream) {
            let _ = writeln!(
                out,
                "tollgate_http_upstream_errors_total{{kind=\"{}\"}} {}",
                kind.as_str(),
                c.load(Ordering::Relaxed)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_upstream_error_counts_under_its_own_label() {
        let m = HttpMetrics::default();
        m.upstream_error(UpstreamError::Timeout);
        m.upstream_error(UpstreamError::Timeout);
        m.upstream_error(UpstreamError::Connect);
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("tollgate_http_upstream_errors_total{kind=\"connect\"} 1\n"));
        assert!(out.contains("tollgate_http_upstream_errors_total{kind=\"response\"} 0\n"));
        assert!(out.contains("tollgate_http_upstream_errors_total{kind=\"timeout\"} 2\n"));
    }
}
