//! A Redis Sentinel deployment: a master, one replica and three sentinels watching them, all
//! on free loopback ports, with timings short enough for a test to see a failover in seconds.

use crate::process::{self, START_TIMEOUT};
use crate::server::RedisServer;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a sentinel waits before it calls an unanswering master down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// The sentinels' failover timeout (also how long they wait before trying again).
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);

/// A master, a replica of it and three sentinels (quorum 2). Dropping it stops them all.
#[derive(Debug)]
pub struct RedisSentinels {
    name: String,
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<SentinelProcess>,
}

impl RedisSentinels {
    /// Starts the master, the replica (waits until it is in sync) and three sentinels (waits
    /// until each knows the replica and the two other sentinels, so a failover can happen).
    ///
    /// Panics with the logs when a process does not start or the sentinels do not agree
    /// within a bounded time.
    pub fn start() -> Self {
        let name = "tollgate-master".to_string();
        let master = RedisServer::start();
        let master_port = master.port().to_string();
        let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &master_port]);
        let synced = process::wait_until(START_TIMEOUT, || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        assert!(
            synced,
            "the replica did not sync with the master within {START_TIMEOUT:?}"
        );
        let sentinels: Vec<SentinelProcess> = (0..3)
            .map(|_| SentinelProcess::start(&name, master.port()))
            .collect();
        let set = Self {
            name,
            master,
            replica,
            sentinels,
        };
        let ready = process::wait_until(Duration::from_secs(30), || {
            set.sentinels.iter().all(|s| {
                let replicas = s.cli(&["SENTINEL", "REPLICAS", &set.name]);
                let others = s.cli(&["SENTINEL", "SENTINELS", &set.name]);
                replicas.contains(&set.replica.port().to_string())
                    && others.matches("runid").count() == 2
            })
        });
        if !ready {
            let logs: Vec<String> = set.sentinels.iter().map(|s| s.log()).collect();
            panic!(
                "the sentinels did not find the replica and each other within 30s; logs:\n{}",
                logs.join("\n----\n")
            );
        }
        set
    }

    /// The name the sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// `redis://127.0.0.1:<port>` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The master this set was started with (after a failover, a dead server or a replica).
    pub fn master(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// The replica this set was started with (after a failover, the master).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The master's port according to the first sentinel that answers.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let out = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name]);
            out.lines().nth(1).and_then(|p| p.trim().parse().ok())
        })
    }

    /// Freezes sentinel `i` (SIGSTOP): its connections stay open, and it answers nothing.
    pub fn pause_sentinel(&self, i: usize) {
        if let Some(pid) = self.sentinel_pid(i) {
            process::signal(pid, "STOP");
        }
    }

    /// Resumes sentinel `i` after [`RedisSentinels::pause_sentinel`] (SIGCONT).
    pub fn resume_sentinel(&self, i: usize) {
        if let Some(pid) = self.sentinel_pid(i) {
            process::signal(pid, "CONT");
        }
    }

    fn sentinel_pid(&self, i: usize) -> Option<u32> {
        self.sentinels.get(i)?.child.as_ref().map(Child::id)
    }

    /// Asks the sentinels for a failover (`SENTINEL FAILOVER`): the replica is promoted while
    /// the old master keeps running (it answers as a master until the sentinels demote it).
    pub fn failover(&self) -> String {
        self.sentinels
            .first()
            .map(|s| s.cli(&["SENTINEL", "FAILOVER", &self.name]))
            .unwrap_or_default()
    }

    /// Waits (at most `timeout`) until the sentinels name the replica as the master and it
    /// answers as one; true when they did.
    pub fn wait_for_failover(&self, timeout: Duration) -> bool {
        let replica = self.replica.port();
        process::wait_until(timeout, || {
            self.master_port() == Some(replica)
                && self
                    .replica
                    .cli(&["ROLE"])
                    .lines()
                    .next()
                    .is_some_and(|l| l.trim() == "master")
        })
    }
}

/// One `redis-server --sentinel` process.
#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl SentinelProcess {
    fn start(name: &str, master_port: u16) -> Self {
        let dir = process::temp_dir("sentinel");
        let mut last_log = String::new();
        for _ in 0..20 {
            let port = process::free_port();
            // Sentinel rewrites its config file: it must be a file of its own.
            let conf = dir.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} {failover}\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.display(),
                log = dir.join("redis.log").display(),
                down = DOWN_AFTER.as_millis(),
                failover = FAILOVER_TIMEOUT.as_millis(),
            );
            if let Err(e) = std::fs::write(&conf, text) {
                panic!("cannot write {}: {e}", conf.display());
            }
            let _ = std::fs::remove_file(dir.join("redis.log"));
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(c) => c,
                Err(e) => panic!("cannot spawn redis-server --sentinel: {e}"),
            };
            match process::await_start(child, port, &dir) {
                Ok(child) => {
                    return Self {
                        port,
                        dir,
                        child: Some(child),
                    }
                }
                Err((_, log)) => last_log = log,
            }
            if !last_log.contains("Address already in use") {
                break;
            }
        }
        panic!("redis-server --sentinel did not start; last log:\n{last_log}");
    }

    fn cli(&self, args: &[&str]) -> String {
        process::cli(self.port, args)
    }

    fn log(&self) -> String {
        process::read_log(&self.dir)
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
