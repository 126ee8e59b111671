//! The one script text: the core's bounds, the prelude, the six algorithm files and the
//! driver, in that order. Built once; its SHA1 is what EVALSHA names.

use std::sync::OnceLock;
use tollgate_core::algorithms::MAX_LOG_LIMIT;
use tollgate_core::{MAX_BURST_SPAN, MAX_LIMIT, MAX_PERIOD};

const PARTS: [&str; 8] = [
    include_str!("../scripts/prelude.lua"),
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
const LEASE_PARTS: [&str; 6] = [
    include_str!("../scripts/prelude.lua"),
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

/// The whole Lua script the store runs (what `SCRIPT LOAD` receives): for redis-benchmark
/// and for operators who want to read what runs in their Redis.
pub fn script_text() -> &'static str {
    &script().text
}

/// The script's SHA1, as EVALSHA names it.
pub fn script_sha() -> &'static str {
    &script().sha
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
    }
}
