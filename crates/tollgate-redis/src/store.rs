//! The store: connections (standalone or cluster), key layout, one script call per request.

use crate::config::{redact, RedisConfig, StoreClock, CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use crate::error::RedisStoreError;
use crate::script::{script, set_script, single_script, LimitHash, Script, MAX_SET_POLICIES};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::RwLock;
use tollgate_core::{Check, ClientKey, Decision, Limit, Micros, Verdict};

/// The largest cost sent to the script. Any cost above `MAX_LIMIT` is denied outright, so
/// clamping to 2^53 (exact in Lua) changes no decision.
const MAX_COST: u64 = 1 << 53;

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
    /// The single-policy scripts this store loaded into its server(s), by policy shape: one
    /// lookup per check finds the script and knows it is loaded.
    ready: Ready<Limit>,
    /// The same for policy-set scripts (requests matched by 2 to 8 policies), by the shapes
    /// of their policies in order.
    ready_sets: Ready<Box<[Limit]>>,
}

/// Scripts loaded into a store's server(s), by what selects them.
type Ready<K> = Arc<RwLock<HashMap<K, Arc<Script>, LimitHash>>>;

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(crate::sentinel::SentinelConnection),
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

impl RedisStore {
    /// Connects (standalone: exactly one URL; cluster: seed URLs) and loads the script.
    /// Fails when the server cannot be reached now; afterwards the store reconnects by itself.
    pub async fn connect(config: RedisConfig) -> Result<Self, RedisStoreError> {
        if config.urls.is_empty() {
            return Err(RedisStoreError::config("no Redis URL given"));
        }
        let conn = if let Some(master) = &config.sentinel_master {
            Connection::Sentinel(
                crate::sentinel::SentinelConnection::connect(&config.urls, master).await?,
            )
        } else if config.cluster {
            Connection::Cluster(connect_cluster(&config.urls).await?)
        } else {
            if config.urls.len() != 1 {
                return Err(RedisStoreError::config(
                    "a standalone Redis takes exactly one URL (use the redis-cluster backend for several)",
                ));
            }
            Connection::Standalone(connect_standalone(&config.urls[0]).await?)
        };
        let store = Self {
            conn,
            prefix: config.key_prefix.into(),
            clock: config.clock,
            ttl_floor_ms: None,
            ready: Arc::default(),
            ready_sets: Arc::default(),
        };
        // The multi-policy script; single-policy ones load on first use or in `prepare`.
        store.load(script()).await?;
        Ok(store)
    }

    /// Decides `checks` for `client` all-or-nothing in one round trip: when every check
    /// allows, all are charged; otherwise none is. `now` (microseconds since the epoch) is
    /// used only with [`StoreClock::Local`]; with the store clock Redis `TIME` decides.
    pub async fn check(
        &self,
        client: &ClientKey,
        checks: &[Check<'_>],
        now: Micros,
    ) -> Result<Verdict, RedisStoreError> {
        if checks.is_empty() {
            return Ok(Verdict {
                allowed: true,
                decisions: Vec::new(),
            });
        }
        for (i, c) in checks.iter().enumerate() {
            if checks[..i].iter().any(|o| o.rule.name() == c.rule.name()) {
                return Err(RedisStoreError::invalid(format!(
                    "policy {:?} is checked twice in one request",
                    c.rule.name()
                )));
            }
        }
        if let [one] = checks {
            if let Some(s) = self.single(one.rule.limit()).await? {
                return self.check_single(&s, client, one, now).await;
            }
        } else if checks.len() <= MAX_SET_POLICIES {
            let limits: Vec<Limit> = checks.iter().map(|c| *c.rule.limit()).collect();
            if let Some(s) = self.set(&limits).await? {
                let reply = self
                    .run_script(&s, |cmd| self.push_set_args(cmd, client, checks, now))
                    .await?;
                return parse_set(&reply, checks);
            }
        }
        let reply = self
            .run_script(script(), |cmd| self.push_args(cmd, client, checks, now))
            .await?;
        parse_reply(&reply, checks)
    }

    /// One policy: its own script (quota built in), answering an integer or a packed string.
    async fn check_single(
        &self,
        s: &Script,
        client: &ClientKey,
        check: &Check<'_>,
        now: Micros,
    ) -> Result<Verdict, RedisStoreError> {
        let reply = self
            .run_script(s, |cmd| self.push_single_args(cmd, client, check, now))
            .await?;
        let decision = parse_single(&reply, check, s.reply_base)?;
        Ok(Verdict {
            allowed: decision.allowed,
            decisions: vec![decision],
        })
    }

    /// The single-policy script of `limit`, loaded into this store's server(s) on first use;
    /// `None` past the cap on policy shapes (the multi-policy script serves those).
    async fn single(&self, limit: &Limit) -> Result<Option<Arc<Script>>, RedisStoreError> {
        self.loaded(&self.ready, limit, single_script, |l| *l).await
    }

    /// The policy-set script of `limits`, loaded on first use like [`Self::single`]'s.
    async fn set(&self, limits: &[Limit]) -> Result<Option<Arc<Script>>, RedisStoreError> {
        self.loaded(&self.ready_sets, limits, set_script, |l: &[Limit]| l.into())
            .await
    }

    /// The script `build` makes for `key`, from `ready` when this store already loaded it,
    /// else built (or found in the process-wide cache), loaded and remembered.
    async fn loaded<K, Q>(
        &self,
        ready: &Ready<K>,
        key: &Q,
        build: impl FnOnce(&Q) -> Result<Option<Arc<Script>>, RedisStoreError>,
        owned: impl FnOnce(&Q) -> K,
    ) -> Result<Option<Arc<Script>>, RedisStoreError>
    where
        K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let found = ready
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned();
        if found.is_some() {
            return Ok(found);
        }
        let Some(s) = build(key)? else {
            return Ok(None);
        };
        self.load(&s).await?;
        ready
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(owned(key), Arc::clone(&s));
        Ok(Some(s))
    }

    /// SCRIPT LOAD (on a cluster: on every master), so the first call is an EVALSHA like the
    /// others. A server that loses its cache later answers NOSCRIPT and gets an EVAL.
    async fn load(&self, s: &Script) -> Result<(), RedisStoreError> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&s.text);
        let sha: String = match self.query(&cmd).await? {
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

    /// Loads the single-policy scripts of `limits` now, so the first request of each policy
    /// is one EVALSHA like the others (otherwise it also pays a SCRIPT LOAD round trip).
    pub async fn prepare(&self, limits: &[Limit]) -> Result<(), RedisStoreError> {
        for limit in limits {
            self.single(limit).await?;
        }
        Ok(())
    }

    /// Round-trips a PING (on a cluster: to every node).
    pub async fn ping(&self) -> Result<(), RedisStoreError> {
        self.query(&redis::cmd("PING")).await?;
        Ok(())
    }

    /// The Redis key holding `policy`'s state for `client`: `<prefix>:{<client>}:<policy>`.
    pub fn key(&self, client: &ClientKey, policy: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + policy.len() + 37);
        key.push_str(&self.prefix);
        key.push_str(":{");
        client.write_hex(&mut key);
        key.push_str("}:");
        key.push_str(policy);
        key
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

    fn push_args(&self, cmd: &mut Cmd, client: &ClientKey, checks: &[Check<'_>], now: Micros) {
        cmd.arg(checks.len());
        for c in checks {
            cmd.arg(self.key(client, c.rule.name()));
        }
        match self.clock {
            StoreClock::Store => cmd.arg(""),
            StoreClock::Local => cmd.arg(now),
        };
        for c in checks {
            let limit = c.rule.limit();
            let q = &limit.quota;
            cmd.arg(limit.algorithm.name())
                .arg(q.limit())
                .arg(q.period_micros())
                .arg(q.burst())
                .arg(c.cost.min(MAX_COST));
        }
        if let Some(ms) = self.ttl_floor_ms {
            cmd.arg(ms);
        }
    }

    /// The single-policy script's arguments: the key, then the cost (left out when it is 1
    /// and nothing follows: each argument costs Redis a string and a table slot), now (store
    /// clock: empty, and only when a PX floor follows) and the floor.
    fn push_single_args(&self, cmd: &mut Cmd, client: &ClientKey, check: &Check<'_>, now: Micros) {
        cmd.arg(1).arg(self.key(client, check.rule.name()));
        let cost = check.cost.min(MAX_COST);
        match (self.clock, self.ttl_floor_ms) {
            (StoreClock::Store, None) if cost == 1 => {}
            (StoreClock::Store, None) => {
                cmd.arg(cost);
            }
            (StoreClock::Store, Some(ms)) => {
                cmd.arg(cost).arg("").arg(ms);
            }
            (StoreClock::Local, None) => {
                cmd.arg(cost).arg(now);
            }
            (StoreClock::Local, Some(ms)) => {
                cmd.arg(cost).arg(now).arg(ms);
            }
        }
    }

    /// A policy-set script's arguments: the keys, then nothing when every cost is 1 with the
    /// store clock and no PX floor; otherwise the costs, now (store clock: empty) and the
    /// floor, the last two only when used.
    fn push_set_args(&self, cmd: &mut Cmd, client: &ClientKey, checks: &[Check<'_>], now: Micros) {
        cmd.arg(checks.len());
        for c in checks {
            cmd.arg(self.key(client, c.rule.name()));
        }
        let plain = self.clock == StoreClock::Store && self.ttl_floor_ms.is_none();
        if plain && checks.iter().all(|c| c.cost == 1) {
            return;
        }
        for c in checks {
            cmd.arg(c.cost.min(MAX_COST));
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
    /// (restart, FLUSH, failover) answers NOSCRIPT; EVAL then sends the script, which caches it
    /// again, so the next EVALSHA works and no request fails for it.
    pub(crate) async fn run_script(
        &self,
        s: &Script,
        args: impl Fn(&mut Cmd),
    ) -> Result<redis::Value, RedisError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&s.sha);
        args(&mut cmd);
        match self.query(&cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(&s.text);
                args(&mut eval);
                self.query(&eval).await
            }
            other => other,
        }
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<redis::Value, RedisError> {
        match &self.conn {
            Connection::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Sentinel(c) => c.query(cmd).await,
        }
    }
}

async fn connect_standalone(url: &str) -> Result<ConnectionManager, RedisStoreError> {
    let client = redis::Client::open(url)
        .map_err(|e| RedisStoreError::config(format!("invalid Redis URL {}: {e}", redact(url))))?;
    // No reconnect retries inside the client: while the server is down each call fails at
    // once (and triggers the next attempt) instead of waiting out a backoff schedule.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(0);
    Ok(ConnectionManager::new_with_config(client, config).await?)
}

async fn connect_cluster(urls: &[String]) -> Result<ClusterConnection, RedisStoreError> {
    let client = ClusterClient::builder(urls.iter().map(String::as_str))
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .retries(3)
        .min_retry_wait(20)
        .max_retry_wait(200)
        .build()
        .map_err(|e| {
            let urls: Vec<String> = urls.iter().map(|u| redact(u)).collect();
            RedisStoreError::config(format!("invalid Redis Cluster URLs {urls:?}: {e}"))
        })?;
    Ok(client.get_async_connection().await?)
}

/// Four integers per check: allowed, remaining, reset_after, retry_after (-1: none).
fn parse_reply(reply: &redis::Value, checks: &[Check<'_>]) -> Result<Verdict, RedisStoreError> {
    let redis::Value::Array(items) = reply else {
        return Err(RedisStoreError::protocol(format!(
            "the script answered {reply:?}, expected an array"
        )));
    };
    if items.len() != 4 * checks.len() {
        return Err(RedisStoreError::protocol(format!(
            "the script answered {} integers for {} checks",
            items.len(),
            checks.len()
        )));
    }
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => Ok(*i),
        other => Err(RedisStoreError::protocol(format!(
            "the script answered {other:?}, expected an integer"
        ))),
    };
    let unsigned = |v: &redis::Value| {
        u64::try_from(int(v)?).map_err(|_| RedisStoreError::protocol("negative count in reply"))
    };
    let mut decisions = Vec::with_capacity(checks.len());
    for (c, item) in checks.iter().zip(items.chunks_exact(4)) {
        let retry = int(&item[3])?;
        decisions.push(Decision {
            allowed: int(&item[0])? == 1,
            limit: c.rule.limit().quota.limit(),
            remaining: unsigned(&item[1])?,
            reset_after: unsigned(&item[2])?,
            retry_after: if retry < 0 {
                None
            } else {
                Some(retry.unsigned_abs())
            },
        });
    }
    Ok(Verdict {
        allowed: decisions.iter().all(|d| d.allowed),
        decisions,
    })
}

/// The single-policy script's reply. Allowed: the integer `reset_after * base + remaining`
/// (`base` > 0), or the packed string below. Packed, big-endian: allowed (1 byte), remaining
/// and reset_after (7 bytes each), and for a denial retry_after + 1 (7 bytes; 0: retrying
/// never helps).
/// A policy-set script's reply: 22 bytes per check, struct '>BI7I7I7' (allowed, remaining,
/// reset_after, retry_after + 1 with 0 for none).
fn parse_set(reply: &redis::Value, checks: &[Check<'_>]) -> Result<Verdict, RedisStoreError> {
    let bytes = match reply {
        redis::Value::BulkString(b) if b.len() == 22 * checks.len() => b,
        other => {
            return Err(RedisStoreError::protocol(format!(
                "the script answered {other:?}, expected {} bytes",
                22 * checks.len()
            )))
        }
    };
    let decisions = checks
        .iter()
        .zip(bytes.chunks_exact(22))
        .map(|(c, item)| packed_decision(item, c.rule.limit().quota.limit()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Verdict {
        allowed: decisions.iter().all(|d| d.allowed),
        decisions,
    })
}

fn parse_single(
    reply: &redis::Value,
    check: &Check<'_>,
    base: u64,
) -> Result<Decision, RedisStoreError> {
    let limit = check.rule.limit().quota.limit();
    if let redis::Value::Int(n) = reply {
        let n = u64::try_from(*n)
            .ok()
            .filter(|_| base > 0)
            .ok_or_else(|| RedisStoreError::protocol(format!("the script answered {n}")))?;
        return Ok(Decision {
            allowed: true,
            limit,
            remaining: n % base,
            reset_after: n / base,
            retry_after: None,
        });
    }
    let bytes = match reply {
        redis::Value::BulkString(b)
            if matches!((b.len(), b.first()), (15, Some(1)) | (22, Some(0))) =>
        {
            b
        }
        other => {
            return Err(RedisStoreError::protocol(format!(
                "the script answered {other:?}, expected 15 bytes (allowed) or 22 (denied)"
            )))
        }
    };
    packed_decision(bytes, limit)
}

/// One packed decision, struct '>BI7I7I7' (denied, or a policy of a set) or '>BI7I7' (allowed,
/// single policy): allowed (1/0), remaining, reset_after, and retry_after + 1 (0: none).
fn packed_decision(item: &[u8], limit: u64) -> Result<Decision, RedisStoreError> {
    let int = |at: usize| {
        item.get(at..at + 7)
            .map(|b| b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
            .ok_or_else(|| RedisStoreError::protocol("a packed decision is too short"))
    };
    let allowed = match item.first() {
        Some(0) => false,
        Some(1) => true,
        other => {
            return Err(RedisStoreError::protocol(format!(
                "the script answered flag {other:?}"
            )))
        }
    };
    Ok(Decision {
        allowed,
        limit,
        remaining: int(1)?,
        reset_after: int(8)?,
        retry_after: if allowed {
            None
        } else {
            int(15)?.checked_sub(1)
        },
    })
}
