//! The runtimes `tollgate serve` runs on, sized to the CPUs the process may use.
//!
//! On one CPU (a container limited to one, or a process pinned with `taskset`) the gateway
//! runs on tokio's current-thread scheduler: every task, the Redis client's connection
//! driver included, runs on the thread that drives the sockets, and a task woken by another
//! waits behind the tasks already ready. So the Redis commands of the requests that arrived
//! together leave in one write and their replies come back in one read, where the
//! multi-thread scheduler (even with one worker) runs the woken driver at once, one write per
//! command, and pays its cross-thread bookkeeping on every wake-up.
//!
//! With more CPUs, one worker thread per CPU serves connections, each worker its own
//! current-thread runtime accepting on the one listening socket (as nginx's workers do): a
//! connection, its requests and their store calls stay on the worker that accepted it, and
//! no task moves between threads. The main thread runs the rest (the admin endpoints,
//! reloads, the status sampler, the exporter) on a runtime of its own. The multi-thread
//! scheduler this replaces hands woken tasks between its workers and wakes an idle one to
//! take them: at the load a gateway of a fleet sees (each request finding it asleep), that
//! cost up to a fifth more CPU a request than these workers do (docs/operations.md, "Threads").
//! `std::thread::available_parallelism` honours the affinity mask and cgroup CPU quotas.
//!
//! `TOKIO_WORKER_THREADS` (tokio's own variable, which the runtime would otherwise ignore
//! because the worker count is set here) overrides the CPU count: where several gateways
//! share one machine (the reference deployment's 20 on 16 cores), each may take fewer
//! workers than the machine has CPUs instead of 20 x 16 threads contending for 16 cores; `1`
//! gives the one-thread scheduler. A value that is not a whole number from 1 to
//! [`MAX_WORKERS`] is refused with an error that says so, before anything is served.

use std::num::NonZeroUsize;
use tokio::runtime::{Handle, Runtime};

/// How the gateway runs for `cpus` usable CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// One thread runs everything.
    CurrentThread,
    /// This many worker threads serve connections, each its own current-thread runtime,
    /// beside the main thread's.
    Workers(NonZeroUsize),
}

/// How the gateway runs for `cpus` usable CPUs.
pub fn flavor(cpus: NonZeroUsize) -> Flavor {
    if cpus.get() == 1 {
        Flavor::CurrentThread
    } else {
        Flavor::Workers(cpus)
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

/// The gateway's runtimes: the main thread's, and the workers' that serve connections (none
/// when the main thread serves them itself, on one CPU).
pub struct Runtimes {
    /// The main thread's runtime (`block_on` it).
    pub main: Runtime,
    /// The workers; stopped and joined on drop, after the main runtime's work is done.
    pub workers: Workers,
}

/// Builds the gateway's runtimes: `TOKIO_WORKER_THREADS` workers when set, else one per CPU
/// this process may use.
pub fn build() -> std::io::Result<Runtimes> {
    let workers = workers_from(std::env::var_os(WORKERS_VAR).as_deref())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    build_for(workers.unwrap_or_else(usable_cpus))
}

/// Builds the gateway's runtimes for `cpus` usable CPUs (I/O and timers enabled on each).
pub fn build_for(cpus: NonZeroUsize) -> std::io::Result<Runtimes> {
    let workers = match flavor(cpus) {
        Flavor::CurrentThread => Workers::default(),
        Flavor::Workers(n) => Workers::start(n.get())?,
    };
    Ok(Runtimes {
        main: one_thread()?,
        workers,
    })
}

fn one_thread() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Worker threads, each running a current-thread runtime until told to stop.
#[derive(Default)]
pub struct Workers {
    workers: Vec<Worker>,
}

struct Worker {
    handle: Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` worker threads (`tollgate-worker-N`), each with its runtime running.
    pub fn start(n: usize) -> std::io::Result<Self> {
        let mut workers = Workers::default();
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-worker-{i}"))
                .spawn(move || {
                    let rt = match one_thread() {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
                    if tx.send(Ok((rt.handle().clone(), stop_tx))).is_err() {
                        return;
                    }
                    // Runs whatever is spawned onto it until stopped; dropping the runtime
                    // then drops what is left (connections past the shutdown's grace).
                    rt.block_on(async {
                        let _ = stop_rx.await;
                    });
                })?;
            let started = rx.recv().map_err(|_| {
                std::io::Error::other(format!("worker thread {i} ended before its runtime ran"))
            });
            let (handle, stop) = match started.and_then(|r| r) {
                Ok(started) => started,
                Err(e) => {
                    let _ = thread.join();
                    return Err(e);
                }
            };
            workers.workers.push(Worker {
                handle,
                stop: Some(stop),
                thread: Some(thread),
            });
        }
        Ok(workers)
    }

    /// Each worker's runtime, to spawn onto; empty when the main thread serves.
    pub fn handles(&self) -> Vec<Handle> {
        self.workers.iter().map(|w| w.handle.clone()).collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if let Some(stop) = w.stop.take() {
                let _ = stop.send(());
            }
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cpu_runs_on_the_current_thread_and_more_get_a_worker_each() {
        let n = |v| NonZeroUsize::new(v).expect("non-zero");
        assert_eq!(flavor(n(1)), Flavor::CurrentThread);
        assert_eq!(flavor(n(2)), Flavor::Workers(n(2)));
        assert_eq!(flavor(n(16)), Flavor::Workers(n(16)));
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
            rt.main
                .block_on(async { tokio::spawn(async { 7 }).await })
                .ok(),
            Some(7)
        );
    }

    /// Each worker runs what is spawned onto it on a thread of its own, named for it, and
    /// every worker can accept on one listening socket; dropping the workers stops and joins
    /// their threads.
    #[test]
    fn workers_run_tasks_on_their_own_threads_and_share_a_listener() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rts = build_for(NonZeroUsize::new(3).expect("3")).expect("runtimes");
        let handles = rts.workers.handles();
        assert_eq!(handles.len(), 3);
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.set_nonblocking(true).expect("nonblocking");
        let addr = socket.local_addr().expect("addr");
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        for h in &handles {
            let own = socket.try_clone().expect("a handle of the socket");
            let seen = seen_tx.clone();
            h.spawn(async move {
                let listener = tokio::net::TcpListener::from_std(own)?;
                loop {
                    let (mut s, _) = listener.accept().await?;
                    let name = std::thread::current().name().unwrap_or("").to_string();
                    let _ = seen.send(name.clone());
                    s.write_all(name.as_bytes()).await?;
                }
                #[allow(unreachable_code)]
                Ok::<_, std::io::Error>(())
            });
        }
        let names = rts.main.block_on(async {
            let mut names = Vec::new();
            for _ in 0..12 {
                let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
                let mut got = String::new();
                tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    c.read_to_string(&mut got),
                )
                .await
                .expect("answered in time")
                .expect("read");
                names.push(got);
            }
            names
        });
        for name in &names {
            assert!(name.starts_with("tollgate-worker-"), "{names:?}");
        }
        assert_eq!(seen_rx.try_iter().count(), 12);
        // Dropped, the workers stop, and the accept loops on them go with their runtimes:
        // with the test's own handle closed too, nothing listens any more.
        drop(socket);
        drop(rts);
        let refused = std::net::TcpStream::connect(addr);
        assert!(refused.is_err(), "a worker's listener outlived its runtime");
    }

    /// The one-CPU runtime has what the gateway uses: spawned tasks, sockets and timers.
    #[test]
    fn the_one_cpu_runtime_serves_sockets_and_timers() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rts = build_for(NonZeroUsize::MIN).expect("runtime");
        assert!(
            rts.workers.handles().is_empty(),
            "one CPU: the main thread serves"
        );
        let echoed = rts.main.block_on(async {
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
