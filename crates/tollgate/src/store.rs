//! The store behind a limiter and its settings (the `[store]` section of a config).
//!
//! Chosen at run time: an enum of concrete stores, so the hot path is a match and a direct
//! call, not a boxed future behind a trait object.

pub use crate::breaker::BreakerConfig;
pub use tollgate_memory::{MemoryConfig, WhenFull};
#[cfg(feature = "redis")]
pub use tollgate_redis::StoreClock;

use crate::metrics::StoreErrorKind;
use std::time::Duration;
use tollgate_core::{Check, ClientKey, Micros, Verdict};
#[cfg(feature = "memory")]
use tollgate_memory::MemoryStore;
#[cfg(feature = "redis")]
pub use tollgate_redis::RedisConfig;
#[cfg(feature = "redis")]
use tollgate_redis::{RedisStore, RedisStoreError};

/// Which store a limiter uses.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The in-process store (no sharing between processes).
    #[cfg(feature = "memory")]
    Memory(tollgate_memory::MemoryConfig),
    /// Redis or Redis Cluster, shared by every gateway.
    #[cfg(feature = "redis")]
    Redis(RedisConfig),
}

#[cfg(feature = "memory")]
impl Default for Backend {
    fn default() -> Self {
        Backend::Memory(tollgate_memory::MemoryConfig::default())
    }
}

/// Whether the backend is a Redis Cluster (breakers are then kept per slot range).
pub(crate) fn is_cluster(backend: &Backend) -> bool {
    match backend {
        #[cfg(feature = "memory")]
        Backend::Memory(_) => false,
        #[cfg(feature = "redis")]
        Backend::Redis(cfg) => cfg.cluster,
    }
}

/// A lease call: give back, then take up to `want` if `need` is available. (Only a Redis
/// store reads it; the memory store does not lease.)
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct LeaseCall {
    pub(crate) want: u64,
    pub(crate) need: u64,
    pub(crate) give_back: u64,
    pub(crate) window: Micros,
}

/// One charge to settle at its real cost, a hold to release (`real: Some(_)`), or a hold to
/// renew (`real: None`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settle<'a> {
    pub(crate) client: ClientKey,
    pub(crate) rule: &'a tollgate_core::Rule,
    pub(crate) charge: tollgate_core::Charge,
    pub(crate) real: Option<u64>,
}

/// What a lease call got.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseGrant {
    pub(crate) granted: u64,
    pub(crate) remaining: u64,
    pub(crate) retry_after: Option<Micros>,
    pub(crate) window: Micros,
    pub(crate) window_end_after: Micros,
}

/// Why a store call failed, as counted in `tollgate_store_errors_total{kind}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreFailure {
    pub(crate) kind: StoreErrorKind,
    pub(crate) message: String,
}

/// The most characters of a failure's message a log line carries (a server's error text
/// names the script and its line; nothing a client sends is in it).
const MESSAGE_SHOWN: usize = 200;

impl std::fmt::Display for StoreFailure {
    /// `kind: message`, the message cut to [`MESSAGE_SHOWN`] characters.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = match self.message.char_indices().nth(MESSAGE_SHOWN) {
            Some((cut, _)) => &self.message[..cut],
            None => &self.message,
        };
        write!(f, "{}: {shown}", self.kind)
    }
}

pub(crate) enum Store {
    #[cfg(feature = "memory")]
    Memory(MemoryStore),
    /// Boxed: a connected store is much larger than the memory store's handle.
    #[cfg(feature = "redis")]
    Redis(Box<LazyRedis>),
}

impl Store {
    /// The store of `backend`; a coalesced Redis call is bounded by `timeout`, as each
    /// caller is.
    pub(crate) fn new(backend: Backend, timeout: Duration) -> Self {
        match backend {
            #[cfg(feature = "memory")]
            Backend::Memory(cfg) => {
                let _ = timeout;
                Store::Memory(MemoryStore::new(cfg))
            }
            #[cfg(feature = "redis")]
            Backend::Redis(cfg) => {
                Store::Redis(Box::new(LazyRedis::new(cfg.with_call_timeout(timeout))))
            }
        }
    }

    /// A remote store: calls can fail, so they get a timeout, a breaker and a deny cache.
    pub(crate) fn is_remote(&self) -> bool {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(_) => false,
            #[cfg(feature = "redis")]
            Store::Redis(_) => true,
        }
    }

    /// The in-process store, when this is one.
    pub(crate) fn memory(&self) -> Option<&MemoryStore> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(m) => Some(m),
            #[cfg(feature = "redis")]
            Store::Redis(_) => None,
        }
    }

    pub(crate) fn memory_keys(&self) -> usize {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(m) => m.len(),
            #[cfg(feature = "redis")]
            Store::Redis(_) => 0,
        }
    }

    /// Decides a plan in one store call (one per slot on a Redis Cluster).
    pub(crate) async fn check(
        &self,
        checks: &[Check<'_>],
        now: Micros,
        timeout: Duration,
    ) -> Result<Verdict, StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(m) => {
                let _ = timeout;
                Ok(m.check(checks, now))
            }
            #[cfg(feature = "redis")]
            // Boxed, as every Redis call here: its future is large, and a memory store's
            // check (and every caller's future around it) would carry and move its size.
            Store::Redis(r) => Box::pin(r.check(checks, now, timeout)).await,
        }
    }

    /// [`Store::check`] begun without a future of its own where the store allows it: a
    /// connected Redis store whose bound is `timeout`, for a plan it hands to a lane at once
    /// (`tollgate_redis::RedisStore::check_begin`). `None` for any other store or plan:
    /// [`Store::check`] decides it then.
    #[cfg(feature = "redis")]
    pub(crate) fn check_begin<'s>(
        &'s self,
        checks: &[Check<'_>],
        now: Micros,
        timeout: Duration,
    ) -> Option<tollgate_redis::PendingCheck<'s>> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(_) => None,
            Store::Redis(r) => {
                let store = r.store.get()?;
                (timeout == store.call_timeout())
                    .then(|| store.check_begin(checks, now))
                    .flatten()
            }
        }
    }

    /// [`Store::check`], with the store's instant of each check (what a later settle of its
    /// charge needs: see `tollgate_redis::RedisStore::check_timed`).
    pub(crate) async fn check_timed(
        &self,
        checks: &[Check<'_>],
        now: Micros,
        timeout: Duration,
    ) -> Result<(Verdict, Vec<Micros>), StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(m) => {
                let _ = timeout;
                Ok((m.check(checks, now), vec![now; checks.len()]))
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                Box::pin(within(timeout, async {
                    let store = r.get().await?;
                    store.check_timed(checks, now).await
                }))
                .await
            }
        }
    }

    /// Settles, releases or renews charges (see [`Settle`]): the units applied to each, and
    /// the store's instant each was applied at (a renewed hold is counted at it from then on).
    pub(crate) async fn settle(
        &self,
        items: &[Settle<'_>],
        now: Micros,
        timeout: Duration,
    ) -> Result<(Vec<u64>, Vec<Micros>), StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(m) => {
                let _ = timeout;
                let units = items
                    .iter()
                    .map(|it| m.settle(&it.client, it.rule, it.charge, it.real, now))
                    .collect();
                Ok((units, vec![now; items.len()]))
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                let redis_items: Vec<tollgate_redis::SettleItem<'_>> = items
                    .iter()
                    .map(|it| tollgate_redis::SettleItem {
                        client: it.client,
                        rule: it.rule,
                        units: it.charge.units,
                        at: it.charge.at,
                        real: it.real,
                    })
                    .collect();
                Box::pin(within(timeout, async {
                    let store = r.get().await?;
                    store.settle_timed(&redis_items, now).await
                }))
                .await
            }
        }
    }

    /// Gives back units of charges nothing recorded (`(client, rule, units)`, see
    /// [`tollgate_core::Limit::give_back`]): the units given back to each.
    pub(crate) async fn give_back(
        &self,
        items: &[(ClientKey, &tollgate_core::Rule, u64)],
        now: Micros,
        timeout: Duration,
    ) -> Result<Vec<u64>, StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(m) => {
                let _ = timeout;
                Ok(items
                    .iter()
                    .map(|(client, rule, units)| m.give_back(client, rule, *units, now))
                    .collect())
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                let redis_items: Vec<tollgate_redis::GiveBackItem<'_>> = items
                    .iter()
                    .map(|&(client, rule, units)| tollgate_redis::GiveBackItem {
                        client,
                        rule,
                        units,
                    })
                    .collect();
                Box::pin(within(timeout, async {
                    let store = r.get().await?;
                    store.give_back(&redis_items, now).await
                }))
                .await
            }
        }
    }

    /// Whether this store can lease units (a shared store: leasing a local one saves nothing).
    pub(crate) fn can_lease(&self) -> bool {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(_) => false,
            #[cfg(feature = "redis")]
            Store::Redis(_) => true,
        }
    }

    /// One lease call (see `tollgate_redis::RedisStore::lease`).
    pub(crate) async fn lease(
        &self,
        client: &ClientKey,
        rule: &tollgate_core::Rule,
        request: LeaseCall,
        now: Micros,
        timeout: Duration,
    ) -> Result<LeaseGrant, StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(_) => {
                let _ = (client, rule, request, now, timeout);
                Err(StoreFailure {
                    kind: StoreErrorKind::Other,
                    message: "the memory store does not lease".into(),
                })
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => Box::pin(r.lease(client, rule, request, now, timeout)).await,
        }
    }

    /// Forgets `client`'s state under `rule` (an operator's reset). Whether there was one.
    pub(crate) async fn reset(
        &self,
        client: &ClientKey,
        rule: &tollgate_core::Rule,
        timeout: Duration,
    ) -> Result<bool, StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(m) => {
                let _ = timeout;
                Ok(m.remove(client, rule))
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                Box::pin(within(timeout, async {
                    let store = r.get().await?;
                    store.reset(client, rule.name()).await
                }))
                .await
            }
        }
    }

    pub(crate) async fn ping(&self, timeout: Duration) -> Result<(), StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(_) => {
                let _ = timeout;
                Ok(())
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => Box::pin(r.ping(timeout)).await,
        }
    }

    /// Connects a remote store if it is not connected yet, and loads the scripts of the plans
    /// of one policy each (the policies known now).
    pub(crate) async fn connect(
        &self,
        within: Duration,
        limits: &[tollgate_core::Limit],
    ) -> Result<(), StoreFailure> {
        match self {
            #[cfg(feature = "memory")]
            Store::Memory(_) => {
                let _ = (within, limits);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                let shapes: Vec<Vec<tollgate_redis::RuleShape>> = limits
                    .iter()
                    .map(|&limit| {
                        vec![tollgate_redis::RuleShape {
                            limit,
                            mode: tollgate_core::Mode::Enforce,
                        }]
                    })
                    .collect();
                Box::pin(self::within(within, async {
                    r.get().await?.prepare(&shapes).await
                }))
                .await
            }
        }
    }
}

/// A Redis store connected on first use: a gateway starts (and fails over to its policies)
/// while Redis is down, and connects once it answers.
#[cfg(feature = "redis")]
pub(crate) struct LazyRedis {
    config: RedisConfig,
    store: tokio::sync::OnceCell<RedisStore>,
}

#[cfg(feature = "redis")]
impl LazyRedis {
    fn new(config: RedisConfig) -> Self {
        Self {
            config,
            store: tokio::sync::OnceCell::new(),
        }
    }

    async fn get(&self) -> Result<&RedisStore, RedisStoreError> {
        if let Some(store) = self.store.get() {
            return Ok(store);
        }
        // Boxed: connecting is a large future that only the first calls need, and every
        // call's future would otherwise carry its size (and move it, several times a request).
        Box::pin(
            self.store
                .get_or_try_init(|| RedisStore::connect(self.config.clone())),
        )
        .await
    }

    async fn check(
        &self,
        checks: &[Check<'_>],
        now: Micros,
        timeout: Duration,
    ) -> Result<Verdict, StoreFailure> {
        // Connected, and the bound is the store's own: the store keeps it, with no timer of
        // its own where its lanes bound the call (`RedisStore::check_bounded`).
        if let Some(store) = self.store.get() {
            if timeout == store.call_timeout() {
                return store
                    .check_bounded(checks, now)
                    .await
                    .map_err(|e| failure(&e));
            }
        }
        // Boxed: not connected yet, or a bound of the caller's own; a rare path every call
        // would otherwise carry and move (this check's future: 1,608 bytes with it inline,
        // 672 boxed, in a debug build).
        Box::pin(within(timeout, async {
            let store = self.get().await?;
            store.check(checks, now).await
        }))
        .await
    }

    async fn lease(
        &self,
        client: &ClientKey,
        rule: &tollgate_core::Rule,
        request: LeaseCall,
        now: Micros,
        timeout: Duration,
    ) -> Result<LeaseGrant, StoreFailure> {
        let l = within(timeout, async {
            let store = self.get().await?;
            let req = tollgate_redis::LeaseRequest {
                want: request.want,
                need: request.need,
                give_back: request.give_back,
                give_back_window: request.window,
            };
            store.lease(client, rule, req, now).await
        })
        .await?;
        Ok(LeaseGrant {
            granted: l.granted,
            remaining: l.remaining,
            retry_after: l.retry_after,
            window: l.window,
            window_end_after: l.window_end_after,
        })
    }

    async fn ping(&self, timeout: Duration) -> Result<(), StoreFailure> {
        within(timeout, async {
            let store = self.get().await?;
            store.ping().await
        })
        .await
    }
}

/// Runs a Redis call under `timeout`: its error, or a `timeout` failure.
#[cfg(feature = "redis")]
async fn within<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, RedisStoreError>>,
) -> Result<T, StoreFailure> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(|e| failure(&e)),
        Err(_) => Err(StoreFailure {
            kind: StoreErrorKind::Timeout,
            message: format!("no answer within {timeout:?}"),
        }),
    }
}

#[cfg(feature = "redis")]
pub(crate) fn failure(e: &RedisStoreError) -> StoreFailure {
    use tollgate_redis::ErrorKind as K;
    let kind = match e.kind() {
        K::Connection => StoreErrorKind::Connection,
        K::Timeout => StoreErrorKind::Timeout,
        K::Cluster => StoreErrorKind::Cluster,
        K::Script => StoreErrorKind::Script,
        K::Protocol => StoreErrorKind::Protocol,
        K::Auth => StoreErrorKind::Auth,
        K::Oom => StoreErrorKind::Oom,
        K::Busy | K::Config | K::Invalid => StoreErrorKind::Other,
    };
    StoreFailure {
        kind,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_shows_its_kind_and_at_most_200_characters_of_its_message() {
        let short = StoreFailure {
            kind: StoreErrorKind::Oom,
            message: "command not allowed".into(),
        };
        assert_eq!(short.to_string(), "oom: command not allowed");
        // Cut at a character, not a byte: 300 two-byte characters.
        let long = StoreFailure {
            kind: StoreErrorKind::Script,
            message: "é".repeat(300),
        };
        assert_eq!(
            long.to_string(),
            format!("script: {}", "é".repeat(MESSAGE_SHOWN))
        );
    }
}
