//! The processes a section starts: each one owned by a [`Proc`], stopped when it is dropped
//! (so a failing section still stops everything it started), its output in a log file, and
//! every wait bounded.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A started process, stopped on drop: SIGTERM, then SIGKILL after a few seconds.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr in `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Proc> {
        let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone().context("cannot share the log file")?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
        Ok(Proc {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Waits (at most `timeout`) until something accepts connections on 127.0.0.1:`port`;
    /// fails early, with the log's end, when the process exits first.
    pub fn wait_port(&mut self, port: u16, timeout: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        let polls = timeout.as_millis() / 50 + 1;
        for _ in 0..polls {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!(
                        "{} exited ({status}) before listening on {port}:\n{}",
                        self.name,
                        log_tail(&self.log, 15)
                    );
                }
            }
            if connects(port) {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "{} did not listen on {port} within {timeout:?}:\n{}",
            self.name,
            log_tail(&self.log, 15)
        )
    }

    /// Stops the process now (what dropping it does).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        for _ in 0..100 {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr().context("no local address")?.port())
}

/// `N` loopback ports that were free a moment ago, all different (each is found free on its
/// own, so a later one may be an earlier one again).
pub fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let mut ports = [0u16; N];
    let mut found = 0;
    for _ in 0..N * 100 {
        if found == N {
            break;
        }
        let port = free_port()?;
        if !ports[..found].contains(&port) {
            ports[found] = port;
            found += 1;
        }
    }
    if found < N {
        bail!("the system gave the same free ports again and again");
    }
    Ok(ports)
}

fn connects(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The status of `GET path` on 127.0.0.1:`port` (HTTP/1.0, one short exchange), if any.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut head = [0u8; 64];
    let mut n = 0;
    for _ in 0..16 {
        let got = s.read(&mut head[n..]).ok()?;
        if got == 0 {
            break;
        }
        n += got;
        if n >= 12 || n == head.len() {
            break;
        }
    }
    let line = std::str::from_utf8(&head[..n]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The body of `GET path` on 127.0.0.1:`port` (HTTP/1.0, read to the end, at most 8 MiB),
/// when it answers 200.
pub fn http_body(port: u16, path: &str) -> anyhow::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("cannot connect to 127.0.0.1:{port}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())?;
    let mut all = Vec::new();
    s.take(8 << 20)
        .read_to_end(&mut all)
        .with_context(|| format!("reading http://127.0.0.1:{port}{path}"))?;
    let text = String::from_utf8_lossy(&all);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("http://127.0.0.1:{port}{path} sent no whole head"))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        bail!("http://127.0.0.1:{port}{path} answered {status}");
    }
    Ok(body.to_owned())
}

/// Waits (at most `timeout`) for `GET path` on `port` to answer 200.
pub fn wait_http_ok(port: u16, path: &str, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    for _ in 0..(timeout.as_millis() / 100 + 1) {
        if http_status(port, path) == Some(200) {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("http://127.0.0.1:{port}{path} did not answer 200 within {timeout:?}")
}

/// Runs `cmd` to completion within `timeout` (killed past it), stdout to `log` and stderr to
/// `log` + `.err`; returns stdout. A non-zero exit is an error quoting stderr's end.
pub fn run(mut cmd: Command, log: &Path, timeout: Duration) -> anyhow::Result<String> {
    let err_log = log.with_extension("err");
    let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let err =
        File::create(&err_log).with_context(|| format!("cannot create {}", err_log.display()))?;
    let program = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let start = Instant::now();
    let polls = timeout.as_millis() / 20 + 2;
    let mut status = None;
    for _ in 0..polls {
        if let Some(s) = child.try_wait().context("cannot wait for a child")? {
            status = Some(s);
            break;
        }
        if start.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "{program} did not finish within {timeout:?}:\n{}",
            log_tail(&err_log, 10)
        );
    };
    if !status.success() {
        bail!("{program} failed ({status}):\n{}", log_tail(&err_log, 15));
    }
    std::fs::read_to_string(log).with_context(|| format!("cannot read {}", log.display()))
}

/// The last `lines` lines of a log file, each cut to 200 characters.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| l.chars().take(200).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// User + system CPU time of process `pid` so far, in clock ticks (/proc/PID/stat).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    cpu_ticks_split(pid).map(|(user, kernel)| user + kernel)
}

/// [`cpu_ticks`] apart: the process's CPU time in user space and in the kernel (utime, stime).
pub fn cpu_ticks_split(pid: u32) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // The command name may contain spaces and parentheses: the fields start after the last ')'.
    let (_, rest) = text
        .rsplit_once(')')
        .with_context(|| format!("{path}: no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .with_context(|| format!("{path}: too few fields"))?
            .parse()
            .with_context(|| format!("{path}: field {i} is not a number"))
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name and state.
    Ok((field(11)?, field(12)?))
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 where that does not answer).
pub fn ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_all_different() {
        for _ in 0..50 {
            let [a, b, c] = free_ports().expect("ports");
            assert!(a != b && b != c && a != c, "{a} {b} {c}");
        }
    }

    #[test]
    fn a_process_is_stopped_when_dropped() {
        let dir = std::env::temp_dir().join(format!("xtask-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let p = Proc::spawn("sleep", cmd, &dir.join("sleep.log")).expect("spawn");
        let pid = p.pid();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(p);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.is_empty() || stat.contains(") Z"), "{stat}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_command_past_its_timeout_is_an_error_and_a_failure_quotes_stderr() {
        let dir = std::env::temp_dir().join(format!("xtask-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut slow = Command::new("sleep");
        slow.arg("5");
        let e = run(slow, &dir.join("slow.log"), Duration::from_millis(100)).expect_err("slow");
        assert!(e.to_string().contains("did not finish"), "{e}");
        let mut fails = Command::new("sh");
        fails.args(["-c", "echo out; echo broken >&2; exit 3"]);
        let e = run(fails, &dir.join("fails.log"), Duration::from_secs(5)).expect_err("fails");
        assert!(e.to_string().contains("broken"), "{e}");
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo fine"]);
        assert_eq!(
            run(ok, &dir.join("ok.log"), Duration::from_secs(5)).expect("ok"),
            "fine\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cpu_time_of_this_process_can_be_read() {
        assert!(cpu_ticks(std::process::id()).is_ok());
        assert!(ticks_per_second() > 0);
    }
}
