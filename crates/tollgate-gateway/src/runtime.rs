//! The runtime `tollgate serve` runs on, sized to the CPUs the process may use.
//!
//! On one CPU (a container limited to one, or a process pinned with `taskset`) the gateway
//! runs on tokio's current-thread scheduler: every task, the Redis client's connection
//! driver included, runs on the thread that drives the sockets, and a task woken by another
//! waits behind the tasks already ready. So the Redis commands of the requests that arrived
//! together leave in one write and their replies come back in one read, where the
//! multi-thread scheduler (even with one worker) runs the woken driver at once, one write per
//! command, and pays its cross-thread bookkeeping on every wake-up. With more CPUs the
//! multi-thread scheduler spreads connections over one worker per CPU.
//! `std::thread::available_parallelism` honours the affinity mask and cgroup CPU quotas.
//!
//! `TOKIO_WORKER_THREADS` (tokio's own variable, which the runtime would otherwise ignore
//! because the worker count is set here) overrides the CPU count: where several gateways
//! share one machine (the reference deployment's 20 on 16 cores), each may take fewer
//! workers than the machine has CPUs instead of 20 x 16 threads contending for 16 cores; `1`
//! gives the one-thread scheduler. A value that is not a whole number from 1 to
//! [`MAX_WORKERS`] is refused with an error that says so, before anything is served.

use std::num::NonZeroUsize;

/// Which scheduler a runtime for `cpus` usable CPUs gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// One thread runs everything.
    CurrentThread,
    /// One worker thread per CPU.
    MultiThread(NonZeroUsize),
}

/// The scheduler for `cpus` usable CPUs.
pub fn flavor(cpus: NonZeroUsize) -> Flavor {
    if cpus.get() == 1 {
        Flavor::CurrentThread
    } else {
        Flavor::MultiThread(cpus)
    }
}

/// The CPUs this process may use (1 when it cannot tell).
pub fn usable_cpus() -> NonZeroUsize {
    std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

/// The variable that sets the worker count.
pub const WORKERS_VAR: &str = "TOKIO_WORKER_THREADS";

/// The most workers `TOKIO_WORKER_THREADS` may ask for.
pub const MAX_WORKERS: usize = 1024;

/// The worker count `TOKIO_WORKER_THREADS` sets (`value`), or `None` when it is unset.
pub fn workers_from(value: Option<&std::ffi::OsStr>) -> Result<Option<NonZeroUsize>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    let text = value.to_str().map(str::trim).unwrap_or_default();
    match text.parse::<usize>().ok().and_then(NonZeroUsize::new) {
        Some(n) if n.get() <= MAX_WORKERS => Ok(Some(n)),
        _ => Err(format!(
            "{WORKERS_VAR}={:?}: must be a whole number of worker threads from 1 to {MAX_WORKERS}",
            value.to_string_lossy()
        )),
    }
}

/// Builds the gateway's runtime: `TOKIO_WORKER_THREADS` workers when set, else one per CPU
/// this process may use.
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    let workers = workers_from(std::env::var_os(WORKERS_VAR).as_deref())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    build_for(workers.unwrap_or_else(usable_cpus))
}

/// Builds the gateway's runtime for `cpus` usable CPUs (I/O and timers enabled).
pub fn build_for(cpus: NonZeroUsize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match flavor(cpus) {
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Flavor::MultiThread(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.get());
            b
        }
    };
    builder.enable_all().build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cpu_runs_on_the_current_thread_and_more_get_a_worker_each() {
        let n = |v| NonZeroUsize::new(v).expect("non-zero");
        assert_eq!(flavor(n(1)), Flavor::CurrentThread);
        assert_eq!(flavor(n(2)), Flavor::MultiThread(n(2)));
        assert_eq!(flavor(n(16)), Flavor::MultiThread(n(16)));
    }

    #[test]
    fn tokio_worker_threads_sets_the_workers_and_a_bad_value_says_what_is_allowed() {
        use std::ffi::OsStr;
        let n = |v| NonZeroUsize::new(v).expect("non-zero");
        assert_eq!(workers_from(None), Ok(None));
        assert_eq!(workers_from(Some(OsStr::new("2"))), Ok(Some(n(2))));
        assert_eq!(workers_from(Some(OsStr::new(" 1 "))), Ok(Some(n(1))));
        assert_eq!(workers_from(Some(OsStr::new("1024"))), Ok(Some(n(1024))));
        for bad in [
            "0",
            "-1",
            "1025",
            "two",
            "",
            "99999999999999999999999",
            "1.5",
        ] {
            let e = workers_from(Some(OsStr::new(bad))).expect_err(bad);
            assert!(
                e.contains("TOKIO_WORKER_THREADS") && e.contains("1 to 1024"),
                "{e}"
            );
        }
        // One worker is the one-thread scheduler, as one CPU is.
        assert_eq!(flavor(n(1)), Flavor::CurrentThread);
    }

    #[test]
    fn the_runtime_builds_and_runs_a_task() {
        let rt = build().expect("runtime");
        assert_eq!(
            rt.block_on(async { tokio::spawn(async { 7 }).await }).ok(),
            Some(7)
        );
    }

    /// The one-CPU runtime has what the gateway uses: spawned tasks, sockets and timers.
    #[test]
    fn the_one_cpu_runtime_serves_sockets_and_timers() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = build_for(NonZeroUsize::MIN).expect("runtime");
        let echoed = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let server = tokio::spawn(async move {
                let (mut s, _) = listener.accept().await?;
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).await?;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                s.write_all(&buf).await?;
                Ok::<_, std::io::Error>(())
            });
            let mut c = tokio::net::TcpStream::connect(addr).await?;
            c.write_all(b"ping").await?;
            let mut got = [0u8; 4];
            tokio::time::timeout(std::time::Duration::from_secs(5), c.read_exact(&mut got))
                .await
                .map_err(std::io::Error::other)??;
            server.await.map_err(std::io::Error::other)??;
            Ok::<_, std::io::Error>(got)
        });
        assert_eq!(echoed.expect("echo").as_slice(), b"ping");
    }
}
