//! The workspace's own tasks, run as `cargo xtask ...` (the alias is in `.cargo/config.toml`).
//!
//! `cargo xtask bench` measures tollgate side by side with its peers on this machine and
//! regenerates the generated block of docs/benchmarks.md and the charts in docs/bench/. Why one
//! Rust program rather than scripts: the statistics, the process handling and the report are
//! code that can be tested, and the Redis servers are tollgate-testkit's, the same ones the
//! tests start.
#![forbid(unsafe_code)]

mod build;
mod cli;
mod document;
mod markdown;
mod procs;
mod relay;
mod results;
mod sections;
mod stats;
mod tools;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Bench(args) => sections::run_all(&args.settings()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
