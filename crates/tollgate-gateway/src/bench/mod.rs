//! `tollgate bench`: a load generator that checks a rate limiter's accounting.
//!
//! Why a dedicated tool rather than a generic HTTP load generator: a generic one reports how
//! fast the gateway answers, but not whether it admitted what the limit allows. This one
//! drives many virtual clients (distinct API keys or user ids) and compares, per client, what
//! was admitted with what the limit allows over the elapsed time (see `accuracy`).
//!
//! Every run is bounded by `--duration` (at most one hour) and `--max-requests`.

mod accuracy;
mod chart;
mod histogram;
mod load;
mod output;
mod report;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;
use http::header::{HeaderName, HeaderValue};
use http::Uri;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use accuracy::Algorithm;
use accuracy::Limit;
use load::{Live, Plan};

/// The longest run allowed.
const MAX_DURATION: Duration = Duration::from_secs(3_600);

/// Arguments of `tollgate bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Gateway URLs (http://), comma-separated; requests go to them round-robin.
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        value_name = "URL[,URL...]"
    )]
    pub target: Vec<String>,
    /// Virtual clients, each with its own identity.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub clients: usize,
    /// Requests per second over all clients (open loop); without it, closed loop.
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// How long to send requests, e.g. "10s", "1m" (at most 1h).
    #[arg(long, default_value = "10s", value_name = "D")]
    pub duration: String,
    /// Write the report as one JSON object to this file.
    #[arg(long, value_name = "F")]
    pub json: Option<PathBuf>,
    /// Draw throughput and latency over time to this SVG file.
    #[arg(long, value_name = "F")]
    pub svg: Option<PathBuf>,
    /// How clients identify: `header:NAME`.
    #[arg(long, default_value = "header:x-api-key", value_name = "SOURCE")]
    pub identity: String,
    /// Prefix of the client identities (`PREFIX-0`, `PREFIX-1`, ...); default: unique per run,
    /// so every run starts from fresh limiter state.
    #[arg(long, value_name = "PREFIX")]
    pub key_prefix: Option<String>,
    /// The configured limit per client, for the accuracy report; default: read from the
    /// gateway's RateLimit-Policy header.
    #[arg(long, requires = "period", value_name = "N")]
    pub limit: Option<u64>,
    /// The period of `--limit`, e.g. "1m".
    #[arg(long, requires = "limit", value_name = "D")]
    pub period: Option<String>,
    /// The burst of the limit (default: the limit).
    #[arg(long, value_name = "N")]
    pub burst: Option<u64>,
    /// The gateway's algorithm, which decides the accuracy formula.
    #[arg(long, value_enum, default_value_t = Algorithm::TokenBucket)]
    pub algorithm: Algorithm,
    /// Concurrent requests at most (closed loop: the number of workers).
    #[arg(long, default_value_t = 16, value_name = "C")]
    pub connections: usize,
    /// Hard bound on the number of requests scheduled.
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    pub max_requests: u64,
    /// A request without a complete answer after this counts as a timeout error.
    #[arg(long, default_value = "10s", value_name = "D")]
    pub timeout: String,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs the bench on a runtime of its own; call from synchronous code.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run_async(args))
}

/// Runs the bench: sends the load, prints the report, writes the files asked for.
pub async fn run_async(args: BenchArgs) -> anyhow::Result<()> {
    let plan = plan_from(&args)?;
    let flagged_limit = limit_from(&args)?;
    let started_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    let live = Arc::new(Live::default());
    let progress = progress_bar(&plan, args.quiet);
    let ticker = tokio::spawn(update_progress(progress.clone(), Arc::clone(&live)));
    let settings = output::Settings::from_plan(&plan, &args);
    let finished = load::drive(plan, Arc::clone(&live), started_wall.as_nanos()).await;
    ticker.abort();
    progress.finish_and_clear();
    let finished = finished?;

    let (limits, source) = match flagged_limit {
        Some(limit) => (vec![limit], "flags"),
        None => {
            let header = finished.policy_header.as_deref().unwrap_or("");
            let mut limits = accuracy::parse_policy_header(header);
            if let Some(burst) = args.burst {
                limits.iter_mut().for_each(|limit| limit.burst = burst);
            }
            (limits, "header")
        }
    };
    let report = output::Report::build(settings, &finished, limits, source, args.algorithm);
    std::io::stdout()
        .write_all(report.to_table().as_bytes())
        .context("cannot write the report to stdout")?;
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        let svg = chart::render(&report)?;
        std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn plan_from(args: &BenchArgs) -> anyhow::Result<Plan> {
    let targets = args
        .target
        .iter()
        .map(|target| parse_target(target))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if targets.is_empty() {
        bail!("--target: give at least one URL");
    }
    if !(1..=1_000_000).contains(&args.clients) {
        bail!(
            "--clients: {} is out of range; allowed 1 to 1000000",
            args.clients
        );
    }
    if !(1..=10_000).contains(&args.connections) {
        bail!(
            "--connections: {} is out of range; allowed 1 to 10000",
            args.connections
        );
    }
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0) {
            bail!("--rate: {rate} is out of range; allowed above 0 up to 1000000 requests/s");
        }
    }
    let duration = parse_duration(&args.duration).context("--duration")?;
    if duration.is_zero() || duration > MAX_DURATION {
        bail!(
            "--duration: {} is out of range; allowed above 0 up to 1h",
            args.duration
        );
    }
    let timeout = parse_duration(&args.timeout).context("--timeout")?;
    if timeout.is_zero() || timeout > Duration::from_secs(300) {
        bail!(
            "--timeout: {} is out of range; allowed above 0 up to 5m",
            args.timeout
        );
    }
    let identity = match args.identity.split_once(':') {
        Some(("header", name)) => HeaderName::try_from(name)
            .with_context(|| format!("--identity: {name:?} is not a valid header name"))?,
        _ => bail!(
            "--identity: {:?} is not supported; use header:NAME",
            args.identity
        ),
    };
    let prefix = match &args.key_prefix {
        Some(prefix) => prefix.clone(),
        None => default_prefix(),
    };
    let keys = (0..args.clients)
        .map(|i| HeaderValue::try_from(format!("{prefix}-{i}")))
        .collect::<Result<Vec<_>, _>>()
        .context("--key-prefix: not a valid header value")?;
    Ok(Plan {
        targets,
        identity,
        keys,
        rate: args.rate,
        connections: args.connections,
        duration,
        max_requests: args.max_requests,
        timeout,
    })
}

fn limit_from(args: &BenchArgs) -> anyhow::Result<Option<Limit>> {
    let (Some(limit), Some(period)) = (args.limit, &args.period) else {
        return Ok(None);
    };
    let period = parse_duration(period).context("--period")?;
    if limit == 0 || period.is_zero() {
        bail!("--limit and --period must be above 0");
    }
    Ok(Some(Limit {
        name: None,
        limit,
        period,
        burst: args.burst.unwrap_or(limit),
    }))
}

/// Parses an absolute `http://` URL; a missing path means `/`.
fn parse_target(target: &str) -> anyhow::Result<Uri> {
    let uri: Uri = target
        .trim()
        .parse()
        .with_context(|| format!("--target: {target:?} is not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => bail!("--target: {target}: https is not supported; use the http listener"),
        _ => bail!("--target: {target:?}: give an absolute http:// URL"),
    }
    if uri.authority().is_none() {
        bail!("--target: {target:?} has no host");
    }
    if uri.path_and_query().is_none() {
        let mut parts = uri.into_parts();
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        return Uri::from_parts(parts).with_context(|| format!("--target: {target:?}"));
    }
    Ok(uri)
}

/// Parses "250ms", "10s", "1m", "1h" (one integer and one unit).
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .with_context(|| format!("{text:?} is not a duration like \"10s\" or \"1m\""))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => bail!("{text:?}: unknown unit; allowed ms, s, m, h"),
    };
    let millis = number
        .checked_mul(unit_ms)
        .with_context(|| format!("{text:?} is too long"))?;
    Ok(Duration::from_millis(millis))
}

/// A prefix unique to this run, so each run starts from fresh limiter state.
fn default_prefix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 40);
    format!("bench-{mixed:x}")
}

fn progress_bar(plan: &Plan, quiet: bool) -> ProgressBar {
    let target = if quiet || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let length = u64::try_from(plan.duration.as_millis()).unwrap_or(u64::MAX);
    let bar = ProgressBar::with_draw_target(Some(length), target);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
    {
        bar.set_style(style);
    }
    bar
}

async fn update_progress(bar: ProgressBar, live: Arc<Live>) {
    let started = tokio::time::Instant::now();
    let mut interval = tokio::time::interval(Duration::from_millis(200));
    loop {
        interval.tick().await;
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        bar.set_position(elapsed.min(bar.length().unwrap_or(u64::MAX)));
        bar.set_message(format!(
            "sent {} | 2xx {} | 429 {} | other {} | missed {}",
            live.sent.load(Ordering::Relaxed),
            live.admitted.load(Ordering::Relaxed),
            live.limited.load(Ordering::Relaxed),
            live.failed.load(Ordering::Relaxed),
            live.missed.load(Ordering::Relaxed),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_one_number_and_one_unit() {
        assert_eq!(
            parse_duration("250ms").ok(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_duration("10s").ok(), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h").ok(), Some(Duration::from_secs(3_600)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
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
}
