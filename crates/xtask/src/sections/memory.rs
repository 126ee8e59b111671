//! memory: the memory store against governor's keyed limiter. The criterion bench
//! `vs_governor` (criterion medians, then its paired rounds) and the example `bytes_per_key`,
//! run --reps times; ratios are taken within a run.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::stats::{ratios, spread, Digits};

/// (criterion group, threads, label).
const CONFIGS: [(&str, u32, &str); 4] = [
    ("hot_key", 1, "one hot key, 1 thread"),
    ("hot_key", 2, "one hot key, 2 threads"),
    ("random_1m_keys", 1, "1,000,000 random keys, 1 thread"),
    ("random_1m_keys", 2, "1,000,000 random keys, 2 threads"),
];

/// Figures of one configuration over the repetitions.
#[derive(Debug, Default)]
struct Figures {
    ours: Vec<f64>,
    governor: Vec<f64>,
    /// The paired table's five columns.
    paired: [Vec<f64>; 5],
}

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let crit: &[&str] = if ctx.quick {
        &["--warm-up-time", "0.2", "--measurement-time", "0.5"]
    } else {
        &["--warm-up-time", "0.3", "--measurement-time", "1"]
    };
    let mut figures: Vec<Figures> = CONFIGS.iter().map(|_| Figures::default()).collect();
    let (mut system_clock, mut tsc) = (Vec::new(), Vec::new());
    let mut bytes: [Vec<f64>; 2] = Default::default();
    for rep in 1..=ctx.reps {
        log(&format!("memory rep {rep}/{}", ctx.reps));
        let home = ctx.dir(&format!("criterion-{rep}"))?;
        let mut cmd = Command::new(&ctx.bins.vs_governor);
        cmd.arg("--bench").args(crit).env("CRITERION_HOME", &home);
        let text = procs::run(
            cmd,
            &ctx.logs.join(format!("memory-{rep}.txt")),
            Duration::from_secs(1200),
        )?;
        for ((group, threads, label), f) in CONFIGS.iter().zip(&mut figures) {
            let g = format!("{group}_{threads}_thread");
            let ours = estimate(&home, &[&g, "tollgate", &threads.to_string()])?;
            let gov = estimate(&home, &[&g, "governor", &threads.to_string()])?;
            f.ours.push(ours);
            f.governor.push(gov);
            ctx.emit(
                "memory",
                json!({"kind": "criterion", "rep": rep, "configuration": label,
                       "tollgate_ns": ours, "governor_ns": gov, "ratio": ours / gov}),
            )?;
        }
        system_clock.push(estimate(&home, &["clock", "system_clock"])?);
        tsc.push(estimate(&home, &["clock", "tsc_wall_clock"])?);
        for (label, row) in paired_rows(&text)? {
            let Some(i) = CONFIGS.iter().position(|c| c.2 == label) else {
                continue;
            };
            for (column, x) in figures[i].paired.iter_mut().zip(row) {
                column.push(x);
            }
            ctx.emit(
                "memory",
                json!({"kind": "paired", "rep": rep, "configuration": label,
                       "tollgate_check_ns": row[0], "governor_ns": row[1], "ratio_check": row[2],
                       "tollgate_check_one_ns": row[3], "ratio_check_one": row[4]}),
            )?;
        }
        let out = procs::run(
            Command::new(&ctx.bins.bytes_per_key),
            &ctx.logs.join(format!("memory-bytes-{rep}.txt")),
            Duration::from_secs(600),
        )?;
        let [ours, gov] = bytes_per_key(&out)?;
        bytes[0].push(ours);
        bytes[1].push(gov);
        ctx.emit(
            "memory",
            json!({"kind": "bytes_per_key", "rep": rep, "tollgate": ours, "governor": gov,
                   "ratio": ours / gov}),
        )?;
    }
    Ok(render(
        ctx.reps,
        crit,
        &figures,
        &system_clock,
        &tsc,
        &bytes,
    ))
}

fn render(
    reps: u32,
    crit: &[&str],
    figures: &[Figures],
    system_clock: &[f64],
    tsc: &[f64],
    bytes: &[Vec<f64>; 2],
) -> String {
    let one = Digits::Fixed(1);
    let two = Digits::Fixed(2);
    let mut paired = Table::new(&[
        "configuration",
        "tollgate `check`",
        "governor `check_key`",
        "ratio `check` / governor",
        "tollgate `check_one`",
        "ratio `check_one` / governor",
    ]);
    let mut medians = Table::new(&[
        "configuration",
        "tollgate ns/check",
        "governor ns/check",
        "ratio tollgate/governor",
    ]);
    for ((_, _, label), f) in CONFIGS.iter().zip(figures) {
        let p = &f.paired;
        paired.row(&[
            label.to_string(),
            spread(&p[0], one),
            spread(&p[1], one),
            spread(&p[2], two),
            spread(&p[3], one),
            spread(&p[4], two),
        ]);
        medians.row(&[
            label.to_string(),
            spread(&f.ours, one),
            spread(&f.governor, one),
            spread(&ratios(&f.ours, &f.governor), two),
        ]);
    }
    let mut per_key =
        Table::new(&["tollgate", "governor", "ratio tollgate/governor"]).numbers_only();
    per_key.row(&[
        spread(&bytes[0], one),
        spread(&bytes[1], one),
        spread(&ratios(&bytes[0], &bytes[1]), two),
    ]);
    format!(
        "### Memory store vs governor (keyed)\n\n\
         The criterion bench `vs_governor` (`--bench {}`) followed by its paired rounds, then \
         the example `bytes_per_key`, run {reps} time(s); each cell is min / median / max over \
         the runs (ratios taken within a run). Ratios below 1 mean tollgate is faster or \
         smaller.\n\n\
         #### paired: ns per check, median of 60 rotating rounds per run (the ratio to read)\n\n{}\n\
         #### criterion medians (each limiter measured in turn)\n\n{}\n\
         clock read: SystemClock {} ns, TSC wall clock {} ns\n\n\
         #### bytes per key at 1,000,000 keys (RSS growth / keys tracked, each store in a fresh process)\n\n{}",
        crit.join(" "),
        paired.render(),
        medians.render(),
        spread(system_clock, one),
        spread(tsc, one),
        per_key.render(),
    )
}

/// The median point estimate criterion wrote for one benchmark.
fn estimate(home: &Path, parts: &[&str]) -> anyhow::Result<f64> {
    let mut path = home.to_owned();
    for p in parts {
        path.push(p);
    }
    path.push("new/estimates.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    v["median"]["point_estimate"]
        .as_f64()
        .with_context(|| format!("{}: no median point estimate", path.display()))
}

/// The rows of the table between `## paired` and `## end`: label and five numbers.
fn paired_rows(text: &str) -> anyhow::Result<Vec<(String, [f64; 5])>> {
    let start = text
        .find("## paired")
        .context("vs_governor printed no paired table")?;
    let end = text[start..]
        .find("## end")
        .map_or(text.len(), |e| start + e);
    let mut rows = Vec::new();
    for line in text[start..end].lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if cells.len() != 6 {
            continue;
        }
        let numbers: Result<Vec<f64>, _> = cells[1..].iter().map(|c| c.parse::<f64>()).collect();
        if let Ok(n) = numbers {
            rows.push((cells[0].to_owned(), [n[0], n[1], n[2], n[3], n[4]]));
        }
    }
    Ok(rows)
}

/// Bytes per key of tollgate and governor from `bytes_per_key`'s table.
fn bytes_per_key(text: &str) -> anyhow::Result<[f64; 2]> {
    let find = |store: &str| -> anyhow::Result<f64> {
        text.lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l
                    .trim()
                    .trim_matches('|')
                    .split('|')
                    .map(str::trim)
                    .collect();
                (cells.len() == 4 && cells[0] == store).then(|| cells[3].parse::<f64>().ok())?
            })
            .next()
            .with_context(|| format!("bytes_per_key printed no row for {store}"))
    };
    Ok([find("tollgate")?, find("governor")?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paired_table_and_bytes_per_key_are_read() {
        let text = "criterion noise | a | b |\n## paired: ns per check\n\
            | configuration | tollgate `check` | governor `check_key` | ratio | tollgate `check_one` | ratio |\n\
            |---|---:|---:|---:|---:|---:|\n\
            | one hot key, 1 thread | 82.9 | 86.9 | 0.97 | 75.4 | 0.87 |\n## end\n| x | 1 | 2 | 3 | 4 | 5 |\n";
        let rows = paired_rows(text).expect("rows");
        assert_eq!(
            rows,
            vec![(
                "one hot key, 1 thread".to_owned(),
                [82.9, 86.9, 0.97, 75.4, 0.87]
            )]
        );
        assert!(paired_rows("nothing").is_err());
        let bytes =
            "| store | keys tracked | RSS growth (MiB) | bytes per key |\n|---|---:|---:|---:|\n\
            | tollgate | 1000000 | 38.9 | 40.7 |\n| governor | 1000000 | 50.3 | 52.7 |\n";
        assert_eq!(bytes_per_key(bytes).expect("bytes"), [40.7, 52.7]);
    }
}
