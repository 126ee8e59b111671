//! The `tollgate` binary. It only parses arguments and dispatches: each subcommand lives in a
//! module of its own (see `cli`).

mod bench;
mod cli;
mod simulate;

fn main() -> std::process::ExitCode {
    cli::main()
}
