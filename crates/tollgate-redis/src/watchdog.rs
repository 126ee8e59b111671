//! redis-rs's Cluster client, built again when it stops answering.
//!
//! Seen with `max_batch = 1` and a slot moved to a new master under load
//! (`a_cluster_scaled_out_and_in_under_load_decides_exactly_and_keeps_answering`, four copies
//! at once): in one run of twenty, every call after the slot's handover timed out, the last the
//! test made 35 s after the first. The likely cause, from redis-rs 1.8.1's source (not traced
//! at run time): its cluster connection runs every call through one task, which stops taking
//! calls while it reads a new slot map after a MOVED (its "recovery"); that reading needs the
//! client's lock, a call the task had already started may hold or wait on that lock, and the
//! task does not poll that call while it recovers, so the recovery never ends.
//!
//! The store's keep-alive (every 500 ms) also asks one node, chosen at random, for a PING
//! through that client ([`Shared::watch`]). Any answer, an error too (a refused connection, a
//! node's error reply), says the client's task still takes calls; only silence does not. After
//! [`STUCK_AFTER`] of silence the client is built again from its seeds and takes the calls that
//! follow; the calls already made on the old one finish there (each holds the old connection).
//! A rebuild that cannot connect (the whole Cluster unreachable, which is not the client's
//! fault) doubles the silence the next one waits for, up to [`MOST_STUCK_AFTER`].
//! A stuck task of redis-rs's cannot be stopped from outside, so it stays, with its sockets,
//! until the process ends: one per time the watchdog acted (`rebuilds`, logged).

use arc_swap::ArcSwap;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long redis-rs's client may answer nothing before it is built again: about three
/// probes in a row, each given [`PROBE_TIMEOUT`] after a keep-alive PING given as long.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(2);

/// After a rebuild that could not connect (the whole Cluster unreachable: then the old client
/// is not the trouble), the next waits twice as long, up to this.
const MOST_STUCK_AFTER: Duration = Duration::from_secs(32);

/// The longest the watchdog's PING waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The longest a new client may take to connect (it reads the slot map and connects to every
/// node): past it, the old one stays until the next try.
const REBUILD_TIMEOUT: Duration = Duration::from_secs(5);

/// redis-rs's cluster connection, the client that builds it again, and how often it did.
pub(crate) struct Shared {
    conn: ArcSwap<ClusterConnection>,
    client: ClusterClient,
    rebuilds: AtomicU64,
}

impl Shared {
    pub(crate) fn new(client: ClusterClient, conn: ClusterConnection) -> Self {
        Self {
            conn: ArcSwap::from_pointee(conn),
            client,
            rebuilds: AtomicU64::new(0),
        }
    }

    /// The connection calls go on now.
    pub(crate) fn conn(&self) -> ClusterConnection {
        ClusterConnection::clone(&self.conn.load())
    }

    /// Calls from now on go on `conn` (tests: a connection that answers nothing).
    pub(crate) fn replace(&self, conn: ClusterConnection) {
        self.conn.store(Arc::new(conn));
    }

    /// How many times the client was built again.
    pub(crate) fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// One probe of the client (a PING to a node chosen at random), the client built again
    /// when `watch` says it has been silent too long.
    pub(crate) async fn watch(&self, watch: &mut Watch) {
        let ping = redis::cmd("PING");
        let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let probe =
            tokio::time::timeout(PROBE_TIMEOUT, self.conn().route_command(ping, random)).await;
        let answered = match probe {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => !e.is_timeout(),
            Err(_) => false,
        };
        if watch.stuck(answered, Instant::now()) && !self.rebuild().await {
            watch.failed();
        }
    }

    /// A new connection from the client, put where calls take it; whether one connected.
    async fn rebuild(&self) -> bool {
        const SILENT: &str = "redis-rs's Redis Cluster client answers nothing";
        match tokio::time::timeout(REBUILD_TIMEOUT, self.client.get_async_connection()).await {
            Ok(Ok(fresh)) => {
                self.conn.store(Arc::new(fresh));
                let n = self.rebuilds.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(
                    rebuilds = n,
                    "{SILENT} (for {} s); built again",
                    STUCK_AFTER.as_secs()
                );
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "{SILENT}, and a new one could not connect");
                false
            }
            Err(_) => {
                tracing::warn!(
                    "{SILENT}, and a new one did not connect in {} s",
                    REBUILD_TIMEOUT.as_secs()
                );
                false
            }
        }
    }
}

/// Since when the probes have gone unanswered, and how long a silence builds the client again.
#[derive(Debug)]
pub(crate) struct Watch {
    silent_since: Option<Instant>,
    after: Duration,
}

impl Default for Watch {
    fn default() -> Self {
        Self {
            silent_since: None,
            after: STUCK_AFTER,
        }
    }
}

impl Watch {
    /// Whether, after a probe at `now` (`answered` or not), the client is to be built again:
    /// silent for [`STUCK_AFTER`] (longer after rebuilds that failed, [`Watch::failed`]) since
    /// the first unanswered probe, or since the last time it said so.
    fn stuck(&mut self, answered: bool, now: Instant) -> bool {
        if answered {
            *self = Self::default();
            return false;
        }
        let since = *self.silent_since.get_or_insert(now);
        if now.saturating_duration_since(since) < self.after {
            return false;
        }
        self.silent_since = Some(now);
        true
    }

    /// The rebuild [`Watch::stuck`] asked for could not connect: the next waits twice as long.
    fn failed(&mut self) {
        self.after = (self.after * 2).min(MOST_STUCK_AFTER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_for_the_bound_and_only_that_builds_the_client_again() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = Watch::default();
        assert!(!w.stuck(false, at(0)));
        assert!(!w.stuck(false, at(1_999)));
        // An answer, even late, starts the count again.
        assert!(!w.stuck(true, at(2_100)));
        assert!(!w.stuck(false, at(2_600)));
        assert!(!w.stuck(false, at(4_500)));
        assert!(w.stuck(false, at(4_600)), "silent since 2,600 ms");
        // Once built again, the next try only after as long again.
        assert!(!w.stuck(false, at(5_000)));
        assert!(!w.stuck(false, at(6_599)));
        assert!(w.stuck(false, at(6_600)));
        // A clock read earlier than the last (none with Instant, but no panic either).
        assert!(!w.stuck(false, at(6_000)));
        // Rebuilds that could not connect: 4 s, then 8 s, up to 32 s; an answer starts again.
        w.failed();
        assert!(!w.stuck(false, at(10_599)));
        assert!(w.stuck(false, at(10_600)));
        for _ in 0..10 {
            w.failed();
        }
        assert!(!w.stuck(false, at(42_599)));
        assert!(w.stuck(false, at(42_600)), "at most 32 s");
        assert!(!w.stuck(true, at(43_000)));
        assert!(!w.stuck(false, at(43_100)));
        assert!(w.stuck(false, at(45_100)), "2 s again after an answer");
    }
}
