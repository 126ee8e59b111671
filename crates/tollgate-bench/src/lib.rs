//! The load generator behind `tollgate bench`: it checks a rate limiter's accounting.
//!
//! Why a dedicated tool rather than a generic HTTP load generator: a generic one reports how
//! fast the gateway answers, but not whether it admitted what the limit allows. This one
//! drives many virtual clients (distinct API keys or user ids) and compares, per client, what
//! was admitted with what the limit allows over the elapsed time (see `accuracy`).
//!
//! Every run is bounded by `--duration` (at most one hour) and `--max-requests`.
//!
//! The `tollgate` binary parses [`BenchArgs`] (a clap `Args` struct) and calls [`run`].
#![deny(missing_docs)]

mod accuracy;
mod args;
pub mod chart;
mod histogram;
mod load;
mod output;
mod report;
mod rls;
mod settle;
mod timeline;
mod warm;

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use http::header::HeaderValue;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use accuracy::Algorithm;
use accuracy::Limit;
pub use args::BenchArgs;
use load::{Live, Plan};

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
    if args.store.is_some() {
        let report = execute_settle(&args).await?;
        std::io::stdout()
            .write_all(report.to_table().as_bytes())
            .context("cannot write the report to stdout")?;
        return bound_is_failure(&report);
    }
    let (report, answered) = execute(args).await?;
    std::io::stdout()
        .write_all(report.to_table().as_bytes())
        .context("cannot write the report to stdout")?;
    answered
}

/// Runs the bench like [`run`], on a runtime of its own, but returns the report (the object
/// `--json` writes) instead of printing it: for a program that drives many runs and
/// tabulates them itself (the workspace's `cargo xtask bench`). The files asked for are
/// written as with [`run`].
pub fn measure(args: BenchArgs) -> anyhow::Result<serde_json::Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    if args.store.is_some() {
        let report = runtime.block_on(execute_settle(&args))?;
        bound_is_failure(&report)?;
        return serde_json::to_value(&report).context("cannot encode the report");
    }
    let (report, answered) = runtime.block_on(execute(args))?;
    answered?;
    serde_json::to_value(&report).context("cannot encode the report")
}

/// `--store`: runs the costs-known-later mode and writes its JSON report when asked.
async fn execute_settle(args: &BenchArgs) -> anyhow::Result<settle::SettleReport> {
    let settings = settle::Settings::from_args(args)?;
    if args.svg.is_some() {
        anyhow::bail!("--svg is not drawn in --store mode");
    }
    let json_file = args.json.as_deref().map(create_output).transpose()?;
    let report = settle::execute(&settings).await?;
    if let Some(output) = json_file {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        output.write(json + "\n")?;
    }
    Ok(report)
}

/// A client admitted past the bound fails the run (its report is still printed and written).
fn bound_is_failure(report: &settle::SettleReport) -> anyhow::Result<()> {
    if !report.holds() {
        anyhow::bail!("a client was admitted more real units than the bound allows");
    }
    Ok(())
}

/// Sends the load and writes the files asked for. The second value is the verdict on
/// whether anything answered, kept apart so that the report is still shown when nothing did.
async fn execute(args: BenchArgs) -> anyhow::Result<(output::Report, anyhow::Result<()>)> {
    let plan = plan_from(&args)?;
    let flagged_limit = limit_from(&args);
    // Open the output files first: a long run must not end in "cannot write".
    let json_file = args.json.as_deref().map(create_output).transpose()?;
    let svg_file = args.svg.as_deref().map(create_output).transpose()?;
    let live = Arc::new(Live::default());
    let progress = progress_bar(&plan, args.quiet);
    let ticker = tokio::spawn(update_progress(progress.clone(), Arc::clone(&live)));
    let settings = output::Settings::from_plan(&plan, &args);
    let finished = load::drive(plan, Arc::clone(&live)).await;
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
    if let Some(output) = json_file {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        output.write(json + "\n")?;
    }
    if let Some(output) = svg_file {
        output.write(timeline::render(&report)?)?;
    }
    let answered = no_answer_is_failure(&finished.recorder);
    Ok((report, answered))
}

/// A run in which no request got an HTTP answer (a refused or unreachable target) measured
/// nothing: it fails instead of reporting its errors as throughput.
fn no_answer_is_failure(recorder: &report::Recorder) -> anyhow::Result<()> {
    let answered: u64 = recorder.statuses().values().sum();
    let errors: u64 = recorder.errors().values().sum();
    if answered == 0 && errors > 0 {
        let kinds: Vec<String> = recorder
            .errors()
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        anyhow::bail!(
            "no request got an answer from the target ({}); is it running and reachable?",
            kinds.join(", ")
        );
    }
    Ok(())
}

/// An output file, created (and so checked) before the run.
struct OutputFile {
    path: PathBuf,
    file: File,
}

impl OutputFile {
    fn write(mut self, content: String) -> anyhow::Result<()> {
        self.file
            .write_all(content.as_bytes())
            .and_then(|()| self.file.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

fn create_output(path: &Path) -> anyhow::Result<OutputFile> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok(OutputFile {
        path: path.to_owned(),
        file,
    })
}

fn plan_from(args: &BenchArgs) -> anyhow::Result<Plan> {
    let prefix = match &args.key_prefix {
        Some(prefix) => prefix.clone(),
        None => default_prefix(),
    };
    let keys = (0..args.clients)
        .map(|i| HeaderValue::try_from(format!("{prefix}-{i}")))
        .collect::<Result<Vec<_>, _>>()
        .context("--key-prefix: not a valid header value")?;
    let rls = (!args.rls.is_empty()).then(|| rls::RlsPlan {
        domain: args.domain.clone(),
        descriptors: args.descriptor.iter().map(|d| d.0.clone()).collect(),
    });
    Ok(Plan {
        targets: if rls.is_some() {
            args.rls.clone()
        } else {
            args.target.clone()
        },
        rls,
        identity: args.identity.clone(),
        keys,
        rate: args.rate,
        connections: usize::try_from(args.connections).context("--connections")?,
        duration: args.duration,
        max_requests: args.max_requests,
        timeout: args.timeout,
    })
}

fn limit_from(args: &BenchArgs) -> Option<Limit> {
    let (limit, period) = (args.limit?, args.period?);
    Some(Limit {
        name: None,
        limit,
        period,
        burst: args.burst.unwrap_or(limit),
    })
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
