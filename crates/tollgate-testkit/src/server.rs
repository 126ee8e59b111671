//! One `redis-server` process on a free loopback port.

use crate::process::{self, START_TIMEOUT};
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

/// A `redis-server` this test started: loopback only, no persistence, its own temp dir.
/// Dropping it kills the process and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// The TLS port, when the arguments used `{tls}`.
    tls_port: Option<u16>,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits (bounded) until it answers PING.
    ///
    /// Panics with a clear message when `redis-server` is not installed or does not start.
    pub fn start() -> Self {
        Self::start_with(Vec::new(), 0)
    }

    /// Starts a server with extra `redis-server` arguments (for example
    /// `["--requirepass", "secret"]`). The placeholder `{tls}` is replaced by another free
    /// port (for `--tls-port {tls}`); [`RedisServer::tls_port`] tells which. The plain port
    /// stays open either way: the testkit pings it to know the server is up.
    pub fn start_with_args(args: &[&str]) -> Self {
        Self::start_with(args.iter().map(|s| s.to_string()).collect(), 0)
    }

    /// Starts a server with extra `redis-server` arguments. `extra` may contain the
    /// placeholders `{bus}` (the cluster bus) and `{tls}` (the TLS port), each replaced by
    /// another free port.
    pub(crate) fn start_with(extra: Vec<String>, attempt_seed: u32) -> Self {
        crate::start_clear_of_the_hour();
        let dir = process::temp_dir(&format!("redis{attempt_seed}"));
        let mut server = RedisServer {
            port: 0,
            tls_port: None,
            dir,
            extra: Vec::new(),
            child: None,
        };
        let uses_tls = extra.iter().any(|a| a.contains("{tls}"));
        let mut last_log = String::new();
        // Another process may grab the port between our probe and redis-server's bind.
        for _ in 0..20 {
            server.port = process::free_port();
            let bus = process::free_port().to_string();
            server.tls_port = uses_tls.then(process::free_port);
            let tls = server.tls_port.map(|p| p.to_string()).unwrap_or_default();
            server.extra = extra
                .iter()
                .map(|a| a.replace("{bus}", &bus).replace("{tls}", &tls))
                .collect();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(log) => last_log = log,
            }
        }
        panic!("redis-server did not start in 20 attempts; last log:\n{last_log}");
    }

    /// Spawns the process on `self.port` and waits for PING; on failure returns the log.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let _ = std::fs::remove_file(self.dir.join("redis.log"));
        let child = process::spawn_server(self.port, &self.dir, &self.extra);
        let port = self.port;
        let (exited, log) = match process::await_start(child, port, &self.dir) {
            Ok(child) => {
                self.child = Some(child);
                return Ok(());
            }
            Err(failed) => failed,
        };
        if exited && log.contains("Address already in use") {
            return Err(log);
        }
        panic!(
            "redis-server on port {port} did not answer PING within {START_TIMEOUT:?}; log:\n{log}"
        );
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TLS port (127.0.0.1), when the server was started with `{tls}` in its arguments.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `rediss://127.0.0.1:<tls port>`, when the server has a TLS port.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    /// The OS process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process is running and answers PING.
    pub fn is_up(&self) -> bool {
        self.child.is_some() && process::pings(self.port)
    }

    /// Kills the process with SIGKILL (a crash: nothing is saved) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            process::signal(pid, "STOP");
        }
    }

    /// Resumes a paused process (SIGCONT).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            process::signal(pid, "CONT");
        }
    }

    /// Kills the process if it runs and starts a new one on the same port (an empty server:
    /// no data, no script cache), waiting until it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        // The port was ours a moment ago; a listener of another process is unlikely but
        // possible, so retry a few times before giving up.
        for _ in 0..50 {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        panic!("redis-server could not restart on port {}", self.port);
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        process::cli(self.port, args)
    }

    /// The directory holding its log (and, in a cluster, nodes.conf).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
