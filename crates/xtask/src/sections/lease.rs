//! lease: the example lease_bench, exact against leased decisions with 20 limiters on one
//! Redis (the example starts its redis-server through tollgate-testkit and prints its own
//! min / median / max table and one JSON line per run).

use std::process::Command;
use std::time::Duration;

use super::{example_output, Ctx};
use crate::procs;

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let reps = ctx.reps.to_string();
    let args: Vec<&str> = if ctx.quick {
        vec![
            "--seconds",
            "3",
            "--reps",
            &reps,
            "--limit",
            "2000",
            "--users",
            "100",
            "--user-rate",
            "1000",
        ]
    } else {
        vec!["--seconds", "6", "--reps", &reps]
    };
    let mut cmd = Command::new(&ctx.bins.lease_bench);
    cmd.args(&args);
    let text = procs::run(cmd, &ctx.logs.join("lease.txt"), Duration::from_secs(1800))?;
    let table = example_output(ctx, "lease", &text)?;
    Ok(format!(
        "### Leases vs exact (20 limiters on one Redis)\n\n`lease_bench {}`:\n\n{table}",
        args.join(" ")
    ))
}
