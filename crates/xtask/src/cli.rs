//! The command line: `cargo xtask bench [--quick] [--reps N] [--only SECTIONS]
//! [--baseline TOLLGATE_BIN] [--tollgate TOLLGATE_BIN]`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::sections::{Section, Settings};

/// The workspace's own tasks.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The tasks.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure tollgate against its peers on this machine and regenerate the generated block
    /// of docs/benchmarks.md, the charts in docs/bench/ and bench-out/results.jsonl.
    Bench(BenchArgs),
}

/// `cargo xtask bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A smoke run of a few minutes: short runs, 1 repetition unless --reps is given. The
    /// figures are marked as such in the document.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions of every measurement (default 3; 1 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub reps: Option<u32>,
    /// Run only these sections (comma- or space-separated): memory, redis, peers, lease,
    /// abuse, gateway, rls, coalesce, far, floor, reference. The others keep the figures already in
    /// the document, marked as not rerun.
    #[arg(long, value_name = "SECTIONS", value_parser = parse_sections)]
    pub only: Option<Only>,
    /// A `tollgate` binary (e.g. the previous commit's release build) that the rls, coalesce,
    /// far and gateway sections measure side by side with this build, alternating runs, and
    /// report ratios against.
    #[arg(long, value_name = "TOLLGATE_BIN", value_parser = parse_binary)]
    pub baseline: Option<PathBuf>,
    /// Measure this `tollgate` binary as this build's (e.g. `scripts/build-pgo`'s, built
    /// from this tree with profile-guided optimization) instead of the release build of the
    /// tree. The other binaries are still built from the tree; the run's line names it.
    #[arg(long, value_name = "TOLLGATE_BIN", value_parser = parse_binary)]
    pub tollgate: Option<PathBuf>,
}

/// The sections `--only` names (one value, so clap does not take it for a list of values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Only(pub Vec<Section>);

impl BenchArgs {
    /// The settings these arguments ask for.
    pub fn settings(&self) -> Settings {
        let reps = self.reps.unwrap_or(if self.quick { 1 } else { 3 });
        let sections = match &self.only {
            Some(Only(only)) => Section::ALL
                .into_iter()
                .filter(|s| only.contains(s))
                .collect(),
            None => Section::ALL.to_vec(),
        };
        Settings {
            quick: self.quick,
            reps,
            sections,
            baseline: self.baseline.clone(),
            tollgate: self.tollgate.clone(),
        }
    }
}

/// An executable file, made absolute (the sections run from other directories).
fn parse_binary(text: &str) -> Result<PathBuf, String> {
    let path = std::path::absolute(text).map_err(|e| format!("{text:?}: {e}"))?;
    if !path.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    Ok(path)
}

fn parse_sections(text: &str) -> Result<Only, String> {
    let names: Vec<&str> = text
        .split([',', ' '])
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Err("name at least one section".into());
    }
    names
        .into_iter()
        .map(|name| {
            Section::ALL
                .into_iter()
                .find(|s| s.name() == name)
                .ok_or_else(|| {
                    let all: Vec<&str> = Section::ALL.iter().map(|s| s.name()).collect();
                    format!(
                        "unknown section {name:?}; the sections are {}",
                        all.join(", ")
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Only)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn settings(line: &str) -> Result<Settings, clap::Error> {
        let argv = ["cargo xtask", "bench"]
            .into_iter()
            .chain(line.split_whitespace());
        let cli = Cli::try_parse_from(argv)?;
        let Command::Bench(args) = cli.command;
        Ok(args.settings())
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_every_section_three_times() {
        let s = settings("").expect("valid");
        assert_eq!(s.reps, 3);
        assert!(!s.quick);
        assert_eq!(s.sections, Section::ALL.to_vec());
        assert_eq!(s.baseline, None);
        assert_eq!(s.tollgate, None);
    }

    #[test]
    fn a_baseline_or_a_tollgate_binary_is_an_existing_file_made_absolute() {
        let file = std::env::temp_dir().join(format!("xtask-baseline-{}", std::process::id()));
        std::fs::write(&file, "").expect("write");
        let s = settings(&format!("--only rls --baseline {}", file.display())).expect("valid");
        assert_eq!(s.sections, vec![Section::Rls]);
        assert_eq!(s.baseline.as_deref(), Some(file.as_path()));
        let s = settings(&format!("--tollgate {}", file.display())).expect("valid");
        assert_eq!(s.tollgate.as_deref(), Some(file.as_path()));
        assert_eq!(s.baseline, None);
        let _ = std::fs::remove_file(&file);
        for flag in ["--baseline", "--tollgate"] {
            let e = settings(&format!("{flag} /nonexistent/tollgate")).expect_err("missing");
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains("is not a file"), "{e}");
        }
    }

    #[test]
    fn quick_means_one_repetition_unless_told_otherwise() {
        assert_eq!(settings("--quick").expect("valid").reps, 1);
        assert_eq!(settings("--quick --reps 2").expect("valid").reps, 2);
    }

    #[test]
    fn only_keeps_document_order_and_accepts_both_separators() {
        let s = settings("--only gateway,memory").expect("valid");
        assert_eq!(s.sections, vec![Section::Memory, Section::Gateway]);
        let cli =
            Cli::try_parse_from(["cargo xtask", "bench", "--only", "peers lease"]).expect("valid");
        let Command::Bench(args) = cli.command;
        assert_eq!(
            args.settings().sections,
            vec![Section::Peers, Section::Lease]
        );
    }

    #[test]
    fn bad_arguments_are_usage_errors_that_say_what_is_allowed() {
        for bad in [
            "--reps 0",
            "--reps 21",
            "--reps x",
            "--only nope",
            "--only ,",
            "--fast",
        ] {
            let e = settings(bad).expect_err(bad);
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        let e = settings("--only memory,nope").expect_err("unknown");
        assert!(
            e.to_string().contains("the sections are memory, redis"),
            "{e}"
        );
    }

    #[test]
    fn help_names_every_flag() {
        let e = settings("--help").expect_err("help exits");
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        let help = e.to_string();
        for flag in ["--quick", "--reps", "--only", "--baseline", "--tollgate"] {
            assert!(help.contains(flag), "{help}");
        }
    }
}
