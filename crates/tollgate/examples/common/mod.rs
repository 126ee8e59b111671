//! What the bench examples share: numeric flags, Redis' own count of script calls, and the
//! min / median / max summary of repetitions.

use tollgate_testkit::RedisServer;

/// Calls `set(flag, value)` for every `--flag NUMBER` pair on the command line; exits with
/// status 2 on a missing or non-numeric value, or when `set` refuses the flag.
pub fn numeric_flags(mut set: impl FnMut(&str, u64) -> bool) {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let Some(raw) = argv.get(i + 1) else {
            eprintln!("{} needs a value", argv[i]);
            std::process::exit(2)
        };
        let Ok(v) = raw.parse::<u64>() else {
            eprintln!("{} needs a number", argv[i]);
            std::process::exit(2)
        };
        if !set(&argv[i], v) {
            eprintln!("unknown flag {}", argv[i]);
            std::process::exit(2)
        }
        i += 2;
    }
}

/// Script calls (EVALSHA + EVAL) the server has run, from `INFO commandstats`.
pub fn script_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["info", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|s| s.split(',').next())
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}

/// "min / median / max" of the repetitions, with `digits` decimals.
pub fn stats(mut v: Vec<f64>, digits: usize) -> String {
    v.sort_by(f64::total_cmp);
    let med = v[v.len() / 2];
    format!(
        "{:.d$} / {:.d$} / {:.d$}",
        v[0],
        med,
        v[v.len() - 1],
        d = digits
    )
}
