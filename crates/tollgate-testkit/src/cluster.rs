//! A Redis Cluster of real `redis-server --cluster-enabled yes` processes, created with
//! `redis-cli --cluster create`.

use crate::process;
use crate::server::RedisServer;
use std::time::Duration;

/// How long a cluster gets to reach `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Milliseconds after which an unreachable master is failed over by its replica.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// A Redis Cluster on loopback. Node indices are stable for the cluster's life; which node is
/// a master changes after a failover, so ask [`RedisCluster::master_of_key`].
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Every node's `redis-server` arguments, for a node added later.
    extra: Vec<String>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas_per_master` replicas each (0 or 1 in practice),
    /// creates the cluster and waits (bounded) until every node reports `cluster_state:ok`.
    pub fn start(masters: usize, replicas_per_master: usize) -> Self {
        Self::start_with_args(masters, replicas_per_master, &[])
    }

    /// [`RedisCluster::start`], every node given `args` besides the cluster's own (the
    /// placeholder `{tls}` becomes each node's TLS port, as with
    /// [`RedisServer::start_with_args`]). The plain ports stay open: the cluster is created
    /// and watched through them.
    pub fn start_with_args(masters: usize, replicas_per_master: usize, args: &[&str]) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let extra: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &NODE_TIMEOUT_MS.to_string(),
            "--cluster-port",
            "{bus}",
            // Tests kill masters; a replica must take over however stale it is.
            "--cluster-replica-validity-factor",
            "0",
            // The setting a rate limiter's cluster wants: a lost shard must not stop the
            // others (the default, `yes`, answers CLUSTERDOWN for every slot while any slot
            // is uncovered).
            "--cluster-require-full-coverage",
            "no",
        ]
        .iter()
        .chain(args.iter())
        .map(|s| s.to_string())
        .collect();
        let total = masters * (1 + replicas_per_master);
        let nodes: Vec<RedisServer> = (0..total)
            .map(|i| RedisServer::start_with(extra.clone(), i as u32))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        let replicas = replicas_per_master.to_string();
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let out = nodes[0].cli(&args);
        let cluster = RedisCluster { nodes, extra };
        if !cluster.wait_ok(CLUSTER_TIMEOUT) {
            panic!("cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}; redis-cli said:\n{out}");
        }
        if replicas_per_master > 0 {
            let want = masters * replicas_per_master;
            let synced = process::wait_until(CLUSTER_TIMEOUT, || cluster.synced_replicas() >= want);
            assert!(synced, "replicas did not finish their initial sync");
        }
        cluster
    }

    /// Waits until every running node reports `cluster_state:ok` and all 16384 slots assigned.
    pub fn wait_ok(&self, timeout: Duration) -> bool {
        process::wait_until(timeout, || {
            self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                let info = n.cli(&["cluster", "info"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            })
        })
    }

    fn synced_replicas(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| {
                let info = n.cli(&["info", "replication"]);
                info.contains("role:slave") && info.contains("master_link_status:up")
            })
            .count()
    }

    /// `redis://127.0.0.1:<port>` of every node (any of them is a valid seed).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node processes, by index.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node process `i` (to kill, pause or restart it).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The index of the running node that serves `key`'s slot as a master, as the cluster
    /// currently sees it.
    pub fn master_of_key(&self, key: &str) -> Option<usize> {
        let probe = self.nodes.iter().find(|n| n.is_up())?;
        let slot: u32 = probe
            .cli(&["cluster", "keyslot", key])
            .trim()
            .parse()
            .ok()?;
        self.master_of_slot(slot)
    }

    /// The index of the running node that serves `slot` as a master, as the cluster
    /// currently sees it.
    pub fn master_of_slot(&self, slot: u32) -> Option<usize> {
        let probe = self.nodes.iter().find(|n| n.is_up())?;
        let table = probe.cli(&["cluster", "nodes"]);
        for line in table.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let mut ends = range.splitn(2, '-');
                let lo = ends.next().and_then(|s| s.parse::<u32>().ok());
                let hi = ends.next().and_then(|s| s.parse::<u32>().ok()).or(lo);
                matches!((lo, hi), (Some(lo), Some(hi)) if lo <= slot && slot <= hi)
            });
            if serves {
                let port: Option<u16> = fields[1]
                    .split(['@', ','])
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok());
                return self.nodes.iter().position(|n| Some(n.port()) == port);
            }
        }
        None
    }

    /// Hands `slot` (holding no key) to node `to` as a resharding does: `to` importing, the
    /// owner migrating, then `CLUSTER SETSLOT slot NODE to` on `to` first (which takes a new
    /// config epoch, so gossip cannot undo it), the owner, and the others; waits until the
    /// cluster says `to` serves it.
    pub fn move_empty_slot(&self, slot: u32, to: usize) -> bool {
        let Some(from) = self.master_of_slot(slot) else {
            return false;
        };
        if from == to {
            return true;
        }
        self.begin_migration(slot, to) && self.hand_over(slot, from, to)
    }

    /// The end of a resharding of `slot` from `from` to `to` (its keys moved):
    /// `CLUSTER SETSLOT slot NODE to` on `to` first, the owner, then the others; whether the
    /// cluster then says `to` serves it (bounded wait).
    fn hand_over(&self, slot: u32, from: usize, to: usize) -> bool {
        let to_id = self.nodes[to].cli(&["cluster", "myid"]).trim().to_string();
        let slot_arg = slot.to_string();
        let mut order: Vec<usize> = vec![to, from];
        order.extend(
            (0..self.nodes.len()).filter(|&i| i != to && i != from && self.nodes[i].is_up()),
        );
        for i in order {
            let _ = self.nodes[i].cli(&["cluster", "setslot", &slot_arg, "node", &to_id]);
        }
        process::wait_until(CLUSTER_TIMEOUT, || self.master_of_slot(slot) == Some(to))
    }

    /// Adds a master serving no slot, as scaling a cluster out does (`redis-cli --cluster
    /// add-node`), and waits (bounded) until every running node knows it and the cluster is
    /// ok. Returns its index.
    pub fn add_master(&mut self) -> usize {
        let i = self.nodes.len();
        let node = RedisServer::start_with(self.extra.clone(), i as u32);
        let new = format!("127.0.0.1:{}", node.port());
        let Some(seed) = self.nodes.iter().find(|n| n.is_up()) else {
            panic!("no running node to join");
        };
        let existing = format!("127.0.0.1:{}", seed.port());
        let out = seed.cli(&["--cluster", "add-node", &new, &existing]);
        self.nodes.push(node);
        let port = format!(":{}", self.nodes[i].port());
        let known = process::wait_until(CLUSTER_TIMEOUT, || {
            self.nodes
                .iter()
                .filter(|n| n.is_up())
                .all(|n| n.cli(&["cluster", "nodes"]).contains(&port))
        });
        assert!(known, "the new node did not join; redis-cli said:\n{out}");
        assert!(
            self.wait_ok(CLUSTER_TIMEOUT),
            "the cluster is not ok after a join"
        );
        i
    }

    /// Removes master `i`, which serves no slot any more (scaling a cluster in): `redis-cli
    /// --cluster del-node` (every other node forgets it, and it is shut down), then its
    /// process is stopped for good; waits (bounded) until no running node lists it and the
    /// cluster is ok. Whether it went.
    pub fn remove_master(&mut self, i: usize) -> bool {
        let id = self.nodes[i].cli(&["cluster", "myid"]).trim().to_string();
        let port = format!(":{}", self.nodes[i].port());
        let Some(other) = (0..self.nodes.len()).find(|&j| j != i && self.nodes[j].is_up()) else {
            return false;
        };
        let entry = format!("127.0.0.1:{}", self.nodes[other].port());
        let _ = self.nodes[other].cli(&["--cluster", "del-node", &entry, &id]);
        self.nodes[i].kill();
        process::wait_until(CLUSTER_TIMEOUT, || {
            self.nodes
                .iter()
                .filter(|n| n.is_up())
                .all(|n| !n.cli(&["cluster", "nodes"]).contains(&port))
        }) && self.wait_ok(CLUSTER_TIMEOUT)
    }

    /// Hands `slot` and the keys it holds to node `to`, as a resharding does: `to` importing,
    /// the owner migrating, its keys moved one by one with `MIGRATE` (`pause` after each, so
    /// that calls meet a slot half moved), then the slot given to `to` as
    /// [`RedisCluster::move_empty_slot`] gives it. An error says which step failed and how: a
    /// `MIGRATE` answered `BUSYKEY` found the key already written on `to`.
    pub fn move_slot(&self, slot: u32, to: usize, pause: Duration) -> Result<(), String> {
        let Some(from) = self.master_of_slot(slot) else {
            return Err(format!("no master serves slot {slot}"));
        };
        if from == to {
            return Ok(());
        }
        if !self.begin_migration(slot, to) {
            return Err(format!("the migration of slot {slot} did not begin"));
        }
        let slot_arg = slot.to_string();
        let port = self.nodes[to].port().to_string();
        // Bounded: a slot of a test holds at most a few hundred keys.
        for _ in 0..10_000 {
            let listed = self.nodes[from].cli(&["cluster", "getkeysinslot", &slot_arg, "1"]);
            let Some(key) = listed.lines().map(str::trim).find(|k| !k.is_empty()) else {
                break;
            };
            let out = self.nodes[from].cli(&["migrate", "127.0.0.1", &port, key, "0", "5000"]);
            if !out.contains("OK") && !out.contains("NOKEY") {
                return Err(format!("MIGRATE {key} answered {}", out.trim()));
            }
            std::thread::sleep(pause);
        }
        if !self.hand_over(slot, from, to) {
            return Err(format!("slot {slot} was not handed to node {to}"));
        }
        match self.nodes[from]
            .cli(&["cluster", "countkeysinslot", &slot_arg])
            .trim()
        {
            "0" => Ok(()),
            n => Err(format!("{n} keys of slot {slot} stayed behind")),
        }
    }

    /// The master serving `slot`, and another master (the lowest index): a slot's owner and
    /// where to move it. Panics when no master serves it or there is no other.
    pub fn owner_and_other(&self, slot: u32) -> (usize, usize) {
        let Some(from) = self.master_of_slot(slot) else {
            panic!("no master serves slot {slot}");
        };
        match self.master_indices().into_iter().find(|&i| i != from) {
            Some(to) => (from, to),
            None => panic!("no master other than {from}"),
        }
    }

    /// Starts handing `slot` to node `to` and stops there, as a resharding does before it
    /// moves the slot's keys: `to` importing, the owner migrating. The owner then answers ASK
    /// for a key of the slot it does not hold, and `to` serves such a key to a client that
    /// sends ASKING first. Whether both nodes took it.
    pub fn begin_migration(&self, slot: u32, to: usize) -> bool {
        let Some(from) = self.master_of_slot(slot) else {
            return false;
        };
        if from == to {
            return false;
        }
        let id = |i: usize| self.nodes[i].cli(&["cluster", "myid"]).trim().to_string();
        let (from_id, to_id) = (id(from), id(to));
        let slot_arg = slot.to_string();
        self.nodes[to]
            .cli(&["cluster", "setslot", &slot_arg, "importing", &from_id])
            .contains("OK")
            && self.nodes[from]
                .cli(&["cluster", "setslot", &slot_arg, "migrating", &to_id])
                .contains("OK")
    }

    /// Kills (SIGKILL) the master serving `key` and returns its index.
    pub fn kill_master_of_key(&mut self, key: &str) -> usize {
        let i = match self.master_of_key(key) {
            Some(i) => i,
            None => panic!("no master serves {key}"),
        };
        self.nodes[i].kill();
        i
    }

    /// Kills master `i` of the masters in node order (SIGKILL).
    pub fn kill_master(&mut self, i: usize) -> usize {
        let masters = self.master_indices();
        let idx = masters[i];
        self.nodes[idx].kill();
        idx
    }

    /// Indices of the running nodes whose role is master.
    pub fn master_indices(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].pid().is_some()
                    && self.nodes[i]
                        .cli(&["info", "replication"])
                        .contains("role:master")
            })
            .collect()
    }

    /// Waits until a node other than `dead` serves `key` as master and the cluster is ok
    /// again on the running nodes (after a master was killed, its replica takes over).
    pub fn wait_failover(&self, key: &str, dead: usize, timeout: Duration) -> bool {
        process::wait_until(timeout, || {
            matches!(self.master_of_key(key), Some(i) if i != dead) && self.wait_ok(Duration::ZERO)
        })
    }

    /// A manual, coordinated failover: replica node `replica` becomes master
    /// (`CLUSTER FAILOVER`), waiting until it reports the master role.
    pub fn failover(&self, replica: usize) -> bool {
        let node = &self.nodes[replica];
        let _ = node.cli(&["cluster", "failover"]);
        process::wait_until(CLUSTER_TIMEOUT, || {
            node.cli(&["info", "replication"]).contains("role:master")
        }) && self.wait_ok(CLUSTER_TIMEOUT)
    }
}
