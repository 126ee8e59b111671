//! The tollgate [`Limiter`]: what a service or gateway holds. It puts a store behind the
//! resilience a shared store needs, in this order for each request:
//!
//! 1. the **deny cache** answers for clients already denied until their retry time (exact:
//!    denials consume nothing), so abusive traffic never reaches the store;
//! 2. the **circuit breaker** skips a store that keeps failing, so no request waits on it;
//! 3. leased policies are answered from **local leases** (a store call only when a lease runs
//!    out);
//! 4. the **store call**: the rest of the request's [`Plan`] (every policy that matched, under
//!    every identity, enforced and shadow) in ONE atomic call (one per slot on a Redis
//!    Cluster), under a **timeout**;
//! 5. when the store fails, each policy's **failure policy**: allow (`open`), reject with 503
//!    (`closed`), or decide with an in-process **local fallback** at `limit / local_divisor`.
//!
//! Every step is counted, rendered for Prometheus by [`Limiter::render_metrics`] and read by
//! programs through [`Limiter::metrics`] (a [`metrics::Snapshot`]).
//!
//! Every time the limiter takes or gives is a [`std::time::Duration`]; the algorithms and
//! stores below count microseconds, and the conversion happens here, once. The root holds
//! what every user names; the rest is grouped by what it configures or reads: [`quota`]
//! (algorithms and quotas), [`clock`], [`store`] (backend settings), [`policy`] (a policy's
//! options), [`operator`] (state reads and resets), [`metrics`] (the read side) and
//! [`headers`] (the `RateLimit` header values).
//!
//! ```
//! use std::time::Duration;
//! use tollgate::quota::{Algorithm, Limit, Quota};
//! use tollgate::{Action, ClientKey, Limiter, LimiterConfig, Outcome, Plan, PolicySpec};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(LimiterConfig::default());
//! let api = limiter.policy(PolicySpec::new(
//!     "api",
//!     Limit::new(Algorithm::Gcra, Quota::per_minute(2)?)?,
//! ))?;
//! let plan = Plan::for_client(ClientKey([7; 16]), [&api]);
//! assert!(limiter.check(&plan).await.is_allowed());
//! assert!(limiter.check(&plan).await.is_allowed());
//! let third = limiter.check(&plan).await;
//! // Denied until the next unit of the quota: at most half a minute away.
//! let Action::Limit { retry_after: Some(wait) } = third.action else {
//!     panic!("the third request of a 2/min quota passed: {third:?}");
//! };
//! assert!(wait > Duration::ZERO && wait <= Duration::from_secs(30));
//! let limited = limiter.metrics().policy("api").map(|p| p.decisions(Outcome::Limited));
//! assert_eq!(limited, Some(1));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

#[cfg(not(any(feature = "memory", feature = "redis")))]
compile_error!("tollgate needs a backend: enable the `memory` or the `redis` feature");

mod breaker;
mod deny_cache;
mod give_back;
pub mod headers;
mod identity;
mod last_answer;
mod lease;
mod leased;
pub mod metrics;
pub mod operator;
mod outcome;
pub mod places;
mod plan;
pub mod policy;
mod reserve;
mod result;
pub mod store;
mod top_limited;
pub mod trace;

pub use identity::IdentityHasher;
pub use outcome::Outcome;
pub use plan::Plan;
pub use policy::{Policy, PolicyField, PolicySpec};
pub use reserve::Reservation;
pub use result::{Action, Decision, LimitResult, PolicyResult};
pub use store::Backend;
pub use tollgate_core::ClientKey;

/// Algorithms and quotas: what a policy enforces ([`PolicySpec::limit`]).
pub mod quota {
    /// Durations as configs write them (`"5m"`, `"2s"`): the one parser every config shares.
    pub use tollgate_core::duration::{parse_duration, DURATION_HELP};
    pub use tollgate_core::{
        Algorithm, Limit, LimitError, Quota, QuotaError, RateError, RateField, UnknownAlgorithm,
        MAX_BURST_SPAN, MAX_LIMIT, MAX_PERIOD,
    };
}

/// Where the limiter's `now` comes from ([`LimiterConfig::clock`]). Wall time in whole
/// microseconds since the Unix epoch, the instant the stores and their scripts share; tests
/// drive a [`ManualClock`](clock::ManualClock) and never sleep.
pub mod clock {
    pub use tollgate_core::{Clock, ManualClock, SystemClock};
}

use breaker::{Breakers, Permit, Round};
use clock::{Clock, SystemClock};
use deny_cache::DenyCache;
use last_answer::{Known, LastAnswers};
use lease::Leases;
use metrics::{Metrics, StoreErrorKind};
use policy::FailurePolicy;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{BreakerConfig, Store, StoreFailure};
use tollgate_core::{duration_to_micros, micros_to_duration, Check, Micros, Mode, Verdict};
use tollgate_memory::MemoryStore;

/// A plan's items or checks, on the stack up to four (a request matched by more policies
/// spills to the heap).
type Few<T> = smallvec::SmallVec<[T; 4]>;

/// The store checks of a plan's items, in their order.
fn checks_of<'p>(items: &[(&ClientKey, &'p Policy)]) -> Few<Check<'p>> {
    items
        .iter()
        .map(|(client, p)| Check {
            client: **client,
            rule: p.rule(),
            cost: p.cost(),
            mode: p.mode(),
        })
        .collect()
}

/// A plan's store call begun by `Limiter::begin_call`: what its answer is applied to.
#[cfg(feature = "redis")]
struct StoreCall<'a> {
    items: Few<(&'a ClientKey, &'a Policy)>,
    checks: Few<Check<'a>>,
    breaker: &'a breaker::Breaker,
    /// The breaker's round as the call began (see `breaker.rs`).
    round: Round,
    traced: Option<Instant>,
    pending: tollgate_redis::PendingCheck<'a>,
}

/// Errors building a limiter or a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A policy specification is invalid: `field` says which of its settings, so a caller
    /// that read it from a file can point at where it was written.
    #[error("policy {policy:?}: {field}: {reason}")]
    InvalidPolicy {
        /// The policy's name.
        policy: String,
        /// The setting that is wrong.
        field: PolicyField,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

/// How to build a [`Limiter`].
#[derive(Clone)]
pub struct LimiterConfig {
    /// The store.
    pub backend: Backend,
    /// Timeout of each store call (`store.timeout`).
    pub timeout: Duration,
    /// Circuit breaker settings (`store.breaker`).
    pub breaker: BreakerConfig,
    /// Entries the deny cache holds at most (0 disables it). Asked on the request path with
    /// remote stores only; with the memory store it serves [`Limiter::denied_locally`].
    pub deny_cache_capacity: usize,
    /// Keys the local fallback store tracks at most.
    pub fallback_max_keys: usize,
    /// Where `now` comes from.
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for LimiterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterConfig")
            .field("backend", &self.backend)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("deny_cache_capacity", &self.deny_cache_capacity)
            .field("fallback_max_keys", &self.fallback_max_keys)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "memory")]
impl Default for LimiterConfig {
    fn default() -> Self {
        Self::new(Backend::default())
    }
}

impl LimiterConfig {
    /// Defaults around `backend`: 20 ms timeout, breaker 5 failures / 1 s, 100,000 deny cache
    /// entries, 100,000 fallback keys, the system clock.
    pub fn new(backend: Backend) -> Self {
        Self {
            backend,
            timeout: Duration::from_millis(20),
            breaker: BreakerConfig::default(),
            deny_cache_capacity: 100_000,
            fallback_max_keys: 100_000,
            clock: Arc::new(SystemClock),
        }
    }
}

struct Inner {
    store: Store,
    fallback: MemoryStore,
    clock: Arc<dyn Clock>,
    timeout: Duration,
    breakers: Breakers,
    deny_cache: Option<DenyCache>,
    /// The store's last answers for the other rules of plans the deny cache answers.
    last: Option<LastAnswers>,
    leases: Option<Leases>,
    /// The leased policies by rule id, for giving back expired units. Weak: a policy a reload
    /// dropped (an override, say) takes its metric series with it.
    lease_policies: std::sync::Mutex<leased::LeasePolicies>,
    /// The limits of the policies made so far, for `connect` to load their scripts.
    /// (A set beside the list: a program that makes policies at run time, an RLS limit
    /// override per request, must not pay a scan of the list for each.)
    limits: std::sync::Mutex<(Vec<tollgate_core::Limit>, HashSet<tollgate_core::Limit>)>,
    sweeper: std::sync::OnceLock<()>,
    /// Settles waiting for the store, and the live holds being renewed.
    reservations: reserve::Reservations,
    metrics: Metrics,
}

/// A rate limiter over a store. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("remote", &self.inner.store.is_remote())
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// Counts the leased admissions of a plan (`leased`: the results of its leased rules) now
/// that the whole plan is decided: `allowed` when the request passed, else `not_charged` (the
/// units went back), which the result then says too. Their denials were counted as decided.
fn count_leased(leased: &mut [PolicyResult], passed: bool) {
    for r in leased.iter_mut().filter(|r| r.outcome == Outcome::Allowed) {
        if !passed {
            r.outcome = Outcome::NotCharged;
        }
        r.policy.inner.stats.record(r.outcome);
    }
}

impl Limiter {
    /// Builds a limiter. A remote store is connected on first use, so this succeeds while
    /// Redis is down (requests then follow their failure policies).
    pub fn new(config: LimiterConfig) -> Self {
        let cluster = store::is_cluster(&config.backend);
        let store = Store::new(config.backend, config.timeout);
        let can_lease = store.can_lease();
        // A shared store's denials are answered here until their retry time, keeping abusive
        // traffic off the store. The in-process store answers as fast as the cache would, so
        // its denials are remembered only for `denied_locally` (a caller skipping costly
        // work, such as a forged token's signature check), never asked on the request path.
        let deny_cache =
            (config.deny_cache_capacity > 0).then(|| DenyCache::new(config.deny_cache_capacity));
        let remote = store.is_remote();
        Self {
            inner: Arc::new(Inner {
                store,
                fallback: MemoryStore::new(tollgate_memory::MemoryConfig {
                    max_keys: config.fallback_max_keys,
                    ..Default::default()
                }),
                clock: config.clock,
                timeout: config.timeout,
                breakers: Breakers::new(config.breaker, cluster),
                leases: can_lease.then(|| Leases::new(config.deny_cache_capacity.max(1024))),
                last: (remote && deny_cache.is_some())
                    .then(|| LastAnswers::new(config.deny_cache_capacity)),
                deny_cache,
                lease_policies: std::sync::Mutex::new(leased::LeasePolicies::default()),
                limits: std::sync::Mutex::new((Vec::new(), HashSet::new())),
                sweeper: std::sync::OnceLock::new(),
                reservations: Default::default(),
                metrics: Metrics::default(),
            }),
        }
    }

    /// Registers a policy (and its metrics) with this limiter. Fails only where
    /// [`PolicySpec::validate`] does.
    pub fn policy(&self, spec: PolicySpec) -> Result<Policy, Error> {
        spec.validate()?;
        let stats = self.inner.metrics.policy(&spec.name);
        stats.set_quota(spec.limit.quota());
        let spec_limit = spec.limit;
        let policy = Policy::build(spec, stats)?;
        if self.leases(&policy) {
            self.register_lease_policy(&policy);
        }
        let mut limits = self
            .inner
            .limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded like the store's own cache of policy shapes: past it, policies still work
        // and load their script on first use.
        let (list, seen) = &mut *limits;
        if list.len() < 1024 && seen.insert(spec_limit) {
            list.push(spec_limit);
        }
        drop(limits);
        Ok(policy)
    }

    /// The limiter's counters as they are now: what `/metrics` renders, as values to compute
    /// with (rates from two snapshots, latency quantiles from their histograms).
    pub fn metrics(&self) -> metrics::Snapshot {
        self.inner
            .metrics
            .snapshot(self.breaker_open(), self.memory_keys())
    }

    /// The limiter's clock ([`LimiterConfig::clock`]) now: the time since the Unix epoch that
    /// its decisions are made at (with the `store` clock, Redis reads its own in the script).
    /// For what a front end reports beside a decision, such as when an epoch-aligned window
    /// ends, so that a test's manual clock drives it too.
    pub fn now(&self) -> Duration {
        micros_to_duration(self.inner.clock.now())
    }

    /// The `k` most limited (client, policy) pairs of the last five minutes on this limiter's
    /// clock (the current minute and the four before it), most limited first, and how many
    /// limited requests that window saw in all. Bounded memory (a space-saving summary): a
    /// count is never below the true one and at most its `error` above. Clients appear as
    /// their keyed hash only.
    pub fn top_limited(&self, k: usize) -> metrics::MostLimited {
        self.inner.metrics.top_limited(k, self.inner.clock.now())
    }

    /// Appends every `tollgate_*` metric family in the Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        self.inner
            .metrics
            .render(out, self.breaker_open(), self.memory_keys());
    }

    /// Whether a circuit breaker is open (`tollgate_breaker_open`).
    pub fn breaker_open(&self) -> bool {
        self.inner.breakers.any_open()
    }

    /// Keys tracked in process, by the memory store and the local fallback
    /// (`tollgate_memory_keys`).
    pub fn memory_keys(&self) -> usize {
        self.inner.store.memory_keys() + self.inner.fallback.len()
    }

    /// Connects the store (and loads the scripts of the policies made so far) now rather than
    /// inside the first requests' timeouts, waiting at most `within`. Returns whether it is
    /// connected; when it is not, requests follow their failure policies and the store is
    /// connected on a later call.
    /// Call it once at startup: a connection and a script load do not fit in a 20 ms request
    /// timeout on a loaded machine, and a cold start must not trip the breaker.
    pub async fn connect(&self, within: Duration) -> bool {
        let limits = self
            .inner
            .limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone();
        match self.inner.store.connect(within, &limits).await {
            Ok(()) => true,
            Err(StoreFailure { kind, message }) => {
                tracing::warn!(target: "tollgate::store", kind = kind.as_str(), %message, "store not reachable at startup");
                false
            }
        }
    }

    /// Whether the store answers now and no breaker is open.
    pub async fn ready(&self) -> bool {
        let i = &self.inner;
        if !i.store.is_remote() {
            return true;
        }
        !i.breakers.any_open() && i.store.ping(i.timeout).await.is_ok()
    }

    /// Gives back every unused lease unit to the shared store and sends the settles and
    /// releases still queued (call before the process exits; a limiter that is killed
    /// instead loses at most the leases it held, and its holds expire after `hold_ttl`).
    pub async fn shutdown(&self) {
        self.return_leases(true).await;
        // Settles and releases of the requests that ended before the exit reach the store
        // (a hold not released would otherwise wait out its hold_ttl).
        self.flush_settles().await;
    }

    /// Decides one request's plan: every enforced policy under every identity together,
    /// all-or-nothing, in one store call; shadow policies in the same call, never rejecting;
    /// leased policies from local leases first. Never fails: store failures become each
    /// policy's failure outcome.
    pub async fn check(&self, plan: &Plan) -> LimitResult {
        if let Some(result) = self.check_now(plan) {
            return result;
        }
        let (now, denied) = self.deny_first(plan);
        if let Some(result) = denied {
            return result;
        }
        // Boxed where it is not the common remote call (below): leases, a breaker not
        // closed, a store not connected yet, a plan the store does not hand to a lane at
        // once. Their futures are large, and every request's future would otherwise carry
        // their size (and move it, several times a request).
        #[cfg(not(feature = "redis"))]
        return self.check_slow(plan, now).await;
        // The common remote call: one small future, its answer applied here. (Kept in one
        // place across the await: bound by value out of an `Option`, the call took that
        // room twice in this future.)
        #[cfg(feature = "redis")]
        match &mut self.begin_call(plan, now) {
            Some(call) => {
                let reply = (&mut call.pending).await;
                self.end_call(call, reply, now)
            }
            None => self.check_slow(plan, now).await,
        }
    }

    /// [`Limiter::check`] answered at once where it waits for nothing: on the in-process
    /// store (which leases nothing: every plan of a limiter on the embedded store), the same
    /// decision, outcomes and metrics, with no future to build, box and poll. `None` where
    /// the decision needs a store call that waits: then call [`Limiter::check`].
    pub fn check_now(&self, plan: &Plan) -> Option<LimitResult> {
        let store = self.inner.store.memory()?;
        // The in-process store leases nothing (`Store::can_lease`): every item is exact.
        debug_assert!(self.inner.leases.is_none());
        let items: Few<(&ClientKey, &Policy)> = plan.iter().collect();
        let mut results = Vec::with_capacity(items.len());
        let action = self.decide_in_process(store, &items, self.inner.clock.now(), &mut results);
        Some(LimitResult { action, results })
    }

    /// [`Limiter::check`] past the deny cache, boxed (see there).
    fn check_slow<'a>(
        &'a self,
        plan: &'a Plan,
        now: Micros,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = LimitResult> + Send + 'a>> {
        Box::pin(async move { self.check_store(plan, now, false).await.0 })
    }

    /// [`Limiter::check`], with the store's instant of each plan item's decision (for
    /// [`Limiter::reserve`]; `now` where the store gives none).
    /// Each result's client and instant, in the order of the results.
    pub(crate) async fn check_timed(&self, plan: &Plan) -> (LimitResult, Vec<(ClientKey, Micros)>) {
        let (now, denied) = self.deny_first(plan);
        if let Some(result) = denied {
            // A denial holds nothing: no instants needed.
            return (result, Vec::new());
        }
        self.check_store(plan, now, true).await
    }

    /// The clock's now, and what the deny cache answers for `plan` at it (a remote store's
    /// only: the in-process store answers as exactly, at once).
    fn deny_first(&self, plan: &Plan) -> (Micros, Option<LimitResult>) {
        let now = self.inner.clock.now();
        let denied = if self.inner.store.is_remote() {
            self.deny_cached(plan, now)
        } else {
            None
        };
        (now, denied)
    }

    /// [`Limiter::check`] and [`Limiter::check_timed`] past the deny cache: leases first, then
    /// one store call.
    async fn check_store(
        &self,
        plan: &Plan,
        now: Micros,
        timed: bool,
    ) -> (LimitResult, Vec<(ClientKey, Micros)>) {
        // A denial holds nothing: no instants needed.
        let untimed = |r: LimitResult| (r, Vec::new());
        let mut results = Vec::with_capacity(plan.len());
        let mut taken = Vec::new();
        // On the stack for a plan of a few policies (most are of one).
        let (leased, exact): (Few<_>, Few<_>) = plan
            .iter()
            .partition(|(_, p)| p.mode() == Mode::Enforce && self.leases(p));
        if !leased.is_empty() {
            let action = self
                .decide_leased(&leased, now, &mut results, &mut taken)
                .await;
            if action != Action::Allow {
                self.settle(&taken, false);
                for (_, p) in &exact {
                    p.inner.stats.record(Outcome::NotCharged);
                }
                count_leased(&mut results, false);
                return untimed(LimitResult { action, results });
            }
        }
        let n_leased = results.len();
        let (action, exact_at) = self.decide(&exact, now, &mut results, timed).await;
        // All-or-nothing: lease units taken by a rejected request go back to the lease.
        self.settle(&taken, action == Action::Allow);
        if let Some(leased) = results.get_mut(..n_leased) {
            count_leased(leased, action == Action::Allow);
        }
        if !timed {
            // `check` (every request's path) needs no instants: nothing is allocated for them.
            return untimed(LimitResult { action, results });
        }
        // Each result's client and instant, in the results' order (the leased items first,
        // never settled; then the rest, at the store's instants when it gave them).
        let mut exact_at = exact_at.into_iter();
        let at: Vec<(ClientKey, Micros)> = leased
            .iter()
            .map(|(c, _)| (**c, now))
            .chain(
                exact
                    .iter()
                    .map(|(c, _)| (**c, exact_at.next().unwrap_or(now))),
            )
            .collect();
        (LimitResult { action, results }, at)
    }

    /// The answer [`Limiter::check`] would give `plan` from the deny cache alone, without a
    /// store call: `Some` (a denial, exact) when a policy of the plan is still denied to its
    /// client, else `None`. For a caller that can skip costly work (a token's signature
    /// check) for a request that these policies deny whatever that work would find.
    pub fn denied_locally(&self, plan: &Plan) -> Option<LimitResult> {
        self.deny_cached(plan, self.inner.clock.now())
    }

    /// The deny cache's answer: a 429 when an enforced policy of the plan denied its client
    /// until later than now, or when every quota-mode policy of the plan did (exact: denials
    /// consume nothing). Every other policy of the plan reports the store's last answer for
    /// it; when one has none, the store answers instead.
    fn deny_cached(&self, plan: &Plan, now: Micros) -> Option<LimitResult> {
        let cache = self.inner.deny_cache.as_ref()?;
        // Filled from the first denial on (nothing allocated for a plan with none: the
        // common case, checked on every request).
        let mut until: Vec<Option<Micros>> = Vec::new();
        let (mut enforced, mut quota, mut quota_denied) = (false, 0usize, 0usize);
        for (i, (client, p)) in plan.iter().enumerate() {
            let u = match p.mode() {
                Mode::Shadow => None,
                mode => {
                    let u = cache.denied_until(client, p.inner.deny_key, now, p.cost());
                    match mode {
                        Mode::Quota => {
                            quota += 1;
                            quota_denied += usize::from(u.is_some());
                        }
                        _ => enforced |= u.is_some(),
                    }
                    u
                }
            };
            if until.is_empty() && u.is_some() {
                until.reserve(plan.len());
                until.resize(i, None);
            }
            if !until.is_empty() || u.is_some() {
                until.push(u);
            }
        }
        if until.is_empty() {
            return None;
        }
        let quota_blocks = quota > 0 && quota_denied == quota;
        if !enforced && !quota_blocks {
            return None;
        }
        // The plan is denied. Which denials decide the wait: the enforced ones, and the
        // earliest quota one when the quota policies deny together.
        let mut wait = 0;
        let mut earliest_quota: Option<Micros> = None;
        for ((_, p), u) in plan.iter().zip(&until) {
            if let Some(u) = *u {
                match p.mode() {
                    Mode::Quota => {
                        earliest_quota = Some(earliest_quota.map_or(u, |e: Micros| e.min(u)))
                    }
                    _ => wait = wait.max(u - now),
                }
            }
        }
        if quota_blocks {
            wait = wait.max(earliest_quota.map_or(0, |u| u - now));
        }
        // The others: what the store last said of them, or no local answer at all.
        let mut others = Vec::new();
        for ((client, p), u) in plan.iter().zip(&until) {
            if u.is_none() {
                let known = self
                    .inner
                    .last
                    .as_ref()?
                    .known(client, p.inner.deny_key, now)?;
                others.push(known);
            }
        }
        let mut others = others.into_iter();
        let mut results = Vec::with_capacity(plan.len());
        for ((client, p), u) in plan.iter().zip(&until) {
            let limit = p.limit().quota().limit();
            let (outcome, decision) = match *u {
                Some(until) => {
                    p.inner.stats.deny_cache_hit();
                    let retry = micros_to_duration(until - now);
                    let d = Decision {
                        allowed: false,
                        limit,
                        remaining: 0,
                        reset_after: retry,
                        retry_after: Some(retry),
                    };
                    (Outcome::Limited, d)
                }
                None => {
                    let Some(k) = others.next() else { continue };
                    let d = Decision {
                        allowed: k.allowed,
                        limit,
                        remaining: k.remaining,
                        reset_after: micros_to_duration(k.reset_at.saturating_sub(now)),
                        retry_after: None,
                    };
                    // Not even asked: the plan is denied, so it is charged nothing.
                    let outcome = if k.allowed {
                        Outcome::NotCharged
                    } else {
                        Outcome::ShadowLimited
                    };
                    (outcome, d)
                }
            };
            p.inner.stats.record(outcome);
            p.inner.stats.record_limited(client, outcome, now);
            results.push(PolicyResult {
                policy: p.clone(),
                outcome,
                decision: Some(decision),
            });
        }
        Some(LimitResult {
            action: Action::limit_micros(Some(wait)),
            results,
        })
    }

    /// Decides the plan's store-bound items (enforced and shadow) in one store call and
    /// appends their results.
    async fn decide(
        &self,
        items: &[(&ClientKey, &Policy)],
        now: Micros,
        results: &mut Vec<PolicyResult>,
        timed: bool,
    ) -> (Action, Vec<Micros>) {
        let Some((first, _)) = items.first() else {
            return (Action::Allow, Vec::new());
        };
        let checks = checks_of(items);
        match self.call_store(first, &checks, now, timed).await {
            Ok((verdict, at)) => (
                self.apply_outcome(items, &checks, Ok(verdict), now, results),
                at,
            ),
            Err(skip_for) => (
                self.apply_outcome(items, &checks, Err(skip_for), now, results),
                Vec::new(),
            ),
        }
    }

    /// A store call's answer applied to its items: the verdict's, or (on failure, with how
    /// long until the store may be tried again) each policy's failure outcome.
    fn apply_outcome(
        &self,
        items: &[(&ClientKey, &Policy)],
        checks: &[Check<'_>],
        answer: Result<Verdict, Micros>,
        now: Micros,
        results: &mut Vec<PolicyResult>,
    ) -> Action {
        match answer {
            Ok(verdict) => self.apply_verdict(items, checks, verdict, now, results),
            Err(skip_for) => self.apply_failure(items, now, skip_for, results),
        }
    }

    /// [`Limiter::check`]'s common remote call begun: a plan of no leased policy, its
    /// breaker closed, that the store hands to a lane at once (`Store::check_begin`). `None`
    /// for any other: [`Limiter::check_store`] decides it.
    #[cfg(feature = "redis")]
    fn begin_call<'a>(&'a self, plan: &'a Plan, now: Micros) -> Option<StoreCall<'a>> {
        let i = &self.inner;
        if plan
            .iter()
            .any(|(_, p)| p.mode() == Mode::Enforce && self.leases(p))
        {
            return None;
        }
        let items: Few<(&ClientKey, &Policy)> = plan.iter().collect();
        let (first, _) = items.first()?;
        let breaker = i.breakers.for_client(first);
        // Closed, where `Breaker::acquire` permits the call and changes nothing; an open or
        // half-open breaker (a probe to take) is the general path's.
        if breaker.is_open() {
            return None;
        }
        let checks = checks_of(&items);
        let traced = trace::store_call_started();
        let round = breaker.round();
        let pending = i.store.check_begin(&checks, now, i.timeout)?;
        Some(StoreCall {
            items,
            checks,
            breaker,
            round,
            traced,
            pending,
        })
    }

    /// A call of [`Limiter::begin_call`] answered: the answer timed, counted by the breaker
    /// and applied, as [`Limiter::check_store`] does with a call it makes.
    #[cfg(feature = "redis")]
    fn end_call(
        &self,
        call: &StoreCall<'_>,
        reply: Result<tollgate_redis::CheckReply, tollgate_redis::RedisStoreError>,
        now: Micros,
    ) -> LimitResult {
        let answer = reply
            .and_then(|r| r.verdict(&call.checks))
            .map_err(|e| store::failure(&e));
        // Timed from the store's own reading of the clock as it took the plan.
        let started = call.pending.begun();
        let answer = self.guard_end(call.breaker, Permit::Call, call.round, started, answer);
        trace::record_store_call(call.traced, call.checks.len());
        let mut results = Vec::with_capacity(call.items.len());
        let action = self.apply_outcome(&call.items, &call.checks, answer, now, &mut results);
        LimitResult { action, results }
    }

    /// [`Limiter::decide`] on the in-process store, which answers at once (an untimed
    /// call: the same store call, traced the same way).
    fn decide_in_process(
        &self,
        store: &MemoryStore,
        items: &[(&ClientKey, &Policy)],
        now: Micros,
        results: &mut Vec<PolicyResult>,
    ) -> Action {
        if items.is_empty() {
            return Action::Allow;
        }
        let checks = checks_of(items);
        let started = trace::store_call_started();
        let verdict = store.check(&checks, now);
        trace::record_store_call(started, checks.len());
        self.apply_verdict(items, &checks, verdict, now, results)
    }

    /// One store call behind the breaker and the timeout. On failure, returns how long until
    /// the store may be tried again.
    /// The breaker consulted is the first client's (per slot range on a Cluster).
    async fn call_store(
        &self,
        client: &ClientKey,
        checks: &[Check<'_>],
        now: Micros,
        timed: bool,
    ) -> Result<(Verdict, Vec<Micros>), Micros> {
        let i = &self.inner;
        let started = trace::store_call_started();
        let call = async {
            if timed {
                i.store.check_timed(checks, now, i.timeout).await
            } else {
                i.store
                    .check(checks, now, i.timeout)
                    .await
                    .map(|v| (v, Vec::new()))
            }
        };
        let result = if i.store.is_remote() {
            self.guarded(client, now, call).await
        } else {
            call.await.map_err(|_| 0)
        };
        trace::record_store_call(started, checks.len());
        result
    }

    /// Runs a remote store call behind the client's breaker, timing it and counting its
    /// failures. On failure, returns how long until the store may be tried again.
    pub(crate) async fn guarded<T>(
        &self,
        client: &ClientKey,
        now: Micros,
        call: impl std::future::Future<Output = Result<T, StoreFailure>>,
    ) -> Result<T, Micros> {
        let i = &self.inner;
        let breaker = i.breakers.for_client(client);
        let permit = breaker.acquire(now);
        if let Permit::Skip(wait) = permit {
            i.metrics.store_error(StoreErrorKind::BreakerOpen);
            return Err(wait);
        }
        let (round, started) = (breaker.round(), Instant::now());
        let result = call.await;
        self.guard_end(breaker, permit, round, started, result)
    }

    /// A guarded call's end (see [`Limiter::guarded`]): its time observed, its breaker told.
    fn guard_end<T>(
        &self,
        breaker: &breaker::Breaker,
        permit: Permit,
        round: Round,
        started: Instant,
        result: Result<T, StoreFailure>,
    ) -> Result<T, Micros> {
        let i = &self.inner;
        i.metrics.observe_store(started.elapsed());
        match result {
            Ok(v) => {
                breaker.on_success(permit);
                Ok(v)
            }
            Err(failure) => {
                i.metrics.store_error(failure.kind);
                tracing::debug!(target: "tollgate::store", kind = failure.kind.as_str(), message = %failure.message, "store call failed");
                breaker.on_failure(permit, round, i.clock.now(), &failure);
                Err(duration_to_micros(i.timeout).max(1))
            }
        }
    }

    fn apply_verdict(
        &self,
        items: &[(&ClientKey, &Policy)],
        checks: &[Check<'_>],
        verdict: Verdict,
        now: Micros,
        results: &mut Vec<PolicyResult>,
    ) -> Action {
        let action = if verdict.allowed {
            Action::Allow
        } else {
            Action::limit_micros(verdict.retry_after(checks))
        };
        // The store's answers for the deny cache's later local answers of plans of several
        // policies: remembered when such a plan was denied, refreshed by every store answer
        // while held (one relaxed load when nothing is held).
        let last = self
            .inner
            .last
            .as_ref()
            .filter(|l| (items.len() > 1 && !verdict.allowed) || !l.is_empty());
        for ((client, p), d) in items.iter().zip(verdict.decisions) {
            if let Some(last) = last {
                let known = Known {
                    allowed: d.allowed,
                    remaining: d.remaining,
                    reset_at: now.saturating_add(d.reset_after),
                };
                if verdict.allowed || items.len() == 1 {
                    last.refresh(client, p.inner.deny_key, known);
                } else if d.allowed || p.is_shadow() {
                    // (The others are in the deny cache.)
                    last.remember(client, p.inner.deny_key, known, now);
                }
            }
            let outcome = match (d.allowed, p.mode()) {
                // Another rule denied: this one was decided but not charged.
                (true, _) if !verdict.allowed => Outcome::NotCharged,
                (true, _) => Outcome::Allowed,
                (false, Mode::Shadow) => Outcome::ShadowLimited,
                (false, _) => Outcome::Limited,
            };
            // (A concurrency denial is not remembered: a release may free a unit before its
            // retry time, so remembering it would not be exact.)
            if let (Outcome::Limited, Some(r), Some(cache), false) = (
                outcome,
                d.retry_after,
                &self.inner.deny_cache,
                p.is_concurrency(),
            ) {
                cache.deny(
                    client,
                    p.inner.deny_key,
                    now.saturating_add(r),
                    now,
                    p.cost(),
                );
            }
            p.inner.stats.record(outcome);
            p.inner.stats.record_limited(client, outcome, now);
            results.push(PolicyResult {
                policy: (*p).clone(),
                outcome,
                decision: Some(d.into()),
            });
        }
        action
    }

    fn apply_failure(
        &self,
        items: &[(&ClientKey, &Policy)],
        now: Micros,
        skip_for: Micros,
        results: &mut Vec<PolicyResult>,
    ) -> Action {
        let local: Vec<Check<'_>> = items
            .iter()
            .filter(|(_, p)| !p.is_shadow() && p.on_failure() == FailurePolicy::Local)
            .map(|(client, p)| Check::new(**client, p.fallback_rule(), p.cost()))
            .collect();
        // All-or-nothing among the local policies: when one rejects, none was charged, and
        // the ones that would have allowed report it as fallback_allowed decisions.
        let fallback = (!local.is_empty()).then(|| self.inner.fallback.check(&local, now));
        let limited = fallback
            .as_ref()
            .filter(|v| !v.allowed)
            .map(|v| v.retry_after(&local));
        let mut closed = false;
        let mut local_decisions = fallback.map(|v| v.decisions.into_iter());
        for (_, p) in items {
            let (outcome, decision) = match (p.is_shadow(), p.on_failure()) {
                (true, _) | (false, FailurePolicy::Open) => (Outcome::FailedOpen, None),
                (false, FailurePolicy::Closed) => {
                    closed = true;
                    (Outcome::FailedClosed, None)
                }
                (false, FailurePolicy::Local) => {
                    let d = local_decisions.as_mut().and_then(|it| it.next());
                    match d {
                        Some(d) if d.allowed => (Outcome::FallbackAllowed, Some(d.into())),
                        Some(d) => (Outcome::FallbackLimited, Some(d.into())),
                        None => (Outcome::FailedOpen, None),
                    }
                }
            };
            p.inner.stats.record(outcome);
            results.push(PolicyResult {
                policy: (*p).clone(),
                outcome,
                decision,
            });
        }
        match (closed, limited) {
            (true, _) => Action::Unavailable {
                retry_after: micros_to_duration(skip_for.max(1)),
            },
            (false, Some(retry_after)) => Action::limit_micros(retry_after),
            (false, None) => Action::Allow,
        }
    }
}
