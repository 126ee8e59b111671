//! `tollgate check-config FILE`: validate and report every problem; exit 0 or 2.

use crate::config::Config;
use std::path::Path;

/// Checks `path`; prints errors (one line each) or a short summary. Returns the exit code.
pub fn main(path: &Path) -> i32 {
    match Config::load(path) {
        Ok(c) => {
            for w in &c.warnings {
                eprintln!("{w}");
            }
            let rls = match &c.rls {
                Some(r) => format!(
                    ", rls: {} domain(s), {} descriptor rule(s) from {}",
                    r.config.domains().count(),
                    r.config.rules().len(),
                    r.config_path.display()
                ),
                None => String::new(),
            };
            println!(
                "{}: ok ({} store, {} polic{}, {} mode{rls})",
                path.display(),
                c.store.backend.name(),
                c.policies.len(),
                if c.policies.len() == 1 { "y" } else { "ies" },
                if c.decision_mode() {
                    "decision"
                } else {
                    "proxy"
                }
            );
            0
        }
        Err(errors) => {
            eprintln!("{errors}");
            2
        }
    }
}
