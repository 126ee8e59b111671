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

/// Builds the gateway's runtime for the CPUs this process may use.
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    build_for(usable_cpus())
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
