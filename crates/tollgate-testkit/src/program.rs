//! The one skip rule for tests that need a program from outside the workspace (nginx,
//! chromium, podman, redis-server, ...): `scripts/test` installs it, so a test that cannot find
//! it fails, with what to do. The only way to skip is to say so by name in one environment
//! variable, [`SKIP_VAR`], and a skipped test prints why.

use std::path::{Path, PathBuf};

/// The environment variable naming the programs whose tests may be skipped when the program is
/// missing: a comma- or space-separated list (`TOLLGATE_SKIP_MISSING=chromium,nginx`), or `all`.
pub const SKIP_VAR: &str = "TOLLGATE_SKIP_MISSING";

/// A program a test needs: where to look and how `scripts/test` installs it.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// The name a skip lists (`nginx`, `chromium`, `podman`).
    pub name: &'static str,
    /// Executable names looked up on `PATH`, in order.
    pub executables: &'static [&'static str],
    /// Absolute paths tried after `PATH` (e.g. `/usr/sbin/nginx`, which is not on every PATH).
    pub paths: &'static [&'static str],
    /// An environment variable that names the binary directly, when set (e.g. `TOLLGATE_CHROMIUM`).
    pub env: Option<&'static str>,
    /// The Debian package(s) `scripts/test` installs it from, for the message.
    pub package: &'static str,
}

/// What [`require`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The program's path.
    At(PathBuf),
    /// Missing, and [`SKIP_VAR`] allows skipping it: the test returns early (the reason was
    /// printed).
    Skip,
}

/// Finds `program`. Missing and not listed in [`SKIP_VAR`]: panics with how to install it or
/// skip it. Missing and listed: prints why the test is skipped and returns [`Found::Skip`].
pub fn require(program: &Program) -> Found {
    let skip = std::env::var(SKIP_VAR).unwrap_or_default();
    decide(program, find(program), &skip)
}

/// Like [`require`], returning the path or `None` for a skip (the common form in a test:
/// `let Some(nginx) = require_path(&NGINX) else { return };`).
pub fn require_path(program: &Program) -> Option<PathBuf> {
    match require(program) {
        Found::At(p) => Some(p),
        Found::Skip => None,
    }
}

fn decide(program: &Program, found: Option<PathBuf>, skip: &str) -> Found {
    if let Some(p) = found {
        return Found::At(p);
    }
    if skips(skip, program.name) {
        eprintln!(
            "skipped: this test needs {} and it is not installed ({SKIP_VAR}={skip})",
            program.name
        );
        return Found::Skip;
    }
    panic!(
        "{name} is not installed: scripts/test installs it as root (apt-get install {pkg}); \
         or set {SKIP_VAR}={name} to skip the tests that need it on this machine",
        name = program.name,
        pkg = program.package,
    );
}

fn skips(list: &str, name: &str) -> bool {
    list.split([',', ' '])
        .map(str::trim)
        .any(|n| n == "all" || n == name)
}

fn find(program: &Program) -> Option<PathBuf> {
    if let Some(var) = program.env {
        if let Some(p) = std::env::var_os(var) {
            return Some(PathBuf::from(p));
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in program.executables {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    program
        .paths
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf)
}

/// nginx (Debian's `nginx-light` has the `auth_request` module).
pub const NGINX: Program = Program {
    name: "nginx",
    executables: &["nginx"],
    paths: &["/usr/sbin/nginx", "/usr/local/sbin/nginx"],
    env: None,
    package: "nginx-light",
};

/// Headless chromium for the status page's browser test; `TOLLGATE_CHROMIUM` names another.
pub const CHROMIUM: Program = Program {
    name: "chromium",
    executables: &["chromium", "chromium-browser"],
    paths: &[],
    env: Some("TOLLGATE_CHROMIUM"),
    package: "chromium",
};

#[cfg(test)]
mod tests {
    use super::*;

    const NOWHERE: Program = Program {
        name: "no-such-program",
        executables: &["no-such-program-tollgate"],
        paths: &["/nonexistent/no-such-program-tollgate"],
        env: None,
        package: "no-such-package",
    };

    #[test]
    fn a_found_program_is_returned_whatever_the_skip_list_says() {
        let p = PathBuf::from("/bin/sh");
        assert_eq!(decide(&NOWHERE, Some(p.clone()), "all"), Found::At(p));
    }

    #[test]
    fn a_missing_program_is_skipped_only_when_named() {
        assert_eq!(
            decide(&NOWHERE, None, "nginx, no-such-program"),
            Found::Skip
        );
        assert_eq!(decide(&NOWHERE, None, "all"), Found::Skip);
    }

    #[test]
    #[should_panic(expected = "set TOLLGATE_SKIP_MISSING=no-such-program")]
    fn a_missing_program_not_named_fails_the_test() {
        decide(&NOWHERE, None, "nginx,chromium");
    }

    #[test]
    fn a_name_that_only_contains_the_program_does_not_skip_it() {
        assert!(!skips("no-such-program-2", "no-such-program"));
        assert!(!skips("", "no-such-program"));
    }

    #[test]
    fn programs_are_looked_up_on_path() {
        let sh = Program {
            name: "sh",
            executables: &["sh"],
            paths: &[],
            env: None,
            package: "dash",
        };
        assert!(find(&sh).is_some_and(|p| p.is_file()));
        assert_eq!(find(&NOWHERE), None);
    }
}
