//! The programs the sections run (redis-server, wrk, nginx, node, ...): found on PATH, and
//! installed with apt when missing and this runs as root, as `scripts/test` does for the tests.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::procs;

static APT_UPDATED: AtomicBool = AtomicBool::new(false);

/// Where `name` is: PATH, then the sbin directories (nginx lives there).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Whether this process runs as root (`Uid:` in /proc/self/status).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `name`'s path, installing `package` first when it is missing and this runs as root.
pub fn ensure(name: &str, package: &str, logs: &std::path::Path) -> anyhow::Result<PathBuf> {
    if let Some(p) = which(name) {
        return Ok(p);
    }
    if !is_root() {
        bail!("{name} is not installed and this is not root: apt-get install {package}");
    }
    install(package, logs)?;
    which(name).with_context(|| format!("{name} still missing after installing {package}"))
}

/// Installs an apt package (as root; bounded to ten minutes).
pub fn install(package: &str, logs: &std::path::Path) -> anyhow::Result<()> {
    if !is_root() {
        bail!("not root: install {package} (apt) first");
    }
    eprintln!("[bench] installing {package} (apt)");
    let apt = |args: &[&str], log: &str| {
        let mut cmd = Command::new("apt-get");
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        procs::run(cmd, &logs.join(log), Duration::from_secs(600))
    };
    if !APT_UPDATED.swap(true, Ordering::Relaxed) {
        apt(&["update", "-qq"], "apt-update.log")?;
    }
    apt(
        &["install", "-y", "-qq", package],
        &format!("apt-{package}.log"),
    )?;
    Ok(())
}

/// The first line of `program --version`-like output, for the tables.
pub fn version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s.lines().next().unwrap_or("").trim().to_owned()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_path_and_missing_ones_are_not_invented() {
        assert!(which("sh").is_some());
        assert_eq!(which("no-such-program-tollgate-xtask"), None);
    }
}
