//! The sections of a bench run, run one after the other; a section that fails is recorded as
//! failed (its error and log in the document) and the run goes on.

mod abuse;
mod coalesce;
mod far;
mod floor;
mod gateway;
mod gateway_cpu;
mod lease;
mod memory;
mod peers;
mod redis;
mod reference;
mod rls;
mod servers;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use crate::build::{self, Binaries, Peers};
use crate::document::{self, RunInfo};
use crate::results::Results;
use crate::tools;

/// What a bench run was asked to do, with the defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Short runs.
    pub quick: bool,
    /// Repetitions of every measurement.
    pub reps: u32,
    /// The sections to run, in document order.
    pub sections: Vec<Section>,
    /// `--baseline`: a `tollgate` binary measured side by side with this build (rls, coalesce,
    /// far, gateway).
    pub baseline: Option<PathBuf>,
    /// `--tollgate`: the `tollgate` binary measured as this build's instead of the tree's
    /// release build.
    pub tollgate: Option<PathBuf>,
}

/// One section of the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The memory store against governor.
    Memory,
    /// The Redis store's scripts inside Redis, and its client.
    Redis,
    /// The Redis client against limitador and rate-limiter-flexible.
    Peers,
    /// Leases against exact decisions.
    Lease,
    /// The deny cache under abusive clients.
    Abuse,
    /// `tollgate serve` against nginx `limit_req`.
    Gateway,
    /// `tollgate serve`'s Envoy rate limit service against its HTTP decision mode.
    Rls,
    /// Coalesced store calls, the default `max_batch` against 1, standalone and Cluster.
    Coalesce,
    /// A Redis far away (a delay relay): the default `max_batch` against 1.
    Far,
    /// What Redis itself spends per plan: the scripts against a minimal script and SETs.
    Floor,
    /// The reference deployment: 20 gateways, one Redis.
    Reference,
}

impl Section {
    /// Every section, in document order.
    pub const ALL: [Section; 11] = [
        Section::Memory,
        Section::Redis,
        Section::Peers,
        Section::Lease,
        Section::Abuse,
        Section::Gateway,
        Section::Rls,
        Section::Coalesce,
        Section::Far,
        Section::Floor,
        Section::Reference,
    ];

    /// The name `--only` takes and results.jsonl uses.
    pub fn name(self) -> &'static str {
        match self {
            Section::Memory => "memory",
            Section::Redis => "redis",
            Section::Peers => "peers",
            Section::Lease => "lease",
            Section::Abuse => "abuse",
            Section::Gateway => "gateway",
            Section::Rls => "rls",
            Section::Coalesce => "coalesce",
            Section::Far => "far",
            Section::Floor => "floor",
            Section::Reference => "reference",
        }
    }

    fn run(self, ctx: &Ctx) -> anyhow::Result<String> {
        match self {
            Section::Memory => memory::run(ctx),
            Section::Redis => redis::run(ctx),
            Section::Peers => peers::run(ctx),
            Section::Lease => lease::run(ctx),
            Section::Abuse => abuse::run(ctx),
            Section::Gateway => gateway::run(ctx),
            Section::Rls => rls::run(ctx),
            Section::Coalesce => coalesce::run(ctx),
            Section::Far => far::run(ctx),
            Section::Floor => floor::run(ctx),
            Section::Reference => reference::run(ctx),
        }
    }
}

/// What every section gets.
#[derive(Debug)]
pub struct Ctx {
    /// The workspace root.
    pub root: PathBuf,
    /// bench-out/: raw outputs.
    pub out: PathBuf,
    /// bench-out/logs/.
    pub logs: PathBuf,
    /// Repetitions.
    pub reps: u32,
    /// Short runs.
    pub quick: bool,
    /// The release binaries.
    pub bins: Binaries,
    /// The peers, when the peers section runs.
    pub peers: Option<Peers>,
    /// A `tollgate` binary to measure side by side with this build's (`--baseline`).
    pub baseline: Option<PathBuf>,
    /// bench-out/results.jsonl.
    pub results: Results,
}

impl Ctx {
    /// Appends a result line for this section.
    pub fn emit(&self, section: &str, fields: serde_json::Value) -> anyhow::Result<()> {
        self.results.emit(section, fields)
    }

    /// A fresh directory under bench-out/ for one section's files.
    pub fn dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let dir = self.out.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(dir)
    }
}

/// Logs a line on stderr, with the time.
pub fn log(line: &str) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    eprintln!("[bench {h:02}:{m:02}:{s:02}] {line}");
}

/// The workspace root: two levels above this crate.
fn workspace_root() -> anyhow::Result<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = here
        .ancestors()
        .nth(2)
        .context("the xtask crate is not inside a workspace")?;
    Ok(root.to_owned())
}

/// Runs the sections asked for and rewrites the document; `Ok(false)` when a section failed.
pub fn run_all(settings: &Settings) -> anyhow::Result<bool> {
    let started = Instant::now();
    let root = workspace_root()?;
    let out = root.join("bench-out");
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    std::fs::create_dir_all(root.join("docs/bench")).context("cannot create docs/bench")?;
    let results = Results::create(&out.join("results.jsonl"))?;
    install_tools(&logs);
    // What is built is what is measured: the tree as it is now, committed or not.
    let mut revision = git_revision(&root);
    log("building release binaries");
    let mut bins = build::binaries(&root, &logs)?;
    if let Some(tollgate) = &settings.tollgate {
        // Measured as this build's; the run's line says which it is.
        bins.tollgate = tollgate.clone();
        revision = format!("{revision}, this build's tollgate {}", tollgate.display());
    }
    let peers = settings
        .sections
        .contains(&Section::Peers)
        .then(|| build::peers(&root, &logs));
    let build_s = started.elapsed().as_secs();
    log(&format!("builds done in {build_s} s"));
    let ctx = Ctx {
        root: root.clone(),
        out,
        logs,
        reps: settings.reps,
        quick: settings.quick,
        bins,
        peers,
        baseline: settings.baseline.clone(),
        results,
    };

    let doc_path = root.join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let previous = document::parts(&doc);
    let mut parts = Vec::new();
    let mut failed = Vec::new();
    for section in Section::ALL {
        let name = section.name();
        if !settings.sections.contains(&section) {
            ctx.emit(name, json!({"status": "skipped"}))?;
            let kept = previous.get(name).map_or_else(
                || format!("### {name}\n\nNot measured yet (skipped with --only)."),
                |md| document::kept(md),
            );
            parts.push((name.to_owned(), kept));
            continue;
        }
        log(&format!("section {name}"));
        let t0 = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| section.run(&ctx)))
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("panicked: {}", panic_text(&panic))));
        let secs = t0.elapsed().as_secs();
        match outcome {
            Ok(markdown) => {
                ctx.emit(name, json!({"status": "ok", "seconds": secs}))?;
                parts.push((name.to_owned(), markdown));
            }
            Err(e) => {
                log(&format!("section {name} FAILED: {e:#}"));
                ctx.emit(
                    name,
                    json!({"status": "failed", "seconds": secs, "error": format!("{e:#}")}),
                )?;
                failed.push(name.to_owned());
                parts.push((name.to_owned(), failure(name, &e)));
            }
        }
        log(&format!("section {name} took {secs} s"));
    }

    let info = RunInfo {
        when: utc_now(),
        mode: run_mode(settings.quick, &settings.sections),
        reps: settings.reps,
        total_s: started.elapsed().as_secs(),
        build_s,
        machine: machine(),
        revision,
        failed: failed.clone(),
    };
    let block = document::render_block(&info, &parts);
    std::fs::write(&doc_path, document::splice(&doc, &block))
        .with_context(|| format!("cannot write {}", doc_path.display()))?;
    log(&format!(
        "docs/benchmarks.md regenerated; results in {}",
        ctx.results.path().display()
    ));
    Ok(failed.is_empty())
}

fn failure(name: &str, e: &anyhow::Error) -> String {
    let text: Vec<String> = format!("{e:#}")
        .lines()
        .take(15)
        .map(|l| l.chars().take(200).collect())
        .collect();
    format!(
        "### {name}\n\n**Not measured: this section failed in this run.** The error (the whole \
         log is in bench-out/logs/):\n\n```text\n{}\n```",
        text.join("\n")
    )
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "no message".into())
}

/// The tools every section uses, installed with apt when missing (as root). A tool that
/// cannot be installed fails the sections that need it, with the reason.
fn install_tools(logs: &Path) {
    for (name, package) in [
        ("redis-server", "redis-server"),
        ("redis-benchmark", "redis-tools"),
        ("redis-cli", "redis-tools"),
        ("wrk", "wrk"),
        ("nginx", "nginx-light"),
        ("taskset", "util-linux"),
    ] {
        if let Err(e) = tools::ensure(name, package, logs) {
            log(&format!("{e:#}"));
        }
    }
}

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The paths whose changes change the binaries measured (`.cargo`: build flags).
const SOURCES: [&str; 6] = [
    "crates",
    "benches",
    "Cargo.toml",
    "Cargo.lock",
    "rust-toolchain.toml",
    ".cargo",
];

/// HEAD's short revision, and whether the sources built differ from it: a run on a tree with
/// uncommitted changes names its revision "with uncommitted changes", not as HEAD's alone.
fn git_revision(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let rev = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "?".into());
    // Changed, staged or new (untracked, not ignored) files under the sources, one a line.
    let mut status = vec!["status", "--porcelain", "--"];
    status.extend(SOURCES);
    match git(&status) {
        Some(changes) if !changes.is_empty() => format!("{rev} with uncommitted changes"),
        _ => rev,
    }
}

/// Cores, CPU model, memory, kernel and the load average at the end of the run.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_owned();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024 / 1024);
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores ({model}), {mem_gib} GiB, load average at the end {load}, Linux {}",
        kernel.trim()
    )
}

/// An example that prints one JSON object per run and its own markdown: the objects go to
/// results.jsonl, the rest (leading blank lines dropped) is returned.
fn example_output(ctx: &Ctx, section: &str, text: &str) -> anyhow::Result<String> {
    let (objects, markdown) = split_json_lines(text);
    for object in objects {
        ctx.emit(section, object)?;
    }
    if markdown.trim().is_empty() {
        anyhow::bail!("{section}: the example printed no table");
    }
    Ok(markdown)
}

/// The lines of `text` that are JSON objects, and the other lines.
fn split_json_lines(text: &str) -> (Vec<serde_json::Value>, String) {
    let mut objects = Vec::new();
    let mut rest = Vec::new();
    for line in text.lines() {
        let parsed = line
            .trim()
            .starts_with('{')
            .then(|| serde_json::from_str::<serde_json::Value>(line.trim()).ok())
            .flatten()
            .filter(serde_json::Value::is_object);
        match parsed {
            Some(object) => objects.push(object),
            None => rest.push(line),
        }
    }
    let markdown = rest
        .join("\n")
        .trim_start_matches('\n')
        .trim_end()
        .to_owned()
        + "\n";
    (objects, markdown)
}

/// What the results' header says of a run's extent: `full` only when every section ran;
/// otherwise the sections `--only` chose (the others' figures are an earlier run's).
fn run_mode(quick: bool, sections: &[Section]) -> String {
    let extent = if Section::ALL.iter().all(|s| sections.contains(s)) {
        "full".to_owned()
    } else {
        let names: Vec<&str> = Section::ALL
            .iter()
            .filter(|s| sections.contains(s))
            .map(|s| s.name())
            .collect();
        format!("--only {}", names.join(","))
    };
    if quick {
        format!("{extent}, quick (--quick: short runs, smoke figures only)")
    } else {
        extent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_with_uncommitted_sources_is_named_so() {
        let dir = std::env::temp_dir().join(format!("xtask-rev-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("crates")).expect("dir");
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .current_dir(&dir)
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args)
                .output()
                .expect("git")
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        std::fs::write(dir.join("crates/a.rs"), "1").expect("write");
        std::fs::write(dir.join("notes.md"), "1").expect("write");
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "one"]);
        let clean = git_revision(&dir);
        assert!(!clean.is_empty() && !clean.contains(' '), "{clean}");
        // A change outside the sources (a document the run rewrites) changes nothing.
        std::fs::write(dir.join("notes.md"), "2").expect("write");
        assert_eq!(git_revision(&dir), clean);
        // A changed source, or a new one, is named.
        std::fs::write(dir.join("crates/a.rs"), "2").expect("write");
        assert_eq!(
            git_revision(&dir),
            format!("{clean} with uncommitted changes")
        );
        git(&["checkout", "-q", "--", "crates/a.rs"]);
        assert_eq!(git_revision(&dir), clean);
        std::fs::write(dir.join("crates/b.rs"), "new").expect("write");
        assert_eq!(
            git_revision(&dir),
            format!("{clean} with uncommitted changes")
        );
        // Staged and not committed is still not HEAD.
        git(&["add", "crates/b.rs"]);
        assert_eq!(
            git_revision(&dir),
            format!("{clean} with uncommitted changes")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_run_of_some_sections_is_not_called_full() {
        assert_eq!(run_mode(false, &Section::ALL), "full");
        assert_eq!(
            run_mode(false, &[Section::Rls, Section::Memory]),
            "--only memory,rls"
        );
        assert_eq!(
            run_mode(true, &Section::ALL),
            "full, quick (--quick: short runs, smoke figures only)"
        );
    }

    #[test]
    fn json_lines_are_told_apart_from_the_table() {
        let text = "{\"mode\":\"on\",\"rep\":1}\n{not json\n\n| a |\n|---|\n| 1 |\n";
        let (objects, markdown) = split_json_lines(text);
        assert_eq!(objects, vec![json!({"mode": "on", "rep": 1})]);
        assert_eq!(markdown, "{not json\n\n| a |\n|---|\n| 1 |\n");
    }

    #[test]
    fn a_failed_section_says_so_with_its_error() {
        let e = anyhow::anyhow!("wrk failed:\nconnection refused | twice");
        let md = failure("gateway", &e);
        assert!(md.starts_with("### gateway\n\n**Not measured"));
        assert!(md.contains("```text\nwrk failed:\nconnection refused | twice\n```"));
    }

    #[test]
    fn section_names_are_unique() {
        let mut names: Vec<&str> = Section::ALL.iter().map(|s| s.name()).collect();
        names.dedup();
        assert_eq!(names.len(), Section::ALL.len());
    }
}
