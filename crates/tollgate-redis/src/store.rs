//! The store: connections (standalone or cluster), key layout, one script call per plan (per
//! slot on a Redis Cluster).

use crate::batch_script::{
    batch_script, batch_script_across, push_batch_call, CallPlan, ELSEWHERE,
};
use crate::command::{joined, Args, Packed};
use crate::config::{redact, RedisConfig, StoreClock, CONNECT_TIMEOUT};
use crate::direct::Many;
use crate::error::{is_noscript, RedisStoreError};
use crate::keys::Keys;
use crate::lane::{Answer, Forms, Job, Lane, NodeConn, PlanJob, Room, Waiting};
use crate::lease::{parse_lease, Lease, LeaseJob, LeaseRequest};
use crate::reply::reply_of;
use crate::script::{
    generic_script, lease_script, parse_reply, plan_script, Form, LimitHash, Quotas, Reply,
    RuleShape, Script,
};
use crate::script::{
    lease_batch_script, lease_batch_script_across, settle_script, settle_script_across,
    ACROSS_SLOTS_SHEBANG,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::{Cmd, ErrorKind, IntoConnectionInfo, RedisError};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::RwLock;
use tokio::sync::oneshot;
use tollgate_core::{Check, ClientKey, Micros, Mode, Rule, Verdict};

/// The largest cost sent to the script. Any cost above `MAX_LIMIT` is denied outright, so
/// clamping to 2^53 (exact in Lua) changes no decision.
const MAX_COST: u64 = 1 << 53;

/// The most settle items one script call carries (each adds a key and seven arguments).
const SETTLE_CHUNK: usize = 256;

/// One charge to settle, release or renew (see `scripts/settle.lua`).
#[derive(Debug, Clone, Copy)]
pub struct SettleItem<'a> {
    /// Whose state.
    pub client: ClientKey,
    /// Under which rule.
    pub rule: &'a Rule,
    /// The units charged (the estimate) or held.
    pub units: u64,
    /// The store's instant of the charge, or of the hold's last renewal.
    pub at: Micros,
    /// The real cost (a concurrency hold: its release), or `None` to renew a hold.
    pub real: Option<u64>,
}

/// Units of a charge nothing recorded, to give back (Envoy's negative hits; see
/// `scripts/settle.lua` and `tollgate_core::Limit::give_back`).
#[derive(Debug, Clone, Copy)]
pub struct GiveBackItem<'a> {
    /// Whose state.
    pub client: ClientKey,
    /// Under which rule.
    pub rule: &'a Rule,
    /// The units to give back (fewer go back when the state holds fewer).
    pub units: u64,
}

/// One item of a settle script call: `real` is the real cost, -1 (renew) or -2 (give back).
struct SettleArgs<'a> {
    client: ClientKey,
    rule: &'a Rule,
    units: u64,
    at: Micros,
    real: i64,
}

/// `real` of a give-back in `scripts/settle.lua`.
const GIVE_BACK: i64 = -2;

/// A Redis or Redis Cluster store. Clones share the connections: concurrent calls are
/// pipelined on one multiplexed connection per server, never one connection per request.
///
/// It reconnects by itself: after the server restarts (or a cluster fails over) calls fail
/// fast with a transient error until the server answers again, then succeed, reloading the
/// script where the server's cache is empty.
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: Arc<str>,
    clock: StoreClock,
    ttl_floor_ms: Option<u64>,
    /// The plan scripts this store has, by shape: loaded into its server(s) (`prepare`, or
    /// the first use of a form by a plan that does not coalesce), or handed to a lane, whose
    /// first call of it loads it (see [`RedisStore::lane_script`]). One lookup a plan finds
    /// its script.
    ready: Ready,
    /// One script load at a time: a burst of first uses of a shape loads it once.
    loading: Arc<tokio::sync::Mutex<()>>,
    /// Where plans queue while a call is in flight (see `lane.rs`).
    lanes: Arc<Lanes>,
    /// The plan forms its lanes' batch scripts are generated for (see `lane::Forms`).
    forms: Arc<Forms>,
    max_batch: usize,
    call_timeout: std::time::Duration,
    /// The connection the coalesced calls go on (`direct.rs`).
    lane_conn: LaneConn,
    /// PINGs the shared connection (see [`KEEP_ALIVE`]) while a clone lives.
    _keep_alive: Arc<KeepAlive>,
}

/// The lanes of coalesced calls: one for a standalone server (or the master the sentinels
/// name); on a Cluster one per node (the across-slots batch scripts), and one per hash slot for
/// the calls of slots whose node is not known (no table yet, or servers older than Redis 7).
enum Lanes {
    One(Arc<Lane>),
    Slots {
        slots: Box<[std::sync::OnceLock<Arc<Lane>>]>,
        nodes: NodeLanes,
    },
}

/// Which node serves each slot, as the last `CLUSTER SLOTS` said, as a lane per node. A stale
/// table costs no decision: a plan whose key the node does not serve is answered ELSEWHERE by
/// the batch script and runs alone, and that asks for a new table.
#[derive(Default)]
struct NodeLanes {
    /// The lane of each slot's node (`None`: unknown, or the servers predate Redis 7's
    /// script flags, so there is none).
    table: RwLock<Option<NodeTable>>,
    /// A refresh is running.
    refreshing: std::sync::atomic::AtomicBool,
    /// When the last refresh began (refreshes are at least [`NODE_REFRESH_EVERY`] apart).
    last: std::sync::Mutex<Option<std::time::Instant>>,
    /// The servers refused the across-slots flag: slot lanes only, from then on.
    unsupported: std::sync::atomic::AtomicBool,
}

/// The lane of each of the 16384 slots' node (`None`: no master serves the slot).
type NodeTable = Arc<[Option<Arc<Lane>>]>;

/// The least time between two reads of a Cluster's slot table.
const NODE_REFRESH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Lanes {
    fn new(cluster: bool) -> Self {
        if cluster {
            Lanes::Slots {
                slots: (0..16384).map(|_| std::sync::OnceLock::new()).collect(),
                nodes: NodeLanes::default(),
            }
        } else {
            Lanes::One(Arc::default())
        }
    }

    /// The lane of calls whose keys are all in `client`'s slot (or on the one server).
    fn of(&self, client: &ClientKey) -> &Arc<Lane> {
        match self {
            Lanes::One(lane) => lane,
            Lanes::Slots { slots, .. } => {
                let slot = usize::from(client.cluster_slot()) % slots.len();
                slots[slot].get_or_init(Arc::default)
            }
        }
    }

    /// The lane of a plan whose keys are all in `client`'s slot: its node's when known; and
    /// whether the node table should be read again (none yet, and the servers may have one).
    fn of_plan(&self, client: &ClientKey) -> (Arc<Lane>, bool) {
        if let Lanes::Slots { nodes, .. } = self {
            let table = nodes
                .table
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match table.as_ref() {
                Some(t) => {
                    if let Some(Some(lane)) = t.get(usize::from(client.cluster_slot())) {
                        return (Arc::clone(lane), false);
                    }
                }
                None => {
                    let missing = !nodes.unsupported.load(std::sync::atomic::Ordering::Relaxed);
                    return (Arc::clone(self.of(client)), missing);
                }
            }
        }
        (Arc::clone(self.of(client)), false)
    }
}

/// Where a lane's calls go.
#[derive(Clone)]
enum LaneConn {
    /// On redis-rs's connection, like every other call: a Cluster, `max_batch = 1`, or a URL
    /// the store's own connection does not take.
    Shared,
    /// A standalone server's own connection.
    Own(Arc<crate::direct::Direct>),
    /// The own connection to the master the sentinels name (`sentinel.rs`).
    SentinelMaster,
    /// A Cluster's: each node's lane has its own connection (`direct.rs`, [`Lane::node`]) to
    /// the address the node table gives, with this (the first URL's) credentials and TLS;
    /// a slot's lane (its node not known) and every other call use redis-rs's cluster
    /// connection.
    ClusterNodes(Box<redis::ConnectionInfo>),
}

/// How a call goes: on the store's shared connections (redis-rs's), or as a lane's call
/// (on the lane's own connection where it has one).
#[derive(Clone, Copy)]
pub(crate) enum Via<'a> {
    Shared,
    Lane(&'a Lane),
}

/// The store's own connection a lane's call goes on.
#[derive(Clone, Copy)]
enum Own<'a> {
    Standalone(&'a crate::direct::Direct, &'a ConnectionManager),
    Sentinel(&'a crate::sentinel::SentinelConnection),
    Node(&'a crate::direct::Direct),
}

/// Reads the Cluster's node table again (at most once a second,
/// [`RedisStore::refresh_nodes_soon`]) when dropped before its node's call was answered.
struct RefreshUnlessAnswered<'a> {
    store: &'a RedisStore,
    answered: bool,
}

impl Drop for RefreshUnlessAnswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.store.refresh_nodes_soon();
        }
    }
}

/// Scripts loaded into a store's server(s), by form.
type Ready = Arc<RwLock<HashMap<Form, Arc<Script>, LimitHash>>>;

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(crate::resend::Cluster),
    Sentinel(crate::sentinel::SentinelConnection),
}

impl Connection {
    /// `cmd`'s reply; an error reply is an `Err`, one inside an array stays where it is. On a
    /// Cluster, sent again after an ASK only when `follows_ask` (`resend.rs`).
    async fn query(&self, cmd: &Cmd, follows_ask: bool) -> Result<redis::Value, RedisError> {
        match self {
            Connection::Standalone(c) => reply_of(&mut c.clone(), cmd).await,
            Connection::Cluster(c) => c.query(cmd, follows_ask).await,
            Connection::Sentinel(c) => c.query(cmd).await,
        }
    }
}

/// How often the store PINGs its shared connections (redis-rs's: script loads, settles,
/// readiness, the plans that do not coalesce, and every plan with `max_batch = 1`; on a
/// Cluster, every node). A server with a `timeout` closes a connection idle that many seconds
/// (a whole number, at least 1), and redis-rs learns of it only from the next call, which
/// fails: the first request after a quiet spell followed its failure policy. Twice a second
/// keeps every connection busier than any `timeout`; a PING that fails (the server went away)
/// also starts the reconnection before a request needs it. The store's own connections
/// (`direct.rs`) check their socket before each call instead.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_millis(500);

/// PINGs `conn` every [`KEEP_ALIVE`], until [`KeepAlive`] ends it; on a Cluster, also watches
/// redis-rs's client (`watchdog.rs`).
async fn keep_alive(conn: Connection) {
    let mut tick = tokio::time::interval(KEEP_ALIVE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ping = redis::cmd("PING");
    let mut watch = crate::watchdog::Watch::default();
    loop {
        tick.tick().await;
        // Its answer does not matter: a failure is seen by redis-rs, which reconnects.
        let _ = tokio::time::timeout(KEEP_ALIVE, conn.query(&ping, true)).await;
        if let Connection::Cluster(c) = &conn {
            c.shared().watch(&mut watch).await;
        }
    }
}

/// The keep-alive task of a store, held by every clone: the last one dropped ends the task,
/// and with it the task's handle on the connection, which then closes as the store's own do.
struct KeepAlive(tokio::task::AbortHandle);

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            Connection::Standalone(_) => "standalone",
            Connection::Cluster(_) => "cluster",
            Connection::Sentinel(_) => "sentinel",
        };
        f.debug_struct("RedisStore")
            .field("kind", &kind)
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .finish()
    }
}

/// A check whose (client, rule) an earlier check of the plan has too: compared by the rule's
/// id first (an integer) and its name only then; with a set past 16 checks, so a plan of
/// hundreds of items costs no quadratic scan.
fn twice<'c, 'r>(checks: &'c [Check<'r>]) -> Option<&'c Check<'r>> {
    let same = |a: &Check<'_>, b: &Check<'_>| {
        a.client == b.client && a.rule.id() == b.rule.id() && a.rule.name() == b.rule.name()
    };
    if checks.len() <= 16 {
        return checks
            .iter()
            .enumerate()
            .find(|(i, c)| checks[..*i].iter().any(|o| same(o, c)))
            .map(|(_, c)| c);
    }
    let mut seen: std::collections::HashMap<(ClientKey, u64), Vec<&str>> =
        std::collections::HashMap::with_capacity(checks.len());
    checks.iter().find(|c| {
        let names = seen.entry((c.client, c.rule.id())).or_default();
        let dup = names.contains(&c.rule.name());
        names.push(c.rule.name());
        dup
    })
}

impl RedisStore {
    /// Connects (standalone: exactly one URL; cluster: seed URLs) and loads the script.
    /// Fails when the server cannot be reached now; afterwards the store reconnects by itself.
    pub async fn connect(config: RedisConfig) -> Result<Self, RedisStoreError> {
        if config.urls.is_empty() {
            return Err(RedisStoreError::config("no Redis URL given"));
        }
        let conn = if let Some(master) = &config.sentinel_master {
            Connection::Sentinel(
                crate::sentinel::SentinelConnection::connect(
                    &config.urls,
                    master,
                    config.response_timeout(),
                )
                .await?,
            )
        } else if config.cluster {
            Connection::Cluster(crate::resend::Cluster::new(
                connect_cluster(&config.urls, config.response_timeout()).await?,
                config.urls.first().map(String::as_str),
            ))
        } else {
            if config.urls.len() != 1 {
                return Err(RedisStoreError::config(
                    "a standalone Redis takes exactly one URL (use the redis-cluster backend for several)",
                ));
            }
            Connection::Standalone(
                connect_standalone(&config.urls[0], config.response_timeout()).await?,
            )
        };
        let max_batch = config.max_batch.clamp(1, crate::MAX_BATCH);
        let lane_conn = match &conn {
            _ if max_batch == 1 => LaneConn::Shared,
            Connection::Standalone(_) => crate::direct::Direct::for_url(&config.urls[0])
                .map_or(LaneConn::Shared, |d| LaneConn::Own(Arc::new(d))),
            Connection::Sentinel(_) => LaneConn::SentinelMaster,
            Connection::Cluster(_) => config
                .urls
                .first()
                .and_then(|u| u.as_str().into_connection_info().ok())
                .filter(crate::direct::Direct::takes)
                .map_or(LaneConn::Shared, |info| {
                    LaneConn::ClusterNodes(Box::new(info))
                }),
        };
        let conn_for_keep_alive = conn.clone();
        let store = Self {
            conn,
            prefix: config.key_prefix.into(),
            clock: config.clock,
            ttl_floor_ms: None,
            ready: Arc::default(),
            loading: Arc::default(),
            lanes: Arc::new(Lanes::new(
                config.cluster && config.sentinel_master.is_none(),
            )),
            forms: Arc::default(),
            max_batch,
            call_timeout: config.call_timeout,
            lane_conn,
            _keep_alive: Arc::new(KeepAlive(
                tokio::spawn(keep_alive(conn_for_keep_alive)).abort_handle(),
            )),
        };
        // The generic script; plan scripts load on first use or in `prepare`.
        store.load(generic_script()).await?;
        store.refresh_nodes().await;
        // Advice only: a server that refuses INFO (renamed, an ACL) is served all the same.
        if let Ok(hz) = store.expiry_hz().await {
            if let Some(advice) = hz.iter().min().and_then(|&hz| crate::expiry::advice(hz)) {
                tracing::warn!("{advice}");
            }
        }
        if let Ok(limits) = store.memory_limits().await {
            // Once, for the first server (a Cluster's node) that has advice.
            if let Some(advice) = limits
                .iter()
                .find_map(|(bytes, policy)| crate::eviction::advice(*bytes, policy))
            {
                tracing::warn!("{advice}");
            }
        }
        Ok(store)
    }

    /// Every answering server's `maxmemory` in bytes (0: none) and `maxmemory-policy` (`INFO
    /// memory`; a Cluster: each node `INFO` was routed to). Once full, a Redis under
    /// `noeviction` refuses every decision, and one that evicts by use or at random drops
    /// limited clients' state (docs/operations.md, "Redis: memory"); [`RedisStore::connect`]
    /// warns where a limit is set under a policy other than `volatile-ttl`.
    pub async fn memory_limits(&self) -> Result<Vec<(u64, String)>, RedisStoreError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("memory");
        let reply = self.query(&cmd).await?;
        Ok(crate::eviction::collect_limits(&reply))
    }

    /// Redis's active expiry frequency (`INFO server`: `configured_hz`, else `hz`) on every
    /// server that answered (a Cluster: each node `INFO` was routed to). Expired keys are
    /// reclaimed in cycles of up to a quarter of `1000 / hz` ms that hold every command back
    /// (docs/operations.md, "Redis: `hz 100`"); [`RedisStore::connect`] warns below 100.
    pub async fn expiry_hz(&self) -> Result<Vec<u32>, RedisStoreError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        let reply = self.query(&cmd).await?;
        Ok(crate::expiry::collect_hz(&reply))
    }

    /// Decides a plan (`checks`, of one or several clients) all-or-nothing (the rules of
    /// [`tollgate_core::decide`]) in one script call: every enforced rule allows and every rule
    /// that allowed is charged, or nothing is. `now` (microseconds since the epoch) is used only
    /// with [`StoreClock::Local`]; with the store clock Redis `TIME` decides.
    ///
    /// On a Redis Cluster the plan's keys are grouped by slot, one script call per slot, in
    /// order; when a later slot denies, what the earlier slots charged is given back (see
    /// [`RedisStore::check`]'s give-back notes in docs/operations.md).
    pub async fn check(
        &self,
        checks: &[Check<'_>],
        now: Micros,
    ) -> Result<Verdict, RedisStoreError> {
        if checks.is_empty() {
            return Ok(Verdict {
                allowed: true,
                decisions: tollgate_core::Decisions::new(),
            });
        }
        if let Some(c) = twice(checks) {
            return Err(RedisStoreError::invalid(format!(
                "rule {:?} is checked twice for one client in one plan",
                c.rule.name()
            )));
        }
        if let Connection::Cluster(_) = self.conn {
            let first = checks[0].client;
            let slot = first.cluster_slot();
            if checks[1..]
                .iter()
                .any(|c| c.client != first && c.client.cluster_slot() != slot)
            {
                let mut at = vec![now; checks.len()];
                return Box::pin(self.check_across_slots(checks, now, &mut at)).await;
            }
        }
        let reply = self.run_plan(checks, now, true, true).await?;
        Ok(verdict(checks, reply.decisions))
    }

    /// [`RedisStore::check`], also telling when (on the store's clock) each check was decided:
    /// what a later settle, release or renewal of its charge needs (the window it was charged
    /// in, the bucket a hold is counted in). A plan whose rules need no instant (the buckets,
    /// GCRA) is answered as `check` answers it, with `now` as the instants.
    pub async fn check_timed(
        &self,
        checks: &[Check<'_>],
        now: Micros,
    ) -> Result<(Verdict, Vec<Micros>), RedisStoreError> {
        let needs_time = checks.iter().any(|c| {
            !matches!(
                c.rule.limit().algorithm(),
                tollgate_core::Algorithm::TokenBucket
                    | tollgate_core::Algorithm::LeakyBucket
                    | tollgate_core::Algorithm::Gcra
            )
        });
        let spans_slots = matches!(self.conn, Connection::Cluster(_)) && {
            let first = checks.first().map(|c| c.client);
            checks.iter().any(|c| {
                Some(c.client) != first
                    && first.map(|f| f.cluster_slot()) != Some(c.client.cluster_slot())
            })
        };
        if !needs_time || checks.is_empty() || twice(checks).is_some() {
            let v = self.check(checks, now).await?;
            return Ok((v, vec![now; checks.len()]));
        }
        if spans_slots {
            // Each slot's call has its own instant, read back from its reply.
            let mut at = vec![now; checks.len()];
            let v = self.check_across_slots(checks, now, &mut at).await?;
            return Ok((v, at));
        }
        let reply = self.run_plan(checks, now, false, true).await?;
        let at = reply.now.unwrap_or(now);
        Ok((verdict(checks, reply.decisions), vec![at; checks.len()]))
    }

    /// Settles, releases or renews charges (see [`SettleItem`]) in one script call per server
    /// (per slot on a Cluster): the units applied to each, in order.
    pub async fn settle(
        &self,
        items: &[SettleItem<'_>],
        now: Micros,
    ) -> Result<Vec<u64>, RedisStoreError> {
        Ok(self.settle_timed(items, now).await?.0)
    }

    /// [`RedisStore::settle`], also telling when (on the store's clock) each item was applied:
    /// the instant a renewed hold is counted at from then on, which its next renewal or its
    /// release must name (the gateway's own clock may be in another bucket, or another hour).
    pub async fn settle_timed(
        &self,
        items: &[SettleItem<'_>],
        now: Micros,
    ) -> Result<(Vec<u64>, Vec<Micros>), RedisStoreError> {
        let args: Vec<SettleArgs<'_>> = items
            .iter()
            .map(|it| SettleArgs {
                client: it.client,
                rule: it.rule,
                units: it.units,
                at: it.at,
                real: it.real.map_or(-1i64, |r| {
                    i64::try_from(r.min(MAX_COST)).unwrap_or(i64::MAX)
                }),
            })
            .collect();
        self.run_settle(&args, now).await
    }

    /// Gives back units of charges nothing recorded (see [`GiveBackItem`]), in one script call
    /// per server (per slot on a Cluster), as [`RedisStore::settle`]: the units given back to
    /// each, in order (never more than the state held: never below a fresh state).
    pub async fn give_back(
        &self,
        items: &[GiveBackItem<'_>],
        now: Micros,
    ) -> Result<Vec<u64>, RedisStoreError> {
        let args: Vec<SettleArgs<'_>> = items
            .iter()
            .map(|it| SettleArgs {
                client: it.client,
                rule: it.rule,
                units: it.units,
                at: 0,
                real: GIVE_BACK,
            })
            .collect();
        Ok(self.run_settle(&args, now).await?.0)
    }

    /// The settle script over `items`: the units applied to each, and the instant each call
    /// ran at (as `now` on a clock = local store).
    async fn run_settle(
        &self,
        items: &[SettleArgs<'_>],
        now: Micros,
    ) -> Result<(Vec<u64>, Vec<Micros>), RedisStoreError> {
        let mut done = Settled {
            out: vec![0; items.len()],
            at: vec![now; items.len()],
        };
        // On a Cluster whose node table is known, the items of one node go in one call of the
        // across-slots settle script; what it answers "elsewhere" (and what no node is known
        // for) goes by slot, like everything on an older Cluster.
        let (by_node, mut by_slot) = self.settle_groups_by_node(items);
        for members in by_node {
            for chunk in members.chunks(SETTLE_CHUNK) {
                by_slot.extend(self.settle_across(items, chunk, now, &mut done).await?);
            }
        }
        by_slot.sort_unstable();
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        let cluster = matches!(self.conn, Connection::Cluster(_));
        for i in by_slot {
            let slot = if cluster {
                items[i].client.cluster_slot()
            } else {
                0
            };
            match groups.iter_mut().find(|g| g.0 == slot) {
                Some(g) => g.1.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        for (_, members) in groups {
            for chunk in members.chunks(SETTLE_CHUNK) {
                match self.settle_reply(settle_script(), items, chunk, now).await {
                    // A Cluster slot being migrated whose keys of the call are split between
                    // the two nodes (after the resends): one call an item, each where its key
                    // is.
                    Err(e) if chunk.len() > 1 && is_try_again(&e) => {
                        self.settle_each(items, chunk, now, &mut done).await?;
                    }
                    reply => {
                        done.take(chunk, reply?, false)?;
                    }
                }
            }
        }
        Ok((done.out, done.at))
    }

    /// One call of the settle `script` (the by-slot one, or the across-slots one) for `chunk`.
    async fn settle_reply(
        &self,
        script: &Script,
        items: &[SettleArgs<'_>],
        chunk: &[usize],
        now: Micros,
    ) -> Result<redis::Value, RedisError> {
        let key = |i: usize| self.key(&items[i].client, items[i].rule.name());
        self.run_script(script, |cmd| {
            if script.across_slots {
                // One declared key routes the call; every item's key follows its arguments.
                cmd.arg(1).arg(key(chunk[0]));
                self.push_settle_args(cmd, items, chunk, now);
                for &i in chunk {
                    cmd.arg(key(i));
                }
            } else {
                cmd.arg(chunk.len());
                for &i in chunk {
                    cmd.arg(key(i));
                }
                self.push_settle_args(cmd, items, chunk, now);
            }
        })
        .await
    }

    /// The items of `chunk` settled one call each (by slot, each declaring its key).
    async fn settle_each(
        &self,
        items: &[SettleArgs<'_>],
        chunk: &[usize],
        now: Micros,
        done: &mut Settled,
    ) -> Result<(), RedisStoreError> {
        for i in chunk {
            let one = std::slice::from_ref(i);
            let reply = self.settle_reply(settle_script(), items, one, now).await?;
            done.take(one, reply, false)?;
        }
        Ok(())
    }

    /// The settle script's arguments after its keys: now, the PX floor, 7 per item.
    fn push_settle_args(
        &self,
        cmd: &mut dyn Args,
        items: &[SettleArgs<'_>],
        chunk: &[usize],
        now: Micros,
    ) {
        match self.clock {
            StoreClock::Store => cmd.arg(""),
            StoreClock::Local => cmd.arg(now),
        };
        cmd.arg(self.ttl_floor_ms.unwrap_or(0));
        for &i in chunk {
            let it = &items[i];
            let l = it.rule.limit();
            let q = l.quota();
            cmd.arg(l.algorithm().name())
                .arg(q.limit())
                .arg(q.period_micros())
                .arg(q.burst())
                .arg(it.units.min(MAX_COST))
                .arg(it.at)
                .arg(it.real);
        }
    }

    /// The items grouped by the Cluster node that serves them (by the node table), and the
    /// items for which no node is known; all of them in the second list on a standalone
    /// server, a Sentinel's master, or a Cluster without a node table.
    fn settle_groups_by_node(&self, items: &[SettleArgs<'_>]) -> (Vec<Vec<usize>>, Vec<usize>) {
        let table = match &*self.lanes {
            Lanes::Slots { nodes, .. } => nodes
                .table
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            Lanes::One(_) => None,
        };
        let (Some(table), Some(_)) = (table, settle_script_across()) else {
            return (Vec::new(), (0..items.len()).collect());
        };
        let mut groups: Vec<(*const Lane, Vec<usize>)> = Vec::new();
        let mut rest = Vec::new();
        for (i, it) in items.iter().enumerate() {
            match table.get(usize::from(it.client.cluster_slot())) {
                Some(Some(lane)) => {
                    let node = Arc::as_ptr(lane);
                    match groups.iter_mut().find(|g| g.0 == node) {
                        Some(g) => g.1.push(i),
                        None => groups.push((node, vec![i])),
                    }
                }
                _ => rest.push(i),
            }
        }
        (groups.into_iter().map(|g| g.1).collect(), rest)
    }

    /// One across-slots settle call for `chunk` (items one node serves); the items it
    /// answered "elsewhere" (nothing of them applied), to be settled by slot.
    async fn settle_across(
        &self,
        items: &[SettleArgs<'_>],
        chunk: &[usize],
        now: Micros,
        done: &mut Settled,
    ) -> Result<Vec<usize>, RedisStoreError> {
        let Some(script) = settle_script_across() else {
            return Ok(chunk.to_vec());
        };
        let reply = match self.settle_reply(script, items, chunk, now).await {
            Ok(r) => r,
            // Older than Redis 7: by slot from now on.
            Err(e) if refuses_script_flags(&e) => {
                self.disable_node_lanes();
                return Ok(chunk.to_vec());
            }
            // Its one declared key has left a migrating slot (see `Packed::across_slots`):
            // one call an item, each declaring its key, so each goes where its key is.
            Err(e) if is_ask(&e) => {
                self.refresh_nodes_soon();
                self.settle_each(items, chunk, now, done).await?;
                return Ok(Vec::new());
            }
            Err(e) => return Err(e.into()),
        };
        let elsewhere = done.take(chunk, reply, true)?;
        if !elsewhere.is_empty() {
            self.refresh_nodes_soon();
        }
        Ok(elsewhere)
    }

    /// One script call for `checks` (all on one server, or one slot): the plan's generated
    /// script, or the generic one.
    async fn run_plan(
        &self,
        checks: &[Check<'_>],
        now: Micros,
        integer_reply: bool,
        coalesce: bool,
    ) -> Result<Reply, RedisStoreError> {
        let form = form_of(checks);
        // Only the plans of one slot (`check`) coalesce; the calls of a plan across slots
        // (packed replies) go one by one.
        let coalesce = self.max_batch > 1 && coalesce;
        let script = match &form {
            Some(form) if coalesce => self.lane_script(form),
            Some(form) => self.loaded(form).await?,
            None => None,
        };
        if let (Some(s), Some(form)) = (script, form) {
            let (job, reply_base) = self.plan_job(checks, now, form, s, integer_reply);
            let reply = if coalesce {
                let deadline = tokio::time::Instant::now() + self.call_timeout();
                self.enqueue(self.lane_of(&checks[0].client), Job::Plan(job), deadline)
                    .await?
            } else {
                // Boxed, like a lane's call (see `enqueue`).
                Box::pin(self.run_job(&job)).await?
            };
            return parse_reply(&reply, limits_of(checks), reply_base);
        }
        let reply = Box::pin(self.run_script(generic_script(), |cmd| {
            self.push_generic_args(cmd, checks, now)
        }))
        .await?;
        parse_reply(&reply, limits_of(checks), 0)
    }

    /// A plan's job for its form's own script, and the base of its integer reply (0: none).
    fn plan_job(
        &self,
        checks: &[Check<'_>],
        now: Micros,
        form: Form,
        script: Arc<Script>,
        integer_reply: bool,
    ) -> (PlanJob, u64) {
        let (quotas, reply_base) =
            Quotas::pack(checks.iter().map(|c| c.rule.limit()), integer_reply);
        let keys = self.plan_keys(checks);
        let costs = match checks {
            // Most plans: built whole, without smallvec's general collect.
            [c] => SmallVec::from_buf_and_len([c.cost.min(MAX_COST), 0], 1),
            _ => checks.iter().map(|c| c.cost.min(MAX_COST)).collect(),
        };
        let job = PlanJob {
            keys,
            costs,
            now,
            form,
            quotas,
            script,
        };
        (job, reply_base)
    }

    /// The lane of a plan (its first client's), asking for the Cluster's node table when a
    /// slot's node is not known.
    fn lane_of(&self, client: &ClientKey) -> Arc<Lane> {
        let (lane, refresh) = self.lanes.of_plan(client);
        if refresh {
            self.refresh_nodes_soon();
        }
        lane
    }

    /// [`RedisStore::check`] within the store's call timeout (`store.timeout`) as a whole: a
    /// timeout error once it has passed. A plan that coalesces where lanes have the store's
    /// own connections (a standalone server, the master the sentinels name, a Cluster: there,
    /// a plan of one slot) of a form with a script of its own has no timer of its own: the
    /// lane bounds it (the call it leads, or the batch it leaves in, whose call is bounded by
    /// the earliest deadline of its plans; a plan still queued at its deadline is answered
    /// then, unsent; on a Cluster, a call sent again on redis-rs's client within the same
    /// deadline). Any other plan (a Cluster plan across slots among them) runs under one
    /// timer. This saves a timer a decision: an entry put into tokio's timer wheel and taken
    /// out again.
    pub async fn check_bounded(
        &self,
        checks: &[Check<'_>],
        now: Micros,
    ) -> Result<Verdict, RedisStoreError> {
        if let Some(pending) = self.check_begin(checks, now) {
            return pending.await?.verdict(checks);
        }
        let timeout = self.call_timeout();
        // Boxed: the generic script and a Cluster plan across slots are large futures that
        // the common case above never needs, and a plan's future is moved (and boxed by its
        // callers) whole on its way through the gateway.
        let bounded = tokio::time::timeout(timeout, self.check(checks, now));
        match Box::pin(bounded).await {
            Ok(r) => r,
            Err(_) => Err(RedisStoreError::timed_out(timeout)),
        }
    }

    /// [`RedisStore::check_bounded`]'s common case begun without a future of its own: a plan
    /// that coalesces on a lane of the store's own connections (a standalone server, the
    /// master the sentinels name, a Cluster plan of one slot), checking no rule twice for
    /// a client, of a form with a script of its own (loaded or not: a script the server
    /// lacks is loaded by the call that carries the plan). It is handed to its lane here,
    /// before this returns (sent at once when the lane is idle: by whoever polls the
    /// [`PendingCheck`]); the lane bounds it by the store's call timeout from now. `None` for
    /// any other plan: [`RedisStore::check_bounded`] decides it then.
    ///
    /// The pending check is a small future (a plan's future is moved, and polled through
    /// every caller's, on its way through a gateway); its [`CheckReply`] gives the verdict.
    /// Dropping it gives the plan up (a plan still queued is not sent).
    pub fn check_begin(&self, checks: &[Check<'_>], now: Micros) -> Option<PendingCheck<'_>> {
        let first = checks.first()?;
        if !self.lanes_bound_plans() || twice(checks).is_some() || !self.one_slot(first, checks) {
            return None;
        }
        let form = form_of(checks)?;
        let script = self.lane_script(&form)?;
        let begun = tokio::time::Instant::now();
        let (job, base) = self.plan_job(checks, now, form, script, true);
        let lane = self.lane_of(&first.client);
        Some(PendingCheck {
            call: self.enqueue(lane, Job::Plan(job), begun + self.call_timeout()),
            base,
            begun,
        })
    }

    /// A Cluster plan whose clients live in several slots: one script call per slot, the slots
    /// whose rules cannot be given back exactly (the sliding algorithms) last. When a slot
    /// denies, the slots before it are given back what they charged (the lease script's
    /// give-back, with the charge's own window for a fixed window) and the plan is denied.
    /// `at[i]` is set to the instant check `i` was decided at (its slot's call's `now`).
    async fn check_across_slots(
        &self,
        checks: &[Check<'_>],
        now: Micros,
        at: &mut [Micros],
    ) -> Result<Verdict, RedisStoreError> {
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, c) in checks.iter().enumerate() {
            let s = c.client.cluster_slot();
            match groups.iter_mut().find(|g| g.0 == s) {
                Some(g) => g.1.push(i),
                None => groups.push((s, vec![i])),
            }
        }
        let exact = |g: &(u16, Vec<usize>)| {
            g.1.iter()
                .all(|&i| checks[i].rule.limit().algorithm().is_leasable())
        };
        groups.sort_by_key(|g| !exact(g));
        // Two slots or more that cannot be given back: query every slot first (cost 0: a
        // rule admits `cost` exactly when the query's remaining is at least `cost`) and call a
        // slot predicted to deny first, so that nothing is charged before it. Exact unless
        // another request changes the client's state between the query and the charge.
        if groups.iter().filter(|g| !exact(g)).count() > 1 {
            let mut denies = Vec::with_capacity(groups.len());
            for (_, members) in &groups {
                let query: Vec<Check<'_>> = members
                    .iter()
                    .map(|&i| Check {
                        cost: 0,
                        ..checks[i]
                    })
                    .collect();
                let reply = self.run_plan(&query, now, false, false).await?;
                denies.push(
                    members
                        .iter()
                        .zip(&reply.decisions)
                        .any(|(&i, d)| checks[i].enforces() && d.remaining < checks[i].cost),
                );
            }
            let mut flagged: Vec<(bool, (u16, Vec<usize>))> =
                denies.into_iter().zip(groups).collect();
            flagged.sort_by_key(|(deny, _)| !deny);
            groups = flagged.into_iter().map(|(_, g)| g).collect();
        }
        let mut decisions = vec![None; checks.len()];
        let mut charged: Vec<(usize, Micros)> = Vec::new();
        let mut denied = false;
        for (_, members) in &groups {
            // A slot's script sees only its own quota checks, and the plan's quota checks are
            // alternatives across every slot: each slot runs them as shadow checks (charged
            // when they allow) and the plan's verdict is taken below, over every slot.
            let part: Vec<Check<'_>> = members
                .iter()
                .map(|&i| match checks[i].mode {
                    Mode::Quota => checks[i].shadow(),
                    _ => checks[i],
                })
                .collect();
            let reply = self.run_plan(&part, now, false, false).await?;
            let allowed = part
                .iter()
                .zip(&reply.decisions)
                .all(|(c, d)| d.allowed || !c.enforces());
            for (&i, d) in members.iter().zip(&reply.decisions) {
                decisions[i] = Some(*d);
            }
            if !allowed {
                denied = true;
                break;
            }
            let instant = reply.now.unwrap_or(now);
            for (&i, d) in members.iter().zip(&reply.decisions) {
                at[i] = instant;
                if d.allowed && checks[i].cost > 0 {
                    charged.push((i, instant));
                }
            }
        }
        if !denied {
            let quota_ok = tollgate_core::plan_allows(
                checks
                    .iter()
                    .zip(&decisions)
                    .map(|(c, d)| (c.mode, d.is_some_and(|d| d.allowed))),
            );
            if quota_ok {
                let decisions = decisions.into_iter().flatten().collect();
                return Ok(Verdict {
                    allowed: true,
                    decisions,
                });
            }
            // Every quota check denied: the plan is denied and what was charged goes back.
        }
        // Give back, then report every charged rule as uncharged (what it would allow now).
        for &(i, at) in &charged {
            let c = &checks[i];
            let q = c.rule.limit().quota();
            let window = match c.rule.limit().algorithm() {
                tollgate_core::Algorithm::FixedWindow => at - at % q.period_micros(),
                _ => 0,
            };
            if c.rule.limit().algorithm().is_leasable() {
                let back = crate::LeaseRequest {
                    want: 0,
                    need: 0,
                    give_back: c.cost,
                    give_back_window: window,
                };
                let state = self.lease(&c.client, c.rule, back, now).await?;
                if let Some(d) = decisions[i].as_mut() {
                    d.remaining = state.remaining;
                    d.reset_after = state.reset_after;
                }
            }
        }
        // The slots never called are reported as their uncharged state would show: a query.
        for (i, c) in checks.iter().enumerate() {
            if decisions[i].is_none() {
                let query = [Check { cost: 0, ..*c }];
                let reply = self.run_plan(&query, now, false, false).await?;
                decisions[i] = reply.decisions.first().copied();
            }
        }
        let decisions: tollgate_core::Decisions = decisions.into_iter().flatten().collect();
        Ok(Verdict {
            allowed: false,
            decisions,
        })
    }

    /// The script of `form`, loaded into this store's server(s) on first use (unless a lane
    /// has it already: see [`RedisStore::lane_script`]); `None` when the plan runs the generic
    /// script.
    async fn loaded(&self, form: &Form) -> Result<Option<Arc<Script>>, RedisStoreError> {
        if let Some(s) = self.ready_script(form) {
            return Ok(Some(s));
        }
        Box::pin(self.load_form(form.clone())).await
    }

    /// The script of `form` for a plan handed to its lane at once (`None`: the generic
    /// script serves it): the one this store has, or else the one generated for the form,
    /// kept from now on but not loaded first. Its lane's call loads it where the server
    /// lacks it: SCRIPT LOAD and the EVALSHA written together, the round it is in sent call
    /// after call (see `Lane::loaded`). A SCRIPT LOAD awaited first (as [`Self::loaded`]
    /// does for a plan that does not coalesce) let the plans that arrived meanwhile, of
    /// forms already loaded, join the queue before it and be decided first: out of arrival
    /// order, on the same keys.
    fn lane_script(&self, form: &Form) -> Option<Arc<Script>> {
        if let Some(s) = self.ready_script(form) {
            return Some(s);
        }
        let s = plan_script(form)?;
        self.ready
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(form.clone(), Arc::clone(&s));
        Some(s)
    }

    /// The script of `form` when this store has it (loaded, or handed to a lane, whose call
    /// loads it: see [`Self::lane_script`]).
    fn ready_script(&self, form: &Form) -> Option<Arc<Script>> {
        self.ready
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(form)
            .cloned()
    }

    /// [`RedisStore::loaded`]'s first use of a form: one load at a time.
    async fn load_form(&self, form: Form) -> Result<Option<Arc<Script>>, RedisStoreError> {
        let _one_at_a_time = self.loading.lock().await;
        if let Some(s) = self.ready_script(&form) {
            return Ok(Some(s));
        }
        let Some(s) = plan_script(&form) else {
            return Ok(None);
        };
        self.load(&s).await?;
        self.ready
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(form, Arc::clone(&s));
        Ok(Some(s))
    }

    /// SCRIPT LOAD (on a cluster: on every master), so the first call is an EVALSHA like the
    /// others. A server that loses its cache later answers NOSCRIPT and gets a SCRIPT LOAD.
    async fn load(&self, s: &Script) -> Result<(), RedisStoreError> {
        let sha: String = match self.query(&script_load(s)).await? {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::SimpleString(s) => s,
            other => {
                return Err(RedisStoreError::protocol(format!(
                    "SCRIPT LOAD answered {other:?}"
                )))
            }
        };
        if sha != s.sha {
            return Err(RedisStoreError::protocol(format!(
                "SCRIPT LOAD returned sha {sha}, expected {}",
                s.sha
            )));
        }
        Ok(())
    }

    /// Loads the scripts of these plan shapes now, so the first request of each is one
    /// EVALSHA like the others (otherwise it also pays a SCRIPT LOAD round trip).
    pub async fn prepare(&self, shapes: &[Vec<RuleShape>]) -> Result<(), RedisStoreError> {
        for form in shapes.iter().filter_map(|r| Form::of(r)) {
            self.loaded(&form).await?;
        }
        self.load(lease_script()).await
    }

    /// Round-trips a PING (on a cluster: to every node).
    pub async fn ping(&self) -> Result<(), RedisStoreError> {
        match self.query(&redis::cmd("PING")).await {
            // A connection the server dropped (a restart) reconnects on this failure: a PING
            // can be sent again.
            Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                self.query(&redis::cmd("PING")).await?;
            }
            r => {
                r?;
            }
        }
        Ok(())
    }

    /// Deletes `policy`'s state for `client` (an operator's reset): the next check starts
    /// from a fresh state. Whether a key existed.
    pub async fn reset(&self, client: &ClientKey, policy: &str) -> Result<bool, RedisStoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.key(client, policy));
        match self.query(&cmd).await? {
            redis::Value::Int(n) => Ok(n > 0),
            other => Err(RedisStoreError::protocol(format!(
                "DEL answered {other:?}; expected an integer"
            ))),
        }
    }

    /// A plan's keys, each [`RedisStore::key`] of its check, in one buffer. A client's hex
    /// digits are written once for a run of its checks (an HTTP request's policies all count
    /// the same client).
    fn plan_keys(&self, checks: &[Check<'_>]) -> Keys {
        let bytes = checks
            .iter()
            .map(|c| self.prefix.len() + 36 + c.rule.name().len())
            .sum();
        let mut keys = Keys::with_capacity(checks.len(), bytes);
        let mut last: Option<(ClientKey, [u8; 32])> = None;
        for c in checks {
            let hex = match last {
                Some((client, hex)) if client == c.client => hex,
                _ => c.client.hex(),
            };
            last = Some((c.client, hex));
            let text = keys.text_mut();
            for piece in key_pieces(&self.prefix, &hex, c.rule.name()) {
                text.extend_from_slice(piece);
            }
            keys.end_key();
        }
        keys
    }

    /// The Redis key holding `policy`'s state for `client`: `<prefix>:{<client>}:<policy>`.
    pub fn key(&self, client: &ClientKey, policy: &str) -> String {
        let hex = client.hex();
        let pieces = key_pieces(&self.prefix, &hex, policy);
        let mut key = Vec::with_capacity(pieces.iter().map(|p| p.len()).sum());
        for piece in pieces {
            key.extend_from_slice(piece);
        }
        // The prefix and the policy are strings and the digits ASCII: always UTF-8.
        String::from_utf8(key)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// The same store (sharing its connections) whose keys live at least `floor`, even past
    /// the instant their state equals a fresh one. That changes no decision, only memory. It
    /// is for tests that drive [`StoreClock::Local`] at another pace than real time (or
    /// backwards): Redis expires keys on its own clock, which would otherwise forget a state
    /// the test's virtual time still needs.
    pub fn with_ttl_floor(&self, floor: std::time::Duration) -> Self {
        let ms = u64::try_from(floor.as_millis()).unwrap_or(u64::MAX);
        Self {
            ttl_floor_ms: Some(
                ms.min(tollgate_core::duration_to_micros(tollgate_core::MAX_PERIOD) / 1000),
            ),
            // Its own lanes: a batch carries one PX floor.
            lanes: Arc::new(Lanes::new(matches!(self.conn, Connection::Cluster(_)))),
            ..self.clone()
        }
    }

    /// The PX floor set by [`RedisStore::with_ttl_floor`], in milliseconds.
    pub(crate) fn ttl_floor_ms(&self) -> Option<u64> {
        self.ttl_floor_ms
    }

    /// The clock this store decides with.
    pub fn clock(&self) -> StoreClock {
        self.clock
    }

    /// The generic script's arguments (see `scripts/check.lua`).
    fn push_generic_args(&self, cmd: &mut dyn Args, checks: &[Check<'_>], now: Micros) {
        cmd.arg(checks.len());
        for c in checks {
            cmd.arg(self.key(&c.client, c.rule.name()));
        }
        match self.clock {
            StoreClock::Store => cmd.arg(""),
            StoreClock::Local => cmd.arg(now),
        };
        for c in checks {
            let limit = c.rule.limit();
            let q = limit.quota();
            cmd.arg(limit.algorithm().name())
                .arg(q.limit())
                .arg(q.period_micros())
                .arg(q.burst())
                .arg(c.cost.min(MAX_COST))
                .arg(match c.mode {
                    Mode::Enforce => 0u8,
                    Mode::Shadow => 1,
                    Mode::Quota => 2,
                });
        }
        if let Some(ms) = self.ttl_floor_ms {
            cmd.arg(ms);
        }
    }

    /// The store's own connection to the Cluster node at `host:port`, with the first URL's
    /// credentials and TLS; `None` where node lanes use redis-rs's connection.
    fn node_connection(&self, (host, port): &(String, u16)) -> Option<NodeConn> {
        let LaneConn::ClusterNodes(template) = &self.lane_conn else {
            return None;
        };
        let direct = crate::direct::Direct::for_node(template, host, *port, 1)?;
        Some(NodeConn {
            addr: (host.clone(), *port),
            direct: Arc::new(direct),
        })
    }

    /// Reads which node serves each slot (`CLUSTER SLOTS`) into the node lanes: at connect,
    /// and after a batch met a key its node does not serve. Nothing on a standalone server,
    /// with `max_batch = 1`, or once the servers refused the across-slots script flag. A
    /// failure leaves the table as it was.
    pub(crate) async fn refresh_nodes(&self) {
        let Lanes::Slots { nodes, .. } = &*self.lanes else {
            return;
        };
        if self.max_batch <= 1 || nodes.unsupported.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let first = nodes
            .table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none();
        if first {
            // Redis 7's script flags, on every master (SCRIPT LOAD goes to each).
            let mut probe = redis::cmd("SCRIPT");
            probe
                .arg("LOAD")
                .arg(format!("{ACROSS_SLOTS_SHEBANG}return 1"));
            match self.query(&probe).await {
                Ok(_) => {}
                Err(e) if refuses_script_flags(&e) => {
                    tracing::info!(error = %e, "the cluster predates script flags; batching per slot");
                    self.disable_node_lanes();
                    return;
                }
                Err(_) => return,
            }
        }
        let Ok(reply) = self.query(redis::cmd("CLUSTER").arg("SLOTS")).await else {
            return;
        };
        let Some(ranges) = parse_cluster_slots(&reply) else {
            return;
        };
        let old = nodes
            .table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        // A node keeps its lane across refreshes (by its id, while its address stays), so a
        // refresh splits no queue.
        let mut by_node: HashMap<String, Arc<Lane>> = HashMap::new();
        if let Some(old) = &old {
            for (slot, lane) in old.iter().enumerate() {
                if let Some(lane) = lane {
                    if let Some(r) = ranges.iter().find(|r| r.start <= slot && slot <= r.end) {
                        if lane.node_addr() == self.node_addr(r) {
                            by_node
                                .entry(r.id.clone())
                                .or_insert_with(|| Arc::clone(lane));
                        }
                    }
                }
            }
        }
        let mut table: Vec<Option<Arc<Lane>>> = vec![None; 16384];
        for r in &ranges {
            let lane = by_node.entry(r.id.clone()).or_insert_with(|| {
                Arc::new(Lane::across_slots(
                    self.node_addr(r).and_then(|a| self.node_connection(a)),
                ))
            });
            for slot in table.iter_mut().take(r.end + 1).skip(r.start) {
                *slot = Some(Arc::clone(lane));
            }
        }
        *nodes
            .table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(table.into());
    }

    /// The address a node lane's own connection goes to: the range's master's, when node
    /// lanes have connections of their own.
    fn node_addr<'r>(&self, r: &'r SlotRange) -> Option<&'r (String, u16)> {
        match self.lane_conn {
            LaneConn::ClusterNodes(_) => r.addr.as_ref(),
            _ => None,
        }
    }

    /// [`RedisStore::refresh_nodes`] in a task of its own, unless one runs or ran less than
    /// [`NODE_REFRESH_EVERY`] ago.
    fn refresh_nodes_soon(&self) {
        let Lanes::Slots { nodes, .. } = &*self.lanes else {
            return;
        };
        {
            let mut last = nodes
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|t| t.elapsed() < NODE_REFRESH_EVERY) {
                return;
            }
            if nodes
                .refreshing
                .swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            nodes
                .refreshing
                .store(false, std::sync::atomic::Ordering::Release);
            return;
        };
        let store = self.clone();
        rt.spawn(async move {
            store.refresh_nodes().await;
            if let Lanes::Slots { nodes, .. } = &*store.lanes {
                nodes
                    .refreshing
                    .store(false, std::sync::atomic::Ordering::Release);
            }
        });
    }

    /// Slot lanes only, from now on.
    fn disable_node_lanes(&self) {
        if let Lanes::Slots { nodes, .. } = &*self.lanes {
            nodes
                .unsupported
                .store(true, std::sync::atomic::Ordering::Relaxed);
            *nodes
                .table
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
    }

    /// The most plans one call carries (`max_batch`).
    pub(crate) fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The bound of a call (`store.timeout`): of each coalesced call, and of
    /// [`RedisStore::check_bounded`] as a whole.
    pub fn call_timeout(&self) -> std::time::Duration {
        self.call_timeout
    }

    /// On a Cluster, how many times redis-rs's client was built again after it answered
    /// nothing for 2 s (`watchdog.rs`); 0 elsewhere.
    pub fn cluster_client_rebuilds(&self) -> u64 {
        match &self.conn {
            Connection::Cluster(c) => c.shared().rebuilds(),
            _ => 0,
        }
    }

    /// Tests only: on a Cluster, redis-rs's connection replaced with one to the Cluster seeded
    /// by `seeds` (which the test then pauses, so that it answers nothing, as a stuck client
    /// does); the client that builds it again stays the store's. Whether it was replaced.
    #[doc(hidden)]
    pub async fn replace_cluster_connection_for_tests(&self, seeds: &[String]) -> bool {
        let Connection::Cluster(c) = &self.conn else {
            return false;
        };
        let Ok(other) = redis::cluster::ClusterClient::new(seeds.to_vec()) else {
            return false;
        };
        match other.get_async_connection().await {
            Ok(conn) => {
                c.shared().replace(conn);
                true
            }
            Err(_) => false,
        }
    }

    /// One plan alone: its shape's script.
    pub(crate) async fn run_job(&self, job: &PlanJob) -> Result<redis::Value, RedisError> {
        self.run_job_on(job, Via::Shared).await
    }

    /// [`RedisStore::run_job`], on the lane's own connection when `lane`.
    async fn run_job_on(&self, job: &PlanJob, via: Via<'_>) -> Result<redis::Value, RedisError> {
        self.run_script_on(
            &job.script,
            |cmd| self.push_plan_args(cmd, job),
            via,
            job.room(),
        )
        .await
    }

    /// A generated script's arguments: the keys, the quotas, then nothing more when every cost
    /// is 1 with the store clock and no PX floor (each argument costs Redis a string and a
    /// table slot); otherwise the costs, then now (store clock: empty) and the floor, each
    /// only when used.
    fn push_plan_args(&self, cmd: &mut dyn Args, job: &PlanJob) {
        cmd.arg(job.keys.len());
        for k in job.keys.iter() {
            cmd.arg(k);
        }
        cmd.arg(job.quotas.as_bytes());
        let now = job.now;
        let plain = self.clock == StoreClock::Store && self.ttl_floor_ms.is_none();
        if plain && job.costs.iter().all(|&c| c == 1) {
            return;
        }
        for c in &job.costs {
            cmd.arg(*c);
        }
        match (self.clock, self.ttl_floor_ms) {
            (StoreClock::Store, None) => {}
            (StoreClock::Store, Some(ms)) => {
                cmd.arg("").arg(ms);
            }
            (StoreClock::Local, None) => {
                cmd.arg(now);
            }
            (StoreClock::Local, Some(ms)) => {
                cmd.arg(now).arg(ms);
            }
        }
    }

    /// EVALSHA of `s` with the arguments `args` writes. A server that lost its script cache
    /// (restart, FLUSH, failover) answers NOSCRIPT; SCRIPT LOAD then loads the script again
    /// and the EVALSHA is sent once more, so no request fails for it. EVAL only as the last
    /// resort ([`RELOADS`]): Redis 7.4 and later delete the scripts EVAL loaded, least
    /// recently used first, past 500 of them (another application's EVALs could push the
    /// store's out), and keep what SCRIPT LOAD loaded until a flush.
    pub(crate) async fn run_script(
        &self,
        s: &Script,
        args: impl Fn(&mut dyn Args) + Sync,
    ) -> Result<redis::Value, RedisError> {
        self.run_script_on(s, args, Via::Shared, Room::SMALL).await
    }

    /// [`RedisStore::run_script`] on the lane's own connection when `lane` and there is one.
    /// `room` sizes the command for its arguments up front: a batch's hundreds of arguments
    /// would otherwise regrow it several times.
    pub(crate) async fn run_script_on(
        &self,
        s: &Script,
        args: impl Fn(&mut dyn Args) + Sync,
        via: Via<'_>,
        room: Room,
    ) -> Result<redis::Value, RedisError> {
        if let (Via::Lane(lane), Some(own)) = (via, self.own_connection(via)) {
            // Written once, as the bytes the store's own connection sends (`command.rs`).
            let across = s.across_slots;
            let packed =
                || packed_call(b"EVALSHA", s.sha.as_bytes(), room, &args).across_slots(across);
            // A script this lane has run on its server goes by its SHA alone; any other is
            // loaded first (SCRIPT LOAD and the call written together), so that a new form's
            // first call is not answered NOSCRIPT (an error in the server's stats).
            let known = lane.scripts_run().contains(&s.sha);
            // Answered NOSCRIPT: then also loaded where a redirection met none (a Cluster).
            let mut lost = false;
            if known {
                match self.query_own(own, packed()).await {
                    Err(e) if is_noscript(&e) => {
                        lane.forget_run();
                        lost = true;
                    }
                    other => return other,
                }
            }
            // Loaded, then asked which of the scripts the lane counts as run the server still
            // has, then run: one write, the server answering in order. A flush that came
            // before the load (one this lane never saw answered NOSCRIPT) lost the others,
            // and a round that took them as loaded would run the calls of this script and
            // not theirs, out of arrival order; the lane keeps only those the server has. A
            // flush after the question loses this one too, so the next round that counts on
            // them is answered NOSCRIPT from its first call on. A flush can also come between
            // the load and the call (a long script is read in several pieces, and the server
            // serves other clients between them): tried again, a few times.
            for _ in 0..RELOADS {
                if lost {
                    Box::pin(self.load_where_redirected(s)).await;
                }
                let mut asked: Vec<String> = lane.scripts_run().iter().cloned().collect();
                if !asked.contains(&s.sha) {
                    asked.push(s.sha.clone());
                }
                let mut three = [packed_load(s), packed_exists(&asked), packed()];
                let mut replies = self.query_own_many(own, &mut three).await?.into_iter();
                match (replies.next(), replies.next(), replies.next()) {
                    (Some(Err(e)), _, _) => return Err(e),
                    // Lost again; or a Cluster node's call that the node did not run went on
                    // redis-rs's cluster connection, to a node that may lack the script.
                    (Some(Ok(_)), _, Some(Err(e))) if is_noscript(&e) => {
                        lane.forget_run();
                        lost = true;
                    }
                    (Some(Ok(_)), Some(exists), Some(run)) => {
                        match present(asked, exists) {
                            Some(present) => lane.keep_run(present),
                            // A user that may not run SCRIPT EXISTS: this one is noted, the
                            // others kept (a flush this lane did not see answered NOSCRIPT
                            // is not found out this way, see docs/operations.md).
                            None => lane.note_run(std::iter::once(s.sha.as_str())),
                        }
                        return run;
                    }
                    _ => {
                        return Err(RedisError::from((
                            ErrorKind::Client,
                            "three calls written together",
                            "not answered three times".to_string(),
                        )))
                    }
                }
            }
            // The script itself, the one call that cannot meet NOSCRIPT (a Cluster node that
            // did not run it sends it on redis-rs's cluster connection, which follows the
            // redirection).
            let eval = packed_call(b"EVAL", s.text.as_bytes(), room, &args).across_slots(across);
            return self.query_own(own, eval).await;
        }
        self.run_script_shared(s, &args, room).await
    }

    /// [`RedisStore::run_script`] on redis-rs's connections: the EVALSHA, and on NOSCRIPT a
    /// SCRIPT LOAD (on a Cluster, on every master) and the EVALSHA again, then EVAL (see
    /// [`RELOADS`]).
    async fn run_script_shared(
        &self,
        s: &Script,
        args: &(dyn Fn(&mut dyn Args) + Sync),
        room: Room,
    ) -> Result<redis::Value, RedisError> {
        let follows_ask = !s.across_slots;
        let mut cmd = Cmd::with_capacity(room.args + 2, room.bytes + 64);
        cmd.arg("EVALSHA").arg(&s.sha);
        args(&mut cmd);
        match self.query_follows(&cmd, follows_ask).await {
            Err(e) if is_noscript(&e) => {}
            other => return other,
        }
        let load = script_load(s);
        for _ in 0..RELOADS {
            self.query(&load).await?;
            Box::pin(self.load_where_redirected(s)).await;
            match self.query_follows(&cmd, follows_ask).await {
                Err(e) if is_noscript(&e) => {}
                other => return other,
            }
        }
        let mut eval = Cmd::with_capacity(room.args + 2, room.bytes + s.text.len() + 64);
        eval.arg("EVAL").arg(&s.text);
        args(&mut eval);
        self.query_follows(&eval, follows_ask).await
    }

    /// On a Cluster, SCRIPT LOAD of `s` on the nodes that answered a redirected call NOSCRIPT
    /// (`resend.rs`): a master added to scale out serves no slot until its first is handed
    /// over, so a load sent to every master misses it, and the calls redirected there would
    /// be sent whole (EVAL, which a user without `+eval` may not send) after their reloads.
    /// Boxed where it is called: it runs only after a NOSCRIPT, and every call's future
    /// would carry it.
    async fn load_where_redirected(&self, s: &Script) {
        if let Connection::Cluster(c) = &self.conn {
            c.load_where_lacking(|| packed_load(s).bytes().to_vec())
                .await;
        }
    }

    /// Whether a plan that coalesces has no timer of its own, its lane bounding it (see
    /// [`RedisStore::check_bounded`]): where lanes have connections of the store's own (a
    /// standalone server's, a Sentinel master's, a Cluster's nodes'). With redis-rs's
    /// connections only, plans run under their caller's timer.
    fn lanes_bound_plans(&self) -> bool {
        self.max_batch > 1
            && matches!(
                self.lane_conn,
                LaneConn::Own(_) | LaneConn::SentinelMaster | LaneConn::ClusterNodes(_)
            )
    }

    /// Whether every check of `checks` is in `first`'s slot (always, off a Cluster): one call
    /// decides the plan, on one lane.
    fn one_slot(&self, first: &Check<'_>, checks: &[Check<'_>]) -> bool {
        if !matches!(self.conn, Connection::Cluster(_)) {
            return true;
        }
        let slot = first.client.cluster_slot();
        checks
            .iter()
            .all(|c| c.client == first.client || c.client.cluster_slot() == slot)
    }

    /// The store's own connection that a call by `via` goes on, if any: a standalone
    /// server's, the Sentinel master's, or a Cluster node's lane's.
    fn own_connection<'a>(&'a self, via: Via<'a>) -> Option<Own<'a>> {
        let Via::Lane(lane) = via else {
            return None;
        };
        match (&self.lane_conn, &self.conn) {
            (LaneConn::Own(d), Connection::Standalone(shared)) => Some(Own::Standalone(d, shared)),
            (LaneConn::SentinelMaster, Connection::Sentinel(c)) => Some(Own::Sentinel(c)),
            (LaneConn::ClusterNodes(_), Connection::Cluster(_)) => {
                lane.node.as_ref().map(|n| Own::Node(&n.direct))
            }
            _ => None,
        }
    }

    /// `cmd` on the store's own connection `own`. A Cluster node that does not run it (the
    /// slot moved, or is moving; the node is down, or is not a master any more) has not
    /// charged anything: it is sent again on redis-rs's cluster connection, which follows the
    /// redirection, and the node table is read again.
    async fn query_own(&self, own: Own<'_>, mut cmd: Packed) -> Result<redis::Value, RedisError> {
        match own {
            Own::Standalone(d, shared) => d.query_beside(cmd.bytes(), shared).await,
            Own::Sentinel(c) => c.query_own(&mut cmd).await,
            Own::Node(d) => {
                // Unanswered (an error, or a deadline that passed first: a node that fails
                // over or drops packets never says MOVED), the node table is read again.
                let mut unanswered = RefreshUnlessAnswered {
                    store: self,
                    answered: false,
                };
                let reply = d.query(cmd.bytes()).await;
                unanswered.answered = reply.is_ok();
                match reply {
                    Err(e) if !cmd.follows_ask && is_ask(&e) => Err(e),
                    Err(e) if crate::error::not_run_here(&e) => {
                        self.query_follows(&cmd.to_cmd(), cmd.follows_ask).await
                    }
                    other => other,
                }
            }
        }
    }

    /// [`RedisStore::query_own`] of several commands written together, each answered in
    /// order; on a Cluster node, a command the node did not run (`MOVED`, `ASK`, a refused
    /// connection) is sent again on redis-rs's cluster connection, which follows it.
    async fn query_own_many(&self, own: Own<'_>, cmds: &mut [Packed]) -> Many {
        match own {
            Own::Standalone(d, shared) => {
                let bytes = joined(cmds);
                d.query_many_beside(&bytes, cmds.len(), shared).await
            }
            Own::Sentinel(c) => c.query_own_many(cmds).await,
            Own::Node(d) => {
                let mut unanswered = RefreshUnlessAnswered {
                    store: self,
                    answered: false,
                };
                let bytes = joined(cmds);
                let replies = d.query_many(&bytes, cmds.len()).await;
                unanswered.answered = replies.as_ref().is_ok_and(|r| r.iter().all(Result::is_ok));
                let replies = match replies {
                    Ok(replies) => replies,
                    Err(e) if crate::error::not_run_here(&e) => {
                        cmds.iter().map(|_| Err(e.clone())).collect()
                    }
                    Err(e) => return Err(e),
                };
                let mut answered = Vec::with_capacity(replies.len());
                for (cmd, reply) in cmds.iter().zip(replies) {
                    answered.push(match reply {
                        Err(e) if !cmd.follows_ask && is_ask(&e) => Err(e),
                        Err(e) if crate::error::not_run_here(&e) => {
                            self.query_follows(&cmd.to_cmd(), cmd.follows_ask).await
                        }
                        other => other,
                    });
                }
                Ok(answered)
            }
        }
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<redis::Value, RedisError> {
        self.conn.query(cmd, true).await
    }

    /// [`RedisStore::query`], on a Cluster sent again after an ASK only when `follows_ask`
    /// (see `Packed::across_slots`).
    async fn query_follows(
        &self,
        cmd: &Cmd,
        follows_ask: bool,
    ) -> Result<redis::Value, RedisError> {
        self.conn.query(cmd, follows_ask).await
    }
}

async fn connect_standalone(
    url: &str,
    response_timeout: std::time::Duration,
) -> Result<ConnectionManager, RedisStoreError> {
    let client = redis::Client::open(url)
        .map_err(|e| RedisStoreError::config(format!("invalid Redis URL {}: {e}", redact(url))))?;
    // No reconnect retries inside the client: while the server is down each call fails at
    // once (and triggers the next attempt) instead of waiting out a backoff schedule.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(0);
    Ok(ConnectionManager::new_with_config(client, config).await?)
}

/// redis-rs's connection to the Cluster seeded by `urls`, with the client that builds it
/// again (`watchdog.rs`).
async fn connect_cluster(
    urls: &[String],
    response_timeout: std::time::Duration,
) -> Result<crate::watchdog::Shared, RedisStoreError> {
    let client = ClusterClient::builder(urls.iter().map(String::as_str))
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(response_timeout)
        // None of redis-rs's: it would also resend a call its node may have run (a settle
        // applied twice); `resend.rs` sends again only what certainly did not run.
        .retries(0)
        .build()
        .map_err(|e| {
            let urls: Vec<String> = urls.iter().map(|u| redact(u)).collect();
            RedisStoreError::config(format!("invalid Redis Cluster URLs {urls:?}: {e}"))
        })?;
    let conn = client.get_async_connection().await?;
    Ok(crate::watchdog::Shared::new(client, conn))
}

/// The verdict of a plan from its decisions: allowed when every enforced rule allowed.
fn verdict(checks: &[Check<'_>], decisions: tollgate_core::Decisions) -> Verdict {
    let allowed = tollgate_core::plan_allows(
        checks
            .iter()
            .zip(&decisions)
            .map(|(c, d)| (c.mode, d.allowed)),
    );
    Verdict { allowed, decisions }
}

// Leases (see `lease.rs` for the types).
impl RedisStore {
    /// Gives back and takes lease units of `rule` for `client` in one atomic round trip.
    pub async fn lease(
        &self,
        client: &ClientKey,
        rule: &Rule,
        request: LeaseRequest,
        now: Micros,
    ) -> Result<Lease, RedisStoreError> {
        let limit = rule.limit();
        if !limit.algorithm().is_leasable() {
            return Err(RedisStoreError::invalid(format!(
                "{} cannot be leased",
                limit.algorithm()
            )));
        }
        let job = LeaseJob {
            key: self.key(client, rule.name()),
            limit: *limit,
            request,
            now,
        };
        // Refills coalesce like checks (a lease call, alone, when the lane is idle).
        let reply = if self.max_batch() > 1 {
            let (lane, refresh) = self.lanes.of_plan(client);
            if refresh {
                self.refresh_nodes_soon();
            }
            let deadline = tokio::time::Instant::now() + self.call_timeout();
            self.enqueue(lane, Job::Lease(job), deadline).await?
        } else {
            self.run_lease(&job).await?
        };
        parse_lease(&reply)
    }

    /// One lease call alone: `lease.lua`.
    pub(crate) async fn run_lease(&self, job: &LeaseJob) -> Result<redis::Value, RedisError> {
        self.run_lease_on(job, Via::Shared).await
    }

    /// [`RedisStore::run_lease`], on the lane's own connection when `lane`.
    async fn run_lease_on(&self, job: &LeaseJob, via: Via<'_>) -> Result<redis::Value, RedisError> {
        self.run_script_on(
            lease_script(),
            |cmd| self.push_lease_call_args(cmd, job),
            via,
            Room::lease(job),
        )
        .await
    }

    /// `lease.lua`'s call for `job` after the script: its one key, then its arguments.
    fn push_lease_call_args(&self, cmd: &mut dyn Args, job: &LeaseJob) {
        cmd.arg(1).arg(&job.key);
        self.push_lease_args(cmd, job);
    }

    /// `lease.lua`'s arguments for `job` (without its key): 9, or 10 with a PX floor.
    pub(crate) fn push_lease_args(&self, cmd: &mut dyn Args, job: &LeaseJob) {
        match self.clock() {
            StoreClock::Store => cmd.arg(""),
            StoreClock::Local => cmd.arg(job.now),
        };
        let q = job.limit.quota();
        cmd.arg(job.limit.algorithm().name())
            .arg(q.limit())
            .arg(q.period_micros())
            .arg(q.burst())
            .arg(job.request.want)
            .arg(job.request.need)
            .arg(job.request.give_back)
            .arg(job.request.give_back_window);
        if let Some(ms) = self.ttl_floor_ms() {
            cmd.arg(ms);
        }
    }
}

// Coalesced calls (see `lane.rs` for the queue).
/// Marks the lane idle when the direct call it guards ends (or its caller gives up), or hands
/// what queued meanwhile to a drain task.
struct Busy<'a> {
    store: &'a RedisStore,
    lane: Arc<Lane>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut state = self.lane.lock();
        if state.queue.is_empty() {
            state.busy = false;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                drop(state);
                rt.spawn(drain(self.store.clone(), Arc::clone(&self.lane)));
            }
            // No runtime left (shutting down): the waiting callers get an error.
            Err(_) => {
                state.queue.clear();
                state.busy = false;
            }
        }
    }
}

/// A job handed to its lane ([`RedisStore::enqueue`]): its answer, once the lane has it.
enum Submitted<'s> {
    /// Queued behind the lane's call in flight: answered by the batch it leaves in.
    Waiting(oneshot::Receiver<Answer>),
    /// The lane was idle: this job's own call, sent when first polled.
    Lead(std::pin::Pin<Box<dyn std::future::Future<Output = Answer> + Send + 's>>),
}

impl std::future::Future for Submitted<'_> {
    type Output = Answer;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Answer> {
        match self.get_mut() {
            Submitted::Waiting(rx) => std::pin::Pin::new(rx)
                .poll(cx)
                .map(|answer| answer.unwrap_or_else(|_| Err(RedisStoreError::dropped()))),
            Submitted::Lead(call) => call.as_mut().poll(cx),
        }
    }
}

/// A plan's check handed to its lane ([`RedisStore::check_begin`]): a future of the lane's
/// reply, read by [`CheckReply::verdict`].
#[must_use = "a pending check does nothing unless polled (dropped, its plan is given up)"]
pub struct PendingCheck<'s> {
    call: Submitted<'s>,
    /// The base of the plan's integer reply.
    base: u64,
    /// When it was begun: its deadline is this plus the store's call timeout.
    begun: tokio::time::Instant,
}

impl PendingCheck<'_> {
    /// When the check was begun (its deadline is this plus [`RedisStore::call_timeout`]):
    /// for a caller timing the call, one clock read fewer.
    pub fn begun(&self) -> std::time::Instant {
        self.begun.into_std()
    }
}

impl std::fmt::Debug for PendingCheck<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.call {
            Submitted::Waiting(_) => "queued",
            Submitted::Lead(_) => "leading",
        };
        f.debug_struct("PendingCheck")
            .field("call", &state)
            .finish()
    }
}

impl std::future::Future for PendingCheck<'_> {
    type Output = Result<CheckReply, RedisStoreError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        let base = this.base;
        std::pin::Pin::new(&mut this.call)
            .poll(cx)
            .map(|answer| answer.map(|value| CheckReply { value, base }))
    }
}

/// The store's reply to a [`PendingCheck`].
#[derive(Debug)]
pub struct CheckReply {
    value: redis::Value,
    base: u64,
}

impl CheckReply {
    /// The plan's verdict: `checks` must be the ones [`RedisStore::check_begin`] was given.
    pub fn verdict(&self, checks: &[Check<'_>]) -> Result<Verdict, RedisStoreError> {
        let reply = parse_reply(&self.value, limits_of(checks), self.base)?;
        Ok(verdict(checks, reply.decisions))
    }
}

impl RedisStore {
    /// Hands `job` to `lane` before it returns; the future it gives runs the job at once when
    /// the lane was idle (the call this job leads, sent when first polled), else answers when
    /// the batch it queued for does. Bounded by `deadline` (a timeout error then) on the
    /// store's own connection, where the lane's timers are the call's only ones (see
    /// [`RedisStore::check_bounded`]).
    fn enqueue(&self, lane: Arc<Lane>, job: Job, deadline: tokio::time::Instant) -> Submitted<'_> {
        {
            let mut state = lane.lock();
            if state.busy {
                let (tx, rx) = oneshot::channel();
                state.queue.push_back(Waiting {
                    job,
                    reply: tx,
                    deadline,
                });
                return Submitted::Waiting(rx);
            }
            state.busy = true;
        }
        // The lane is this job's from here: the guard, moved into the call, marks it idle
        // (or drains what queued meanwhile) when the call ends, or when it is dropped unsent.
        let busy = Busy { store: self, lane };
        // Boxed: the call's future is large, and only the plan that leads the lane needs
        // it; the others wait on their oneshot. A plan's future is moved several times on
        // its way through the gateway, so its size is paid per request.
        Submitted::Lead(Box::pin(self.lead(busy, job, deadline)))
    }

    /// The call of a plan that found its lane idle, sent at once; the lane is marked idle (or
    /// drained) when it ends.
    async fn lead(&self, busy: Busy<'_>, job: Job, deadline: tokio::time::Instant) -> Answer {
        let lane = &busy.lane;
        if !self.lanes_bound_plans() {
            // Its caller's timer bounds it (`check_bounded`).
            return self
                .run_alone(&job, Via::Lane(lane))
                .await
                .map_err(Into::into);
        }
        // The store's own connection has no timer of its own: this is the one.
        self.by(deadline, self.run_alone(&job, Via::Lane(lane)))
            .await
    }

    /// `call`'s answer, or a timeout error (`call_timeout`) at `deadline`.
    async fn by(
        &self,
        deadline: tokio::time::Instant,
        call: impl std::future::Future<Output = Result<redis::Value, redis::RedisError>>,
    ) -> Answer {
        match tokio::time::timeout_at(deadline, call).await {
            Ok(r) => r.map_err(Into::into),
            Err(_) => Err(RedisStoreError::timed_out(self.call_timeout())),
        }
    }

    /// One call alone, with its own script.
    async fn run_alone(&self, job: &Job, via: Via<'_>) -> Result<redis::Value, redis::RedisError> {
        match job {
            Job::Plan(plan) => self.run_job_on(plan, via).await,
            Job::Lease(lease) => self.run_lease_on(lease, via).await,
        }
    }

    /// One batch: the plans' batch script (or, alone, the plan's own), every plan answered.
    async fn run_batch(&self, lane: &Lane, batch: Vec<Waiting>, shapes: &[Form]) {
        if batch.len() <= 1 {
            if let Some(w) = batch.into_iter().next() {
                self.run_one(lane, w).await;
            }
            return;
        }
        match self.batch_call(lane, &batch, shapes) {
            Some(call) => self.run_batch_call(lane, batch, shapes, &call).await,
            // No batch script for this list (past the bound): one call each, in order.
            None => self.run_each_alone(batch, Via::Lane(lane)).await,
        }
    }

    /// One call alone on `lane`, with its own script, by its deadline, answered.
    async fn run_one(&self, lane: &Lane, w: Waiting) {
        let answer = self
            .by(w.deadline, self.run_alone(&w.job, Via::Lane(lane)))
            .await;
        let _ = w.reply.send(answer);
    }

    /// A batch of several calls in its batch `call`, every call answered.
    async fn run_batch_call(
        &self,
        lane: &Lane,
        batch: Vec<Waiting>,
        shapes: &[Form],
        call: &BatchCall,
    ) {
        // The earliest deadline of the plans: the batch's call is theirs, bounded by each.
        let Some(deadline) = earliest(&batch) else {
            return;
        };
        let jobs: Vec<&Job> = batch.iter().map(|w| &w.job).collect();
        let run = self.run_script_on(
            call.script.get(),
            |cmd| self.push_call_args(cmd, &jobs, shapes, call),
            Via::Lane(lane),
            call.room,
        );
        let reply = tokio::time::timeout_at(deadline, run).await.ok();
        self.answer_batch(lane, batch, reply).await;
    }

    /// The script call of a batch of several calls: `None` when there is no batch script for
    /// its list of forms (past the bound).
    fn batch_call(&self, lane: &Lane, batch: &[Waiting], shapes: &[Form]) -> Option<BatchCall> {
        let across = lane.across_slots;
        let leases = batch.iter().all(|w| w.job.is_lease());
        let script = match (leases, across) {
            (true, false) => BatchScript::Fixed(lease_batch_script()),
            (true, true) => BatchScript::Fixed(lease_batch_script_across()),
            (false, false) => BatchScript::Generated(batch_script(shapes)?),
            (false, true) => BatchScript::Generated(batch_script_across(shapes)?),
        };
        let room = batch.iter().fold(Room::SMALL, |room, w| {
            room.and(match &w.job {
                Job::Plan(p) => p.room(),
                Job::Lease(l) => Room::lease(l),
            })
        });
        Some(BatchCall {
            script,
            leases,
            across,
            room,
        })
    }

    /// A batch call's arguments (after the script).
    fn push_call_args(&self, cmd: &mut dyn Args, jobs: &[&Job], shapes: &[Form], call: &BatchCall) {
        if call.leases {
            self.push_lease_batch_args(cmd, jobs, call.across);
        } else {
            self.push_batch_args(cmd, jobs, shapes, call.across);
        }
    }

    /// Answers every call of `batch` from its batch call's `reply` (`None`: the call outlived
    /// the earliest deadline of its calls).
    async fn answer_batch(
        &self,
        lane: &Lane,
        batch: Vec<Waiting>,
        reply: Option<Result<redis::Value, RedisError>>,
    ) {
        let across = lane.across_slots;
        let reply = match reply {
            // A server that refuses the across-slots script itself (older than Redis 7):
            // slot lanes from now on, and these plans alone.
            Some(Err(e)) if across && refuses_script_flags(&e) => {
                tracing::warn!(error = %e, "the cluster refused the across-slots batch script; batching per slot");
                self.disable_node_lanes();
                self.run_each_alone(batch, Via::Shared).await;
                return;
            }
            // Its one declared key has left a migrating slot (see `Packed::across_slots`):
            // each plan alone, every key declared, where the client follows the ASK.
            Some(Err(e)) if across && is_ask(&e) => {
                self.refresh_nodes_soon();
                self.run_each_alone(batch, Via::Shared).await;
                return;
            }
            Some(Ok(redis::Value::Array(items))) if items.len() == batch.len() => Ok(items),
            Some(Ok(other)) => Err(RedisStoreError::protocol(format!(
                "the batch script answered {other:?}, expected an array of {}",
                batch.len()
            ))),
            Some(Err(e)) => Err(e.into()),
            None => Err(RedisStoreError::timed_out(self.call_timeout())),
        };
        match reply {
            Ok(items) => {
                // Plans with a key of another node (across slots only): run alone, in order,
                // after the others are answered (none of them shares a key with these: a
                // key that failed to read failed for every plan of the batch).
                let mut elsewhere: Vec<Waiting> = Vec::new();
                for (w, item) in batch.into_iter().zip(items) {
                    let answer = match item {
                        redis::Value::ServerError(e) if across && e.code() == ELSEWHERE => {
                            elsewhere.push(w);
                            continue;
                        }
                        redis::Value::ServerError(e) => Err(redis::RedisError::from(e).into()),
                        v => Ok(v),
                    };
                    let _ = w.reply.send(answer);
                }
                if !elsewhere.is_empty() {
                    self.refresh_nodes_soon();
                    // On redis-rs's cluster connection, which follows them to their node.
                    self.run_each_alone(elsewhere, Via::Shared).await;
                }
            }
            Err(e) => {
                for w in batch {
                    let _ = w.reply.send(Err(e.duplicate()));
                }
            }
        }
    }

    /// Batches that left the queue together (`Lane::take_calls`), in order. On the lane's own
    /// connection their calls are written together, one write, and answered in order (a
    /// pipeline: the server runs them in that order): each batch of several calls its batch
    /// call, each call alone (a batch of one, or of a list of forms past the batch scripts'
    /// bound) its own script's. Without an own connection, one batch after another.
    async fn run_batches(&self, lane: &Lane, batches: Vec<(Vec<Waiting>, Vec<Form>)>) {
        let Some(own) = self.own_connection(Via::Lane(lane)) else {
            for (batch, shapes) in batches {
                self.run_batch(lane, batch, &shapes).await;
            }
            return;
        };
        let mut entries: Vec<Entry> = Vec::with_capacity(batches.len());
        for (batch, shapes) in batches {
            let call = if batch.len() > 1 {
                self.batch_call(lane, &batch, &shapes)
            } else {
                None
            };
            match call {
                Some(call) => entries.push(Entry::Batch {
                    batch,
                    shapes,
                    call,
                }),
                None => entries.extend(batch.into_iter().map(Entry::Alone)),
            }
        }
        self.run_together(lane, own, entries).await;
    }

    /// The calls of [`RedisStore::run_batches`] written together on the lane's own
    /// connection, bounded as one call by the earliest deadline of their plans. One call
    /// alone goes as it would without the others. A call the server answers NOSCRIPT (a
    /// restart, a flush) is sent again on its own, which loads its script.
    ///
    /// A round with a script this lane has not run (see `Lane::loaded`) goes call after call
    /// instead, each loading its script first where it is new ([`RedisStore::run_script_on`]).
    /// Written together, its calls' scripts would be loaded in front of them, and a flush
    /// between two of those loads (or a failover) would leave a later call's script loaded and
    /// an earlier one's not: the later call would run, and the earlier, answered NOSCRIPT, run
    /// again after it, out of arrival order. A round of known scripts only, after such a loss,
    /// is answered NOSCRIPT from some call on to its end, and those calls are sent again call
    /// after call. So the first round of a new script on a lane, and the round after a loss,
    /// pay a round trip a call.
    async fn run_together(&self, lane: &Lane, own: Own<'_>, entries: Vec<Entry>) {
        let new = {
            let run = lane.scripts_run();
            entries.iter().any(|e| !run.contains(&e.script().sha))
        };
        if entries.len() <= 1 || new {
            for entry in entries {
                match entry {
                    Entry::Batch {
                        batch,
                        shapes,
                        call,
                    } => self.run_batch_call(lane, batch, &shapes, &call).await,
                    Entry::Alone(w) => self.run_one(lane, w).await,
                }
            }
            return;
        }
        let Some(deadline) = entries.iter().filter_map(Entry::earliest).min() else {
            return;
        };
        let mut packed: Vec<Packed> = entries
            .iter()
            .map(|entry| {
                let (first, second) = (b"EVALSHA".as_slice(), entry.script().sha.as_bytes());
                match entry {
                    Entry::Batch {
                        batch,
                        shapes,
                        call,
                    } => {
                        let jobs: Vec<&Job> = batch.iter().map(|w| &w.job).collect();
                        packed_call(first, second, call.room, |cmd| {
                            self.push_call_args(cmd, &jobs, shapes, call)
                        })
                        .across_slots(call.across)
                    }
                    Entry::Alone(w) => match &w.job {
                        Job::Plan(p) => {
                            packed_call(first, second, p.room(), |cmd| self.push_plan_args(cmd, p))
                        }
                        Job::Lease(l) => packed_call(first, second, Room::lease(l), |cmd| {
                            self.push_lease_call_args(cmd, l)
                        }),
                    },
                }
            })
            .collect();
        let replies =
            tokio::time::timeout_at(deadline, self.query_own_many(own, &mut packed)).await;
        let replies = match replies {
            Ok(Ok(replies)) if replies.len() == packed.len() => replies,
            failed => {
                let e = match failed {
                    Err(_) => RedisStoreError::timed_out(self.call_timeout()),
                    Ok(Err(e)) => e.into(),
                    Ok(Ok(replies)) => RedisStoreError::protocol(format!(
                        "{} replies to {} calls written together",
                        replies.len(),
                        packed.len()
                    )),
                };
                for w in entries.into_iter().flat_map(Entry::into_waiting) {
                    let _ = w.reply.send(Err(e.duplicate()));
                }
                return;
            }
        };
        let lost = |r: &Result<redis::Value, RedisError>| matches!(r, Err(e) if is_noscript(e));
        if replies.iter().any(lost) {
            lane.forget_run();
        } else {
            lane.note_run(entries.iter().map(|e| e.script().sha.as_str()));
        }
        for (entry, reply) in entries.into_iter().zip(replies) {
            let noscript = lost(&reply);
            match entry {
                Entry::Batch { batch, shapes, .. } if noscript => {
                    self.run_batch(lane, batch, &shapes).await;
                }
                Entry::Batch { batch, .. } => self.answer_batch(lane, batch, Some(reply)).await,
                Entry::Alone(w) if noscript => self.run_one(lane, w).await,
                Entry::Alone(w) => {
                    let _ = w.reply.send(reply.map_err(Into::into));
                }
            }
        }
    }

    /// Runs each call alone, in order, each by its deadline.
    async fn run_each_alone(&self, batch: Vec<Waiting>, via: Via<'_>) {
        for w in batch {
            if w.reply.is_closed() {
                continue;
            }
            let answer = self.by(w.deadline, self.run_alone(&w.job, via)).await;
            let _ = w.reply.send(answer);
        }
    }

    /// The lease batch script's arguments (see `lease_batch_script`).
    fn push_lease_batch_args(&self, cmd: &mut dyn Args, jobs: &[&Job], across: bool) {
        let leases: Vec<&LeaseJob> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Lease(l) => Some(l),
                Job::Plan(_) => None,
            })
            .collect();
        let per = if self.ttl_floor_ms().is_some() { 10 } else { 9 };
        if across {
            // One declared key routes the call; the count and every key follow `per`.
            cmd.arg(1)
                .arg(leases.first().map_or("", |l| l.key.as_str()))
                .arg(per)
                .arg(leases.len());
            for l in &leases {
                cmd.arg(&l.key);
            }
        } else {
            cmd.arg(leases.len());
            for l in &leases {
                cmd.arg(&l.key);
            }
            cmd.arg(per);
        }
        for l in &leases {
            self.push_lease_args(cmd, l);
        }
    }

    /// The batch script's arguments (see `batch_script.rs`).
    fn push_batch_args(&self, cmd: &mut dyn Args, jobs: &[&Job], shapes: &[Form], across: bool) {
        let plans: Vec<CallPlan<'_>> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Plan(p) => Some(CallPlan {
                    keys: &p.keys,
                    costs: &p.costs,
                    now: p.now,
                    form: &p.form,
                    quotas: &p.quotas,
                }),
                Job::Lease(_) => None,
            })
            .collect();
        let local = self.clock() == crate::StoreClock::Local;
        push_batch_call(
            cmd,
            &plans,
            shapes,
            across,
            local,
            self.ttl_floor_ms().unwrap_or(0),
        );
    }
}

/// What a settle applied to each item, and the instant each call ran at.
struct Settled {
    out: Vec<u64>,
    at: Vec<Micros>,
}

impl Settled {
    /// Takes a settle call's `reply` for `chunk`: the items it answered "elsewhere", which
    /// only an across-slots call (`across`) may (nothing of them applied).
    fn take(
        &mut self,
        chunk: &[usize],
        reply: redis::Value,
        across: bool,
    ) -> Result<Vec<usize>, RedisStoreError> {
        let (values, ran_at) = settle_values(reply, chunk.len())?;
        let mut elsewhere = Vec::new();
        for (&i, v) in chunk.iter().zip(values) {
            match v {
                redis::Value::Int(n) => {
                    self.out[i] = u64::try_from(n).unwrap_or(0);
                    self.at[i] = ran_at;
                }
                redis::Value::ServerError(e) if across && e.code() == ELSEWHERE => {
                    elsewhere.push(i)
                }
                other => {
                    return Err(RedisStoreError::protocol(format!(
                        "the settle script answered {other:?} for an item"
                    )))
                }
            }
        }
        Ok(elsewhere)
    }
}

/// The settle script's reply: one value per item of the `n` it was given, and the instant the
/// call ran at.
fn settle_values(
    reply: redis::Value,
    n: usize,
) -> Result<(Vec<redis::Value>, Micros), RedisStoreError> {
    let redis::Value::Array(mut values) = reply else {
        return Err(RedisStoreError::protocol(format!(
            "the settle script answered {reply:?}, expected an array"
        )));
    };
    if values.len() != n + 1 {
        return Err(RedisStoreError::protocol(format!(
            "the settle script answered {} values for {n} items and its instant",
            values.len()
        )));
    }
    match values.pop() {
        Some(redis::Value::Int(t)) => u64::try_from(t).map(|t| (values, t)).map_err(|_| {
            RedisStoreError::protocol(format!("the settle script answered the instant {t}"))
        }),
        other => Err(RedisStoreError::protocol(format!(
            "the settle script answered {other:?} for its instant"
        ))),
    }
}

/// Whether `e` is a server refusing a script's `#!lua flags=` line (Redis before 7 cannot
/// compile it; a later one may not know a flag), not a passing state of the cluster.
fn refuses_script_flags(e: &RedisError) -> bool {
    let text = e.to_string();
    matches!(e.kind(), ErrorKind::Server(_))
        && (text.contains("shebang") || text.contains("compiling script"))
}

/// `CLUSTER SLOTS`' ranges as (first slot, last slot, the master's id, or its address
/// where the reply carries no id); `None` for a reply of another form.
fn parse_cluster_slots(reply: &redis::Value) -> Option<Vec<SlotRange>> {
    let redis::Value::Array(entries) = reply else {
        return None;
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(n) => Some(n.to_string()),
        _ => None,
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let redis::Value::Array(parts) = entry else {
            return None;
        };
        let (
            Some(redis::Value::Int(start)),
            Some(redis::Value::Int(end)),
            Some(redis::Value::Array(master)),
        ) = (parts.first(), parts.get(1), parts.get(2))
        else {
            return None;
        };
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        if start > end || end >= 16384 {
            return None;
        }
        let host = master.first().and_then(text)?;
        let port = master.get(1).and_then(text)?;
        // Where the node says it is: an empty host or `?` is a node that does not know its
        // own address (no connection of ours is made to it).
        let addr = match (host.as_str(), port.parse::<u16>()) {
            ("" | "?", _) | (_, Err(_)) => None,
            (h, Ok(p)) => Some((h.to_owned(), p)),
        };
        let id = match master.get(2).and_then(text) {
            Some(id) if !id.is_empty() => id,
            _ => format!("{host}:{port}"),
        };
        ranges.push(SlotRange {
            start,
            end,
            id,
            addr,
        });
    }
    Some(ranges)
}

/// One range of `CLUSTER SLOTS`: its slots, its master's id (or address, for a server that
/// gives no id), and the master's address when it gives one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotRange {
    start: usize,
    end: usize,
    id: String,
    addr: Option<(String, u16)>,
}

/// The form of a plan's script (see [`Form::of_limits`]).
fn form_of(checks: &[Check<'_>]) -> Option<Form> {
    Form::of_limits(checks.iter().map(|c| (c.rule.limit(), c.mode)))
}

/// The limits of a plan's rules, in plan order (what its reply is read against).
fn limits_of<'a>(checks: &'a [Check<'_>]) -> impl ExactSizeIterator<Item = u64> + 'a {
    checks.iter().map(|c| c.rule.limit().quota().limit())
}

/// Drains `lane` until the queue is empty (which marks the lane idle): each round, what
/// waits leaves at once, up to [`TOGETHER`] x `max_batch` plans, their calls written
/// together (a batch whose list of forms has no batch script: a call each).
async fn drain(store: RedisStore, lane: Arc<Lane>) {
    loop {
        let batches = lane.take_calls(
            store.max_batch(),
            TOGETHER,
            store.call_timeout(),
            &store.forms,
        );
        if batches.is_empty() {
            return;
        }
        store.run_batches(&lane, batches).await;
    }
}

/// At most this many times `max_batch` plans leave a lane in one round (one round trip): as
/// many full batch calls as the store's own connection may owe replies of calls given up
/// (`direct::MAX_OWED`), so that a round of full batches given up whole keeps its socket (a
/// round of shorter batches, plans of many forms, or of calls alone past the batch scripts'
/// bound, may owe more: its socket is closed then, and the next call opens another).
const TOGETHER: usize = crate::direct::MAX_OWED;

/// The earliest deadline of `batch`'s calls.
fn earliest(batch: &[Waiting]) -> Option<tokio::time::Instant> {
    batch.iter().map(|w| w.deadline).min()
}

/// The script of a batch call: generated for its forms, or the lease batch's.
enum BatchScript {
    Generated(Arc<Script>),
    Fixed(&'static Script),
}

impl BatchScript {
    fn get(&self) -> &Script {
        match self {
            BatchScript::Generated(s) => s,
            BatchScript::Fixed(s) => s,
        }
    }
}

/// What a batch of several calls sends: its script, its kind, and room for its arguments.
struct BatchCall {
    script: BatchScript,
    leases: bool,
    across: bool,
    room: Room,
}

/// One call of a round written together ([`RedisStore::run_together`]): a batch call, whose
/// reply is an array with one element a plan, or a call alone, whose reply is its answer.
enum Entry {
    Batch {
        batch: Vec<Waiting>,
        shapes: Vec<Form>,
        call: BatchCall,
    },
    Alone(Waiting),
}

impl Entry {
    /// The script the entry's call runs.
    fn script(&self) -> &Script {
        match self {
            Entry::Batch { call, .. } => call.script.get(),
            Entry::Alone(w) => match &w.job {
                Job::Plan(p) => &p.script,
                Job::Lease(_) => lease_script(),
            },
        }
    }

    fn earliest(&self) -> Option<tokio::time::Instant> {
        match self {
            Entry::Batch { batch, .. } => earliest(batch),
            Entry::Alone(w) => Some(w.deadline),
        }
    }

    fn into_waiting(self) -> Vec<Waiting> {
        match self {
            Entry::Batch { batch, .. } => batch,
            Entry::Alone(w) => vec![w],
        }
    }
}

/// How many times a call answered NOSCRIPT is sent again behind a SCRIPT LOAD of its script
/// before it is sent with the script itself (EVAL): the server lost the script again between
/// the load and the call each time (a flush or a failover; a long script is read in several
/// pieces, and the server serves other clients between them). EVAL runs whatever the server
/// lost, but Redis 7.4 and later evict the scripts it loads, so it is the last resort only.
const RELOADS: usize = 2;

/// Whether `e` is a Cluster node's ASK.
fn is_ask(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(redis::ServerErrorKind::Ask)
}

/// Whether `e` is a Cluster node's TRYAGAIN (a call's keys split by a slot's migration).
fn is_try_again(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(redis::ServerErrorKind::TryAgain)
}

/// SCRIPT EXISTS of `shas`, for the store's own connection.
fn packed_exists(shas: &[String]) -> Packed {
    let mut p = Packed::with_capacity(shas.len() * 48 + 32);
    p.bulk(b"SCRIPT");
    p.bulk(b"EXISTS");
    for sha in shas {
        p.bulk(sha.as_bytes());
    }
    p
}

/// The SHAs of `asked` that SCRIPT EXISTS's `reply` says the server has; `None` where the
/// reply is not one flag each (a refusal: an ACL user without SCRIPT EXISTS).
fn present(
    asked: Vec<String>,
    reply: Result<redis::Value, RedisError>,
) -> Option<impl Iterator<Item = String>> {
    let flags = match reply {
        Ok(redis::Value::Array(flags)) if flags.len() == asked.len() => flags,
        _ => return None,
    };
    Some(
        asked
            .into_iter()
            .zip(flags)
            .filter(|(_, flag)| matches!(flag, redis::Value::Int(1)))
            .map(|(sha, _)| sha),
    )
}

/// SCRIPT LOAD of `s`, for redis-rs's connections (on a Cluster, sent to every master).
fn script_load(s: &Script) -> Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(&s.text);
    cmd
}

/// SCRIPT LOAD of `s`, for the store's own connection.
fn packed_load(s: &Script) -> Packed {
    let mut p = Packed::with_capacity(s.text.len() + 32);
    p.bulk(b"SCRIPT");
    p.bulk(b"LOAD");
    p.bulk(s.text.as_bytes());
    p
}

/// A command for the store's own connection: `first` and `second` (`EVALSHA` and the SHA),
/// then `args`, with `room` reserved up front.
fn packed_call(
    first: &[u8],
    second: &[u8],
    room: Room,
    args: impl FnOnce(&mut dyn Args),
) -> Packed {
    let mut p = Packed::with_capacity(second.len() + room.bytes + room.args * 8 + 64);
    p.bulk(first);
    p.bulk(second);
    args(&mut p);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Algorithm, Limit, Quota, Rule};

    #[test]
    fn cluster_slots_replies_read_as_ranges_by_node_id_or_address() {
        use redis::Value::{Array, BulkString, Int};
        let node = |ip: &str, port: i64, id: &str| {
            let mut v = vec![BulkString(ip.into()), Int(port)];
            if !id.is_empty() {
                v.push(BulkString(id.into()));
            }
            Array(v)
        };
        let reply = Array(vec![
            Array(vec![
                Int(0),
                Int(5460),
                node("10.0.0.1", 6379, "aaa"),
                node("10.0.0.4", 6379, "ddd"),
            ]),
            Array(vec![Int(5461), Int(16383), node("10.0.0.2", 6380, "")]),
        ]);
        let range = |start, end, id: &str, addr: Option<(&str, u16)>| SlotRange {
            start,
            end,
            id: id.to_string(),
            addr: addr.map(|(h, p)| (h.to_string(), p)),
        };
        assert_eq!(
            parse_cluster_slots(&reply),
            Some(vec![
                range(0, 5460, "aaa", Some(("10.0.0.1", 6379))),
                range(5461, 16383, "10.0.0.2:6380", Some(("10.0.0.2", 6380)))
            ])
        );
        // A node that does not know its address (`?` or empty), or a port out of range: no
        // address, so no connection of the store's own to it.
        let unknown = Array(vec![
            Array(vec![Int(0), Int(10), node("?", 7000, "q")]),
            Array(vec![Int(11), Int(20), node("", 7001, "e")]),
            Array(vec![Int(21), Int(30), node("h", 70000, "p")]),
        ]);
        assert_eq!(
            parse_cluster_slots(&unknown),
            Some(vec![
                range(0, 10, "q", None),
                range(11, 20, "e", None),
                range(21, 30, "p", None)
            ])
        );
        // Out of range, reversed, or of another form: no table rather than a wrong one.
        for bad in [
            Array(vec![Array(vec![Int(0), Int(16384), node("h", 1, "x")])]),
            Array(vec![Array(vec![Int(9), Int(3), node("h", 1, "x")])]),
            Array(vec![Array(vec![Int(-1), Int(3), node("h", 1, "x")])]),
            Array(vec![Int(1)]),
            Int(3),
        ] {
            assert_eq!(parse_cluster_slots(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_rule_checked_twice_for_one_client_is_found_in_short_and_long_plans() {
        let limit =
            Limit::new(Algorithm::Gcra, Quota::per_minute(10).expect("quota")).expect("limit");
        let rules: Vec<Rule> = (0..40).map(|i| Rule::new(format!("r{i}"), limit)).collect();
        for n in [2, 16, 17, 40] {
            let client = |i: usize| ClientKey([u8::try_from(i % 3).unwrap_or(0); 16]);
            let mut checks: Vec<Check<'_>> = (0..n)
                .map(|i| Check::new(client(i), &rules[i], 1))
                .collect();
            assert!(twice(&checks).is_none(), "{n} distinct checks");
            // Another client under a rule already in the plan is no duplicate.
            checks.push(Check::new(ClientKey([9; 16]), &rules[0], 1));
            assert!(twice(&checks).is_none(), "{n}: another client");
            checks.push(Check::new(client(n - 1), &rules[n - 1], 1));
            let dup = twice(&checks).expect("the same client and rule again");
            assert_eq!(dup.rule.name(), rules[n - 1].name(), "{n}");
        }
    }
}

/// A Redis key's pieces in order, `<prefix>:{<client>}:<policy>`: the one place the key's
/// layout is written down ([`RedisStore::key`], and a plan's keys in one buffer).
fn key_pieces<'a>(prefix: &'a str, client_hex: &'a [u8; 32], policy: &'a str) -> [&'a [u8]; 5] {
    [
        prefix.as_bytes(),
        b":{",
        client_hex,
        b"}:",
        policy.as_bytes(),
    ]
}

#[cfg(test)]
mod future_size {
    use super::*;

    /// A check's future is moved several times per request on its way through a gateway:
    /// what only some calls need (the lane's own call, a script load, a plan across slots) is
    /// boxed where it starts, so the future every plan carries stays small.
    #[tokio::test]
    async fn a_checks_future_stays_small() {
        let server = tollgate_testkit::RedisServer::start();
        let store = RedisStore::connect(RedisConfig::standalone(server.url()))
            .await
            .expect("connect");
        let quota = tollgate_core::Quota::new(5, std::time::Duration::from_secs(60)).expect("q");
        let limit = tollgate_core::Limit::new(tollgate_core::Algorithm::Gcra, quota).expect("l");
        let r = Rule::new("x", limit);
        let checks = [Check::new(ClientKey::from_u128(1), &r, 1)];
        let check = std::mem::size_of_val(&store.check(&checks, 0));
        let timed = std::mem::size_of_val(&store.check_timed(&checks, 0));
        let bounded = std::mem::size_of_val(&store.check_bounded(&checks, 0));
        eprintln!("check {check} bytes, check_timed {timed} bytes, check_bounded {bounded}");
        // The gateway's call, 592 bytes in a debug build: its job travels inline (192 bytes:
        // keys, costs, form and packed quotas, where a boxed 440-byte shape was built and
        // copied), and its rare path (a first script load, a plan across slots) is boxed.
        assert!(
            bounded <= 640,
            "RedisStore::check_bounded's future is {bounded} bytes"
        );
        // 5,376 and 5,440 bytes before the boxing (a debug build).
        assert!(check <= 3072, "RedisStore::check's future is {check} bytes");
        assert!(
            timed <= 3072,
            "RedisStore::check_timed's future is {timed} bytes"
        );
    }
}

#[cfg(test)]
mod plan_keys {
    use super::*;

    /// A plan's keys in one buffer are the keys one by one, whichever clients repeat: the
    /// hex digits reused for a run of one client never stand for another.
    #[tokio::test]
    async fn a_plans_keys_are_each_checks_own_key() {
        let server = tollgate_testkit::RedisServer::start();
        let config = RedisConfig {
            key_prefix: "tg-test".into(),
            ..RedisConfig::standalone(server.url())
        };
        let store = RedisStore::connect(config).await.expect("connect");
        let quota = tollgate_core::Quota::new(5, std::time::Duration::from_secs(60)).expect("q");
        let limit = tollgate_core::Limit::new(tollgate_core::Algorithm::Gcra, quota).expect("l");
        let rules = [
            Rule::new("per-user", limit),
            Rule::new("per-ip", limit),
            Rule::new("global, with a longer name", limit),
        ];
        let (a, b) = (ClientKey::from_u128(7), ClientKey::from_u128(u128::MAX - 3));
        let clients = [a, a, b, a, b, b];
        let checks: Vec<Check<'_>> = clients
            .iter()
            .enumerate()
            .map(|(i, &c)| Check::new(c, &rules[i % rules.len()], 1))
            .collect();
        for n in 1..=checks.len() {
            let keys = store.plan_keys(&checks[..n]);
            let want: Vec<String> = checks[..n]
                .iter()
                .map(|c| store.key(&c.client, c.rule.name()))
                .collect();
            let got: Vec<&[u8]> = keys.iter().collect();
            assert_eq!(got.len(), n);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(*g, w.as_bytes(), "{}", String::from_utf8_lossy(g));
                assert!(w.starts_with("tg-test:{"), "{w}");
            }
            assert_eq!(keys.bytes(), want.iter().map(String::len).sum::<usize>());
            assert_eq!(keys.first(), want.first().map(|w| w.as_bytes()));
        }
    }
}
