//! Everything is compiled before the first measurement, in one cargo invocation (so no
//! section competes with a compiler), then the peers under benches/peers/.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use crate::{procs, tools};

/// The release binaries the sections run.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `tollgate` (serve).
    pub tollgate: PathBuf,
    /// The gateway's HTTP server with no limiter.
    pub http_floor: PathBuf,
    /// The RLS listener's HTTP/2 server with no limiter.
    pub rls_floor: PathBuf,
    /// `RedisStore::check` under load; also prints the scripts the store loads.
    pub redis_bench: PathBuf,
    /// Exact vs lease.
    pub lease_bench: PathBuf,
    /// The deny cache under abuse.
    pub abuse_bench: PathBuf,
    /// RSS per tracked key.
    pub bytes_per_key: PathBuf,
    /// The criterion bench against governor.
    pub vs_governor: PathBuf,
}

/// Builds every binary with `cargo build --release` and finds each one in cargo's messages
/// (criterion benches carry a hash in their file name).
pub fn binaries(root: &Path, logs: &Path) -> anyhow::Result<Binaries> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).args([
        "build",
        "--release",
        "--message-format=json-render-diagnostics",
        "-p",
        "tollgate-redis",
        "--example",
        "redis_bench",
        "-p",
        "tollgate-gateway",
        "--bin",
        "tollgate",
        "--example",
        "http_floor",
        "--example",
        "rls_floor",
        "-p",
        "tollgate",
        "--features",
        "tollgate/redis",
        "--example",
        "lease_bench",
        "--example",
        "abuse_bench",
        "-p",
        "tollgate-memory",
        "--bench",
        "vs_governor",
        "--example",
        "bytes_per_key",
    ]);
    let messages = procs::run(cmd, &logs.join("build.json"), Duration::from_secs(3600))
        .context("cargo build --release")?;
    let found = executables(&messages);
    let get = |name: &str| {
        found
            .get(name)
            .cloned()
            .with_context(|| format!("cargo built no executable named {name}"))
    };
    Ok(Binaries {
        tollgate: get("tollgate")?,
        http_floor: get("http_floor")?,
        rls_floor: get("rls_floor")?,
        redis_bench: get("redis_bench")?,
        lease_bench: get("lease_bench")?,
        abuse_bench: get("abuse_bench")?,
        bytes_per_key: get("bytes_per_key")?,
        vs_governor: get("vs_governor")?,
    })
}

/// Target name -> executable, from cargo's JSON messages (the last one of a name wins).
fn executables(messages: &str) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    for line in messages.lines() {
        let Ok(m) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if m["reason"] != "compiler-artifact" {
            continue;
        }
        if let (Some(name), Some(exe)) = (m["target"]["name"].as_str(), m["executable"].as_str()) {
            found.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    found
}

/// The peers of the Redis client, each built or why not.
#[derive(Debug, Clone)]
pub struct Peers {
    /// benches/peers/limitador's binary, or why it was not built.
    pub limitador: Result<PathBuf, String>,
    /// Seconds its build took in this run.
    pub limitador_build_s: u64,
    /// How RocksDB was linked.
    pub limitador_rocksdb: String,
    /// benches/peers/rate-limiter-flexible's script, ready to run with node, or why not.
    pub rlf: Result<PathBuf, String>,
}

/// How long the limitador build may take (`PEER_BUILD_TIMEOUT` seconds, default 900).
fn peer_build_timeout() -> Duration {
    let secs = std::env::var("PEER_BUILD_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(900);
    Duration::from_secs(secs)
}

/// Builds the peers. limitador 0.12 to 0.14 only compile with their default features, which
/// include RocksDB: compiled from C++ that takes most of an hour on 2 cores, linked against
/// Debian's librocksdb-dev it takes minutes (nothing in the peer calls RocksDB, so the C
/// library's version does not matter). A peer that cannot be built is reported in its table,
/// not fatal.
pub fn peers(root: &Path, logs: &Path) -> Peers {
    let _ = tools::ensure("node", "nodejs", logs);
    let _ = tools::ensure("npm", "npm", logs);
    let libdir = PathBuf::from("/usr/lib").join(multiarch());
    if !has_libclang() {
        let _ = tools::install("libclang-dev", logs);
    }
    if !libdir.join("librocksdb.so").exists() {
        let _ = tools::install("librocksdb-dev", logs);
    }
    let mut env: Vec<(String, String)> = Vec::new();
    if libdir.join("librocksdb.so").exists() {
        env.push(("ROCKSDB_LIB_DIR".into(), libdir.display().to_string()));
        if libdir.join("libsnappy.so").exists() {
            env.push(("SNAPPY_LIB_DIR".into(), libdir.display().to_string()));
        }
    } else {
        let _ = tools::ensure("g++", "g++", logs);
    }
    let rocksdb = if env.is_empty() {
        "RocksDB compiled from source".to_owned()
    } else {
        env.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let dir = root.join("benches/peers/limitador");
    let started = Instant::now();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&dir)
        .args(["build", "--release", "--locked", "-q"])
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env("ZSTD_SYS_USE_PKG_CONFIG", "1")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    eprintln!("[bench] building benches/peers/limitador ({rocksdb})");
    let limitador = match procs::run(
        cmd,
        &logs.join("peer-limitador-build.log"),
        peer_build_timeout(),
    ) {
        Ok(_) => Ok(dir.join("target/release/limitador-peer")),
        Err(e) => Err(first_line(&format!("{e:#}"))),
    };
    let limitador_build_s = started.elapsed().as_secs();
    Peers {
        limitador,
        limitador_build_s,
        limitador_rocksdb: rocksdb,
        rlf: rate_limiter_flexible(root, logs),
    }
}

fn rate_limiter_flexible(root: &Path, logs: &Path) -> Result<PathBuf, String> {
    let dir = root.join("benches/peers/rate-limiter-flexible");
    let (Some(npm), Some(_)) = (tools::which("npm"), tools::which("node")) else {
        return Err("node/npm not installed (apt-get install nodejs npm)".into());
    };
    let mut cmd = Command::new(npm);
    cmd.current_dir(&dir)
        .args(["install", "--no-audit", "--no-fund", "--silent"]);
    procs::run(
        cmd,
        &logs.join("peer-rlf-install.log"),
        Duration::from_secs(300),
    )
    .map_err(|e| first_line(&format!("{e:#}")))?;
    Ok(dir.join("bench.js"))
}

fn multiarch() -> String {
    Command::new("gcc")
        .arg("-print-multiarch")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "x86_64-linux-gnu".into())
}

fn has_libclang() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .is_some_and(|s| {
            s.lines()
                .any(|l| l.contains("libclang") && l.contains(".so"))
        })
}

/// The first line that says `error`, else the first line.
fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| l.trim_start().starts_with("error"))
        .or_else(|| text.lines().next())
        .unwrap_or("failed")
        .chars()
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_are_read_from_cargo_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"tollgate_core"},"executable":null}
not json
{"reason":"compiler-artifact","target":{"name":"vs_governor"},"executable":"/t/release/deps/vs_governor-1a2b"}
{"reason":"build-finished","success":true}"#;
        let found = executables(messages);
        assert_eq!(found.len(), 1);
        assert_eq!(
            found["vs_governor"],
            PathBuf::from("/t/release/deps/vs_governor-1a2b")
        );
    }

    #[test]
    fn a_build_failure_is_told_by_its_first_error() {
        assert_eq!(
            first_line("warning: x\nerror[E0433]: nope\nerror: more"),
            "error[E0433]: nope"
        );
        assert_eq!(first_line("timed out"), "timed out");
    }
}
