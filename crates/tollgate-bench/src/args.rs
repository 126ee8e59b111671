//! The arguments of `tollgate bench`, checked by clap as they are parsed, so that a wrong
//! value is a usage error (exit 2) naming the flag, the value and what is allowed.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use http::header::HeaderName;
use http::Uri;

use crate::accuracy::Algorithm;
use tollgate_core::duration::parse_duration;

/// The longest run allowed.
const MAX_DURATION: Duration = Duration::from_secs(3_600);
/// The longest request timeout allowed.
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// Arguments of `tollgate bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Gateway URLs (http://), comma-separated; requests go to them round-robin.
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["rls", "store"],
          value_name = "URL[,URL...]",
          value_parser = parse_target)]
    pub target: Vec<Uri>,
    /// Envoy rate limit service endpoints (gRPC `ShouldRateLimit`, `http://HOST:PORT`) to
    /// load instead of HTTP targets.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["target", "store"],
          value_name = "URL[,URL...]",
          value_parser = super::rls::parse_rls_target)]
    pub rls: Vec<Uri>,
    /// `--rls`: the domain of every request.
    #[arg(long, default_value = "bench", value_name = "DOMAIN")]
    pub domain: String,
    /// `--rls`: a descriptor of every request; `{client}` in a value is the virtual
    /// client's key. Repeat the flag for a request of several descriptors, in order.
    #[arg(long, default_value = "client={client}", value_name = "KEY=VALUE[,...]",
          value_parser = super::rls::parse_descriptor)]
    pub descriptor: Vec<super::rls::Descriptor>,
    /// Virtual clients, each with its own identity (1 to 1000000).
    #[arg(long, default_value_t = 10, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub clients: u64,
    /// Requests per second over all clients (open loop); without it, closed loop.
    #[arg(long, value_name = "R", value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// How long to send requests, e.g. "10s", "1m" (at most 1h).
    #[arg(long, default_value = "10s", value_name = "D", value_parser = parse_run_duration)]
    pub duration: Duration,
    /// Write the report as one JSON object to this file.
    #[arg(long, value_name = "F")]
    pub json: Option<PathBuf>,
    /// Draw throughput and latency over time to this SVG file.
    #[arg(long, value_name = "F")]
    pub svg: Option<PathBuf>,
    /// How clients identify: `header:NAME`.
    #[arg(long, default_value = "header:x-api-key", value_name = "SOURCE",
          value_parser = parse_identity)]
    pub identity: HeaderName,
    /// Prefix of the client identities (`PREFIX-0`, `PREFIX-1`, ...); default: unique per run,
    /// so every run starts from fresh limiter state.
    #[arg(long, value_name = "PREFIX")]
    pub key_prefix: Option<String>,
    /// The configured limit per client, for the accuracy report; default: read from the
    /// gateway's RateLimit-Policy header.
    #[arg(long, requires = "period", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// The period of `--limit`, e.g. "1m".
    #[arg(long, requires = "limit", value_name = "D", value_parser = parse_period)]
    pub period: Option<Duration>,
    /// The burst of the limit (default: the limit).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub burst: Option<u64>,
    /// The gateway's algorithm, which decides the accuracy formula.
    #[arg(long, value_enum, default_value_t = Algorithm::TokenBucket)]
    pub algorithm: Algorithm,
    /// Concurrent requests at most (closed loop: the number of workers; 1 to 10000).
    #[arg(long, default_value_t = 16, value_name = "C",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub connections: u64,
    /// Hard bound on the number of requests scheduled.
    #[arg(long, default_value_t = 10_000_000, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_requests: u64,
    /// A request without a complete answer after this counts as a timeout error (at most 5m).
    #[arg(long, default_value = "10s", value_name = "D", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Instead of `--target`: costs known later, measured in process on tollgate's
    /// `Limiter::reserve` against this store (`memory` or a `redis://` URL); needs `--limit`
    /// and `--period`.
    #[arg(
        long,
        conflicts_with = "target",
        requires = "limit",
        value_name = "STORE"
    )]
    pub store: Option<String>,
    /// `--store`: requests each client keeps in flight (1 to 1000).
    #[arg(long, default_value_t = 8, value_name = "C",
          value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub in_flight: u64,
    /// `--store`: the estimate charged on arrival.
    #[arg(long, default_value_t = 10, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub estimate: u64,
    /// `--store`: real costs are uniform in [1, N].
    #[arg(long, default_value_t = 40, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub max_real: u64,
    /// `--store`: each admitted request is held for a uniform time in [0, D] (at most 10s).
    #[arg(long, default_value = "20ms", value_name = "D", value_parser = parse_hold)]
    pub hold: Duration,
    /// `--store`: the seed of the random holds and costs (the same seed, the same traffic).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub seed: u64,
}

/// Parses an absolute `http://` URL; a missing path means `/`.
pub fn parse_target(target: &str) -> Result<Uri, String> {
    let uri: Uri = target
        .trim()
        .parse()
        .map_err(|_| format!("{target:?} is not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err("https is not supported; use the http listener".into()),
        _ => return Err(format!("{target:?}: give an absolute http:// URL")),
    }
    if uri.authority().is_none() {
        return Err(format!("{target:?} has no host"));
    }
    if uri.path_and_query().is_some() {
        return Ok(uri);
    }
    let mut parts = uri.into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    Uri::from_parts(parts).map_err(|e| format!("{target:?}: {e}"))
}

fn duration_within(text: &str, max: Duration, max_text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() || duration > max {
        return Err(format!(
            "{text} is out of range; allowed above 0 up to {max_text}"
        ));
    }
    Ok(duration)
}

fn parse_run_duration(text: &str) -> Result<Duration, String> {
    duration_within(text, MAX_DURATION, "1h")
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    duration_within(text, MAX_TIMEOUT, "5m")
}

fn parse_hold(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration > Duration::from_secs(10) {
        return Err(format!("{text} is out of range; allowed 0 up to 10s"));
    }
    Ok(duration)
}

fn parse_period(text: &str) -> Result<Duration, String> {
    duration_within(text, Duration::MAX, "any length")
}

fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0) {
        return Err(format!(
            "{text} is out of range; allowed above 0 up to 1000000"
        ));
    }
    Ok(rate)
}

fn parse_identity(text: &str) -> Result<HeaderName, String> {
    match text.split_once(':') {
        Some(("header", name)) => HeaderName::try_from(name.trim())
            .map_err(|_| format!("{name:?} is not a valid header name")),
        _ => Err(format!("{text:?} is not supported; use header:NAME")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::Descriptor;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(line: &str) -> Result<BenchArgs, clap::Error> {
        let argv = std::iter::once("bench").chain(line.split_whitespace());
        Wrapper::try_parse_from(argv).map(|wrapper| wrapper.args)
    }

    #[test]
    fn targets_must_be_absolute_http_urls() {
        let uri = parse_target("http://127.0.0.1:8080").expect("valid");
        assert_eq!(uri.to_string(), "http://127.0.0.1:8080/");
        let uri = parse_target("http://127.0.0.1:8080/api/x?y=1").expect("valid");
        assert_eq!(uri.path_and_query().map(|p| p.as_str()), Some("/api/x?y=1"));
        assert!(parse_target("https://example.invalid/").is_err());
        assert!(parse_target("127.0.0.1:8080").is_err());
        assert!(parse_target("/just/a/path").is_err());
    }

    #[test]
    fn defaults_describe_a_ten_second_closed_loop() {
        let args = parse("--target http://127.0.0.1:1/a,http://127.0.0.1:2").expect("valid");
        assert_eq!(args.target.len(), 2);
        assert_eq!(args.clients, 10);
        assert_eq!(args.rate, None);
        assert_eq!(args.duration, Duration::from_secs(10));
        assert_eq!(args.identity.as_str(), "x-api-key");
        assert_eq!(args.connections, 16);
        assert_eq!(args.algorithm, Algorithm::TokenBucket);
    }

    #[test]
    fn each_descriptor_flag_is_one_descriptor_of_the_request() {
        let rls = "--rls http://127.0.0.1:1";
        let one = parse(rls).expect("valid");
        assert_eq!(
            one.descriptor,
            vec![Descriptor(vec![("client".into(), "{client}".into())])]
        );
        let given = parse(&format!("{rls} --descriptor a=1")).expect("valid");
        assert_eq!(
            given.descriptor,
            vec![Descriptor(vec![("a".into(), "1".into())])]
        );
        let three = parse(&format!(
            "{rls} --descriptor d0={{client}} --descriptor t=x,p=/api/v1 --descriptor d2=z"
        ))
        .expect("valid");
        assert_eq!(
            three.descriptor,
            vec![
                Descriptor(vec![("d0".into(), "{client}".into())]),
                Descriptor(vec![
                    ("t".into(), "x".into()),
                    ("p".into(), "/api/v1".into())
                ]),
                Descriptor(vec![("d2".into(), "z".into())]),
            ]
        );
        let error = parse(&format!("{rls} --descriptor a=1 --descriptor nope")).expect_err("bad");
        assert_eq!(error.exit_code(), 2);
    }

    #[test]
    fn out_of_range_values_are_usage_errors() {
        let target = "--target http://127.0.0.1:1/";
        for bad in [
            "--duration 2h",
            "--duration 0s",
            "--clients 0",
            "--rate 0",
            "--rate NaN",
            "--connections 20000",
            "--timeout 1h",
            "--identity ip",
            "--identity header:bad(name",
            "--limit 5",
            "--limit 0 --period 1m",
            "--max-requests 0",
        ] {
            let error = parse(&format!("{target} {bad}")).expect_err(bad);
            assert_eq!(error.exit_code(), 2, "{bad}");
        }
        let error = parse("--target https://127.0.0.1/").expect_err("https");
        assert!(
            error.to_string().contains("https is not supported"),
            "{error}"
        );
    }
}
