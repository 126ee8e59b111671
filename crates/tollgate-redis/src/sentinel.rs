//! Redis Sentinel: the master is wherever the sentinels say it is, and that changes.
//!
//! The store asks the sentinels (`SENTINEL MASTERS`, then `ROLE` on the answer, both done by
//! redis-rs) for the master's address and keeps one multiplexed connection to it, like the
//! standalone store, and one of its own for the coalesced calls (`direct.rs`, made from the
//! same address and credentials, replaced with the master). A connection that breaks, or a server that answers READONLY (the old
//! master back as a replica), makes the store forget that master: the call fails (the
//! caller's failure policy and breaker handle it) and the next call asks the sentinels again.
//! While they have not promoted a replica yet they report the master down, so calls keep
//! failing fast until the failover is done; then the first call reconnects to the new master,
//! whose empty script cache the store refills through NOSCRIPT like after a restart.
//!
//! A failover does not always break the old master's connection: `SENTINEL FAILOVER`, or a
//! partition that heals, leaves the old master answering as a master until the sentinels
//! turn it into a replica, seconds later (11 s in the soak), and writes made there meanwhile
//! are lost when it resyncs. So a watcher asks the sentinels for the master's address every
//! [`WATCH_EVERY`] and, when they name another one, forgets the current master: the next
//! call looks the new one up.
//!
//! The lookup runs in a task of its own: a caller that gives up (its timeout is usually far
//! shorter than a lookup across three sentinels) does not cancel it, so the next caller finds
//! the master already connected. One lookup runs at a time.

use crate::command::Packed;
use crate::config::{redact, CONNECT_TIMEOUT};
use crate::error::RedisStoreError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind, TlsMode, Value};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The longest one lookup of the master may take (all sentinels, then the connection).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// After a failed lookup, calls fail at once for this long instead of queueing more lookups.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// How often the watcher asks the sentinels where the master is.
pub(crate) const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long the watcher waits for one sentinel's answer.
const WATCH_TIMEOUT: Duration = Duration::from_millis(500);

/// A connection to the master the sentinels name. Clones share it.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    sentinel: tokio::sync::Mutex<Sentinel>,
    master_name: String,
    node: SentinelNodeConnectionInfo,
    current: Mutex<Option<Master>>,
    /// The sentinels, for the watcher's own question (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    sentinels: Vec<redis::Client>,
    /// When the last lookup failed.
    failed_at: Mutex<Option<Instant>>,
    /// How long the master's connection waits for a reply (`RedisConfig::response_timeout`).
    response_timeout: Duration,
}

/// The master in use and which lookup found it.
#[derive(Clone)]
struct Master {
    conn: ConnectionManager,
    /// The store's own connection to it, for the coalesced calls (`direct.rs`).
    direct: Option<Arc<crate::direct::Direct>>,
    lookup: u64,
    /// `host:port`, as the sentinels named it.
    addr: String,
}

impl SentinelConnection {
    /// Asks the sentinels at `urls` for the master named `master_name` and connects to it.
    /// The user info of the first URL also authenticates to the master.
    pub(crate) async fn connect(
        urls: &[String],
        master_name: &str,
        response_timeout: Duration,
    ) -> Result<Self, RedisStoreError> {
        let redacted = || urls.iter().map(|u| redact(u)).collect::<Vec<_>>();
        let sentinel = Sentinel::build(urls.to_vec()).map_err(|e| {
            RedisStoreError::config(format!("invalid sentinel URLs {:?}: {e}", redacted()))
        })?;
        let first = urls.first().map(String::as_str).unwrap_or_default();
        let info = first.into_connection_info().map_err(|e| {
            RedisStoreError::config(format!("invalid sentinel URL {}: {e}", redact(first)))
        })?;
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(info.redis_settings().clone());
        if first.starts_with("rediss://") {
            node = node.set_tls_mode(TlsMode::Secure);
        }
        let sentinels = urls
            .iter()
            .filter_map(|u| redis::Client::open(u.as_str()).ok())
            .collect();
        let conn = Self {
            inner: Arc::new(Inner {
                sentinel: tokio::sync::Mutex::new(sentinel),
                master_name: master_name.to_string(),
                node,
                current: Mutex::new(None),
                sentinels,
                failed_at: Mutex::new(None),
                response_timeout,
            }),
        };
        conn.master().await?;
        tokio::spawn(watch(Arc::downgrade(&conn.inner)));
        Ok(conn)
    }

    /// Runs `cmd` on the master; forgets the master when the answer says it is gone.
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let master = self.master().await?;
        let reply = crate::reply::reply_of(&mut master.conn.clone(), cmd).await;
        self.after(&master, reply)
    }

    /// [`SentinelConnection::query`] of a command written for the store's own connection to
    /// the master (`direct.rs`), sent on it when the master has one (else on redis-rs's).
    pub(crate) async fn query_own(&self, cmd: &mut Packed) -> Result<Value, RedisError> {
        let master = self.master().await?;
        let reply = match &master.direct {
            Some(d) => d.query_beside(cmd.bytes(), &master.conn).await,
            None => crate::reply::reply_of(&mut master.conn.clone(), &cmd.to_cmd()).await,
        };
        self.after(&master, reply)
    }

    /// [`SentinelConnection::query_own`] of several commands, written together on the
    /// master's own connection when it has one (else sent one after another on redis-rs's).
    pub(crate) async fn query_own_many(&self, cmds: &mut [Packed]) -> crate::direct::Many {
        let master = self.master().await?;
        let replies = match &master.direct {
            Some(d) => {
                let joined = crate::command::joined(cmds);
                d.query_many_beside(&joined, cmds.len(), &master.conn).await
            }
            None => {
                let mut replies = Vec::with_capacity(cmds.len());
                for cmd in cmds.iter() {
                    replies.push(
                        crate::reply::reply_of(&mut master.conn.clone(), &cmd.to_cmd()).await,
                    );
                }
                Ok(replies)
            }
        };
        match replies {
            Ok(replies) => Ok(replies
                .into_iter()
                .map(|r| self.after(&master, r))
                .collect()),
            Err(e) => {
                if master_gone(&e) {
                    self.forget(master.lookup);
                }
                Err(e)
            }
        }
    }

    /// Forgets `master` when `reply` says it is gone.
    fn after(
        &self,
        master: &Master,
        reply: Result<Value, RedisError>,
    ) -> Result<Value, RedisError> {
        if let Err(e) = &reply {
            if master_gone(e) {
                self.forget(master.lookup);
            }
        }
        reply
    }

    /// The current master, looked up through the sentinels when there is none.
    async fn master(&self) -> Result<Master, RedisError> {
        if let Some(m) = self.current() {
            return Ok(m);
        }
        let inner = Arc::clone(&self.inner);
        match tokio::spawn(lookup(inner)).await {
            Ok(result) => result,
            Err(e) => Err(RedisError::from((
                ErrorKind::Io,
                "the sentinel lookup task failed",
                e.to_string(),
            ))),
        }
    }

    fn current(&self) -> Option<Master> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Drops the master found by lookup `lookup` (not a newer one another call found since).
    fn forget(&self, lookup: u64) {
        let mut current = self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|m| m.lookup == lookup) {
            *current = None;
        }
    }
}

/// One lookup at a time: a caller that waited for the lock finds the master its predecessor
/// connected.
async fn lookup(inner: Arc<Inner>) -> Result<Master, RedisError> {
    let mut sentinel = inner.sentinel.lock().await;
    if let Some(m) = inner
        .current
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    {
        return Ok(m);
    }
    let recently_failed = inner
        .failed_at
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_some_and(|t| t.elapsed() < RETRY_AFTER);
    if recently_failed {
        return Err(RedisError::from((
            ErrorKind::Io,
            "no master from the sentinels",
            format!("the last lookup failed less than {RETRY_AFTER:?} ago"),
        )));
    }
    let find = async {
        let client = sentinel
            .async_master_for(&inner.master_name, Some(&inner.node))
            .await?;
        // As for a standalone server: no retries inside the client, a dead master fails calls
        // at once (and this store then asks the sentinels again).
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(inner.response_timeout))
            .set_number_of_retries(0);
        let info = client.get_connection_info().clone();
        let addr = info.addr().to_string();
        ConnectionManager::new_with_config(client, config)
            .await
            .map(|c| (addr, info, c))
    };
    let found = match tokio::time::timeout(LOOKUP_TIMEOUT, find).await {
        Ok(found) => found,
        Err(_) => Err(RedisError::from((
            ErrorKind::Io,
            "no master from the sentinels",
            format!("the lookup took longer than {LOOKUP_TIMEOUT:?}"),
        ))),
    };
    *inner
        .failed_at
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = found.is_err().then(Instant::now);
    let (client_addr, info, conn) = found?;
    let direct = crate::direct::Direct::for_info(&info, format!("the master at {client_addr}"))
        .map(Arc::new);
    let mut current = inner.current.lock().unwrap_or_else(PoisonError::into_inner);
    let lookup = NEXT_LOOKUP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let master = Master {
        conn,
        direct,
        lookup,
        addr: client_addr,
    };
    *current = Some(master.clone());
    Ok(master)
}

/// Every [`WATCH_EVERY`] while the connection lives: when the sentinels name a master other
/// than the one in use, forget it (the next call looks the new one up). A sentinel that does
/// not answer in [`WATCH_TIMEOUT`] is skipped for the next; none answering changes nothing.
async fn watch(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The connection to the sentinel that answered last, kept between ticks.
    let mut asked: Option<(usize, redis::aio::MultiplexedConnection)> = None;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let Some(master) = inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            continue;
        };
        let named = named_master(&inner, &mut asked).await;
        if let Some(named) = named {
            if named != master.addr {
                tracing::info!(
                    old = %master.addr,
                    new = %named,
                    "the sentinels name another master; switching"
                );
                SentinelConnection { inner }.forget(master.lookup);
            }
        }
    }
}

/// The master's `host:port` as the first sentinel that answers names it.
async fn named_master(
    inner: &Inner,
    asked: &mut Option<(usize, redis::aio::MultiplexedConnection)>,
) -> Option<String> {
    let n = inner.sentinels.len();
    let first = asked.as_ref().map_or(0, |(i, _)| *i);
    for k in 0..n {
        let i = (first + k) % n;
        let conn = match asked.take() {
            Some((j, c)) if j == i => Some(c),
            _ => {
                let client = inner.sentinels.get(i)?;
                tokio::time::timeout(WATCH_TIMEOUT, client.get_multiplexed_async_connection())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
        };
        let Some(mut conn) = conn else { continue };
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&inner.master_name);
        let reply = tokio::time::timeout(
            WATCH_TIMEOUT,
            cmd.query_async::<Option<(String, u16)>>(&mut conn),
        )
        .await;
        if let Ok(Ok(Some((host, port)))) = reply {
            *asked = Some((i, conn));
            return Some(format!("{host}:{port}"));
        }
    }
    None
}

static NEXT_LOOKUP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Whether `e` means this server is no longer the master to talk to: it is unreachable, or
/// it became a replica.
fn master_gone(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}
