//! Spawning `redis-server`, finding free ports and talking to a server without a client
//! library (so the testkit does not depend on the store it tests).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const INSTALL_HINT: &str = "install it with `apt-get install redis-server redis-tools` \
     (scripts/test does this); tollgate's Redis tests never skip silently";

/// How long a server gets to answer PING after it was spawned.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A port that was free a moment ago (the kernel's choice for port 0). Another process may
/// take it before redis-server binds it: callers retry on "Address already in use".
pub(crate) fn free_port() -> u16 {
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind("127.0.0.1:0") {
            if let Ok(addr) = l.local_addr() {
                return addr.port();
            }
        }
    }
    panic!("could not find a free loopback port in 100 attempts");
}

/// A fresh private directory for one server's files.
pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-testkit-{}-{}-{tag}-{n}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("cannot create {}: {e}", dir.display());
    }
    dir
}

/// Spawns `redis-server` on `port` with its files in `dir` and `extra` arguments.
pub(crate) fn spawn_server(port: u16, dir: &Path, extra: &[String]) -> Child {
    let mut cmd = Command::new("redis-server");
    cmd.arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--protected-mode", "yes"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("redis-server is not on PATH: {INSTALL_HINT}")
        }
        Err(e) => panic!("cannot spawn redis-server: {e}"),
    }
}

/// Waits for a just-spawned `child` on `port` to answer PING and returns it. When it exits
/// first or stays silent past [`START_TIMEOUT`], it is killed and reaped, and the error says
/// whether it exited by itself, with its log (in `dir`).
pub(crate) fn await_start(
    mut child: Child,
    port: u16,
    dir: &Path,
) -> Result<Child, (bool, String)> {
    let mut exited = false;
    let up = wait_until(START_TIMEOUT, || {
        if matches!(child.try_wait(), Ok(Some(_))) {
            exited = true;
            return true;
        }
        pings(port)
    });
    if up && !exited {
        return Ok(child);
    }
    let _ = child.kill();
    let _ = child.wait();
    Err((exited, read_log(dir)))
}

/// The server's log, for error messages.
pub(crate) fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
}

/// Sends one inline command and returns the first line of the reply, within `timeout`.
pub(crate) fn raw_command(port: u16, command: &str, timeout: Duration) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    s.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    // A one-line reply is short: a bounded number of reads.
    for _ in 0..64 {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.ends_with(b"\r\n") {
            break;
        }
    }
    Some(String::from_utf8_lossy(&buf).trim_end().to_string())
}

/// Whether the server on `port` answers PING (with PONG, or by asking for a password).
pub(crate) fn pings(port: u16) -> bool {
    raw_command(port, "PING", Duration::from_millis(500))
        .is_some_and(|r| r == "+PONG" || r.starts_with("-NOAUTH"))
}

/// The longest one redis-cli may take before the test fails: well under nextest's kill (300 s,
/// `.config/nextest.toml`), so a redis-cli that never returns (a `--cluster create` waiting on
/// nodes that closed its connections did, for 300 s) fails its test saying which command it was.
pub(crate) const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs redis-cli against the server on `port`: its output (standard output, then error).
/// Panics when it does not return within [`CLI_TIMEOUT`] (it is killed first).
pub(crate) fn cli(port: u16, args: &[&str]) -> String {
    match cli_within(port, args, CLI_TIMEOUT) {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    }
}

/// [`cli`] bounded by `limit`: past it redis-cli is killed and the error says which command
/// it was and what it had written.
pub(crate) fn cli_within(port: u16, args: &[&str], limit: Duration) -> Result<String, String> {
    let spawned = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("redis-cli is not on PATH: {INSTALL_HINT}")
        }
        Err(e) => panic!("cannot run redis-cli: {e}"),
    };
    // Read as it writes (a full pipe would stop it), on threads that end with its pipes.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    // Polled from 1 ms on, doubling to 50 ms: most runs take a few milliseconds.
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    let exited = loop {
        if !matches!(child.try_wait(), Ok(None)) {
            break true;
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            break false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    let _ = child.wait();
    let mut text = String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned();
    text.push_str(&String::from_utf8_lossy(&err.join().unwrap_or_default()));
    if exited {
        Ok(text)
    } else {
        Err(format!(
            "redis-cli {args:?} against 127.0.0.1:{port} did not return within {limit:?} \
             (killed); it had written:\n{text}"
        ))
    }
}

/// Reads `pipe` to its end on a thread of its own (a full pipe would stop its writer).
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Polls `f` every 20 ms until it returns true or `timeout` passes; returns its last answer.
pub(crate) fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let max_polls = timeout.as_millis() / 20 + 1;
    for _ in 0..max_polls {
        if f() {
            return true;
        }
        if start.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// Sends `signal` (a name such as "STOP") to `pid` with the `kill` utility.
pub(crate) fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("kill -s {signal} {pid} failed: {s}"),
        Err(e) => panic!("cannot run kill: {e}"),
    }
}
