//! The script texts, each built once from `scripts/*.lua` with the core's bounds in front;
//! their SHA1s are what EVALSHA names.
//!
//! - one script per algorithm for a request matched by one policy (the common case): bounds,
//!   prelude, that algorithm's file, `check_one.lua`. Redis runs a script's whole chunk on
//!   every call, so each carries only the definitions it needs;
//! - one script with all six algorithms and `check.lua` for several policies at once.

use std::sync::OnceLock;
use tollgate_core::algorithms::MAX_LOG_LIMIT;
use tollgate_core::Algorithm;
use tollgate_core::{MAX_BURST_SPAN, MAX_LIMIT, MAX_PERIOD};

const PARTS: [&str; 9] = [
    include_str!("../scripts/prelude.lua"),
    include_str!("../scripts/args.lua"),
    include_str!("../scripts/fixed_window.lua"),
    include_str!("../scripts/sliding_window_log.lua"),
    include_str!("../scripts/sliding_window_counter.lua"),
    include_str!("../scripts/token_bucket.lua"),
    include_str!("../scripts/leaky_bucket.lua"),
    include_str!("../scripts/gcra.lua"),
    include_str!("../scripts/check.lua"),
];

pub(crate) struct Script {
    pub(crate) text: String,
    pub(crate) sha: String,
}

/// The lease driver and the algorithms it can lease (see `scripts/lease.lua`).
const LEASE_PARTS: [&str; 7] = [
    include_str!("../scripts/prelude.lua"),
    include_str!("../scripts/args.lua"),
    include_str!("../scripts/fixed_window.lua"),
    include_str!("../scripts/token_bucket.lua"),
    include_str!("../scripts/leaky_bucket.lua"),
    include_str!("../scripts/gcra.lua"),
    include_str!("../scripts/lease.lua"),
];

pub(crate) fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| build(&PARTS))
}

const PRELUDE: &str = include_str!("../scripts/prelude.lua");
const CHECK_ONE: &str = include_str!("../scripts/check_one.lua");

fn algorithm_file(a: Algorithm) -> &'static str {
    match a {
        Algorithm::FixedWindow => include_str!("../scripts/fixed_window.lua"),
        Algorithm::SlidingWindowLog => include_str!("../scripts/sliding_window_log.lua"),
        Algorithm::SlidingWindowCounter => include_str!("../scripts/sliding_window_counter.lua"),
        Algorithm::TokenBucket => include_str!("../scripts/token_bucket.lua"),
        Algorithm::LeakyBucket => include_str!("../scripts/leaky_bucket.lua"),
        Algorithm::Gcra => include_str!("../scripts/gcra.lua"),
    }
}

/// The single-policy script of `algorithm`.
pub(crate) fn single_script(algorithm: Algorithm) -> &'static Script {
    static SCRIPTS: [OnceLock<Script>; 6] = [const { OnceLock::new() }; 6];
    let i = Algorithm::ALL
        .iter()
        .position(|&a| a == algorithm)
        .unwrap_or_default();
    SCRIPTS[i].get_or_init(|| {
        let name = algorithm.name();
        let bind = format!("local decide, ALGORITHM = {name}, '{name}'");
        build(&[PRELUDE, algorithm_file(algorithm), &bind, CHECK_ONE])
    })
}

/// Every script `check` may send, for loading them up front.
pub(crate) fn check_scripts() -> impl Iterator<Item = &'static Script> {
    Algorithm::ALL
        .into_iter()
        .map(single_script)
        .chain(std::iter::once(script()))
}

pub(crate) fn lease_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| build(&LEASE_PARTS))
}

fn build(parts: &[&str]) -> Script {
    let mut text = format!(
        "-- tollgate: bounds from tollgate-core\n\
             local MAX_LIMIT = {MAX_LIMIT}\n\
             local MAX_PERIOD = {}\n\
             local MAX_BURST_SPAN = {MAX_BURST_SPAN}\n\
             local MAX_LOG_LIMIT = {MAX_LOG_LIMIT}\n\
             local MAX_INT = {}\n",
        tollgate_core::duration_to_micros(MAX_PERIOD),
        1u64 << 53,
    );
    for part in parts {
        text.push_str(part);
        text.push('\n');
    }
    let sha = redis::Script::new(&text).get_hash().to_string();
    Script { text, sha }
}

/// The multi-policy Lua script (what `SCRIPT LOAD` receives): for redis-benchmark and for
/// operators who want to read what runs in their Redis.
pub fn script_text() -> &'static str {
    &script().text
}

/// The multi-policy script's SHA1, as EVALSHA names it.
pub fn script_sha() -> &'static str {
    &script().sha
}

/// The script a request matched by one policy of `algorithm` runs.
pub fn single_script_text(algorithm: Algorithm) -> &'static str {
    &single_script(algorithm).text
}

/// The SHA1 of [`single_script_text`].
pub fn single_script_sha(algorithm: Algorithm) -> &'static str {
    &single_script(algorithm).sha
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_carries_the_core_bounds_and_every_algorithm() {
        let text = script_text();
        assert!(text.contains("local MAX_LIMIT = 1099511627776\n"));
        assert!(text.contains("local MAX_PERIOD = 31622400000000\n"));
        for a in tollgate_core::Algorithm::ALL {
            assert!(
                text.contains(&format!("local function {}(", a.name())),
                "{a}"
            );
            assert!(
                text.contains(&format!("  {} = {},", a.name(), a.name())),
                "{a}"
            );
        }
        assert_eq!(script_sha().len(), 40);
        for a in tollgate_core::Algorithm::ALL {
            let one = single_script_text(a);
            assert!(
                one.contains(&format!("local function {}(", a.name())),
                "{a}"
            );
            let others = tollgate_core::Algorithm::ALL.iter().filter(|&&b| b != a);
            for b in others {
                assert!(
                    !one.contains(&format!("local function {}(", b.name())),
                    "{a} has {b}"
                );
            }
        }
    }
}
