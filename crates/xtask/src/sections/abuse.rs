//! abuse: the example abuse_bench, 5% of clients at 50x their limit, the deny cache on and
//! off (the example starts its redis-server through tollgate-testkit and prints its own
//! min / median / max table and one JSON line per run).

use std::process::Command;
use std::time::Duration;

use super::{example_output, Ctx};
use crate::procs;

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let reps = ctx.reps.to_string();
    let args: Vec<&str> = if ctx.quick {
        vec!["--seconds", "3", "--reps", &reps, "--users", "1000"]
    } else {
        vec!["--seconds", "6", "--reps", &reps, "--users", "2000"]
    };
    let mut cmd = Command::new(&ctx.bins.abuse_bench);
    cmd.args(&args);
    let text = procs::run(cmd, &ctx.logs.join("abuse.txt"), Duration::from_secs(1800))?;
    let table = example_output(ctx, "abuse", &text)?;
    Ok(format!(
        "### Abuse: 5% of clients at 50x their limit, deny cache on vs off\n\n`abuse_bench {}`:\n\n{table}",
        args.join(" ")
    ))
}
