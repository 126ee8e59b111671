//! Command-line arguments and dispatch.
//!
//! Adding a subcommand is one variant of [`Command`] (with its arguments struct) and one arm
//! in [`Command::run`], pointing at the module that implements it. Usage errors exit with 2
//! (clap's convention, which `check-config` shares for invalid files); runtime errors print
//! `error: ...` and exit with 1.

use crate::simulate;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Rate-limiting gateway: limits requests per client with one of six algorithms, against an
/// in-process or Redis store.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (no config: memory store, decision mode, token_bucket 100/min per IP).
    Serve {
        /// The TOML configuration file [default: $TOLLGATE_CONFIG when set, else the built-in
        /// defaults].
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// How log lines are written to stderr [default: $TOLLGATE_LOG_FORMAT, else text].
        #[arg(long, value_enum, value_name = "FORMAT")]
        log_format: Option<tollgate_gateway::telemetry::LogFormat>,
    },
    /// Validate a configuration file; exit 0 when valid, 2 when not.
    CheckConfig {
        /// The TOML configuration file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Replay a scenario through every algorithm and show what each admits.
    Simulate(simulate::SimulateArgs),
    /// Load a running gateway and check that it admits what its limit allows.
    Bench(Box<tollgate_bench::BenchArgs>),
}

impl Command {
    fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Command::Serve { config, log_format } => Ok(code(tollgate_gateway::serve::main(
                config.as_deref(),
                log_format,
            ))),
            Command::CheckConfig { file } => Ok(code(tollgate_gateway::check_config::main(&file))),
            Command::Simulate(args) => simulate::run(&args).map(|()| ExitCode::SUCCESS),
            Command::Bench(args) => tollgate_bench::run(*args).map(|()| ExitCode::SUCCESS),
        }
    }
}

/// An exit code from the library's `i32` convention (0 ok, 1 runtime error, 2 bad input).
fn code(c: i32) -> ExitCode {
    ExitCode::from(u8::try_from(c).unwrap_or(1))
}

/// Parses the arguments (exiting with 2 on a usage error) and runs the subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
