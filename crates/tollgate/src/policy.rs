//! A policy is a rule plus what the limiter does around it: its cost, what happens when the
//! shared store fails, whether it only observes (shadow), and how it synchronises.

use crate::metrics::PolicyStats;
use crate::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Limit, Mode, RateError, RateField, Rule};

/// What a policy does when the shared store cannot answer (error, timeout, open breaker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Allow the request (outcome `failed_open`): availability over protection.
    Open,
    /// Reject with 503 (outcome `failed_closed`): protection over availability.
    Closed,
    /// Decide with an in-process limiter whose limit is divided by `local_divisor` (outcomes
    /// `fallback_allowed` / `fallback_limited`).
    Local,
}

impl FailurePolicy {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::Local => "local",
        }
    }
}

/// How a policy's decisions reach the shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// One atomic store call per request.
    Exact,
    /// Units leased from the shared state and spent locally.
    Lease {
        /// Unused units go back after this long.
        ttl: Duration,
        /// The most units one limiter holds at once.
        max: u64,
    },
}

/// Everything needed to build a [`Policy`].
#[derive(Debug, Clone)]
pub struct PolicySpec {
    /// Unique name: part of store keys, headers and metric labels.
    pub name: String,
    /// Algorithm and quota.
    pub limit: Limit,
    /// Units each request costs.
    pub cost: u64,
    /// What to do when the store fails.
    pub on_failure: FailurePolicy,
    /// The local fallback divides limit and burst by this (at least 1).
    pub local_divisor: u64,
    /// Count would-be rejections, never reject.
    pub shadow: bool,
    /// Exact or leased.
    pub sync: SyncMode,
    /// The real cost is known only after the request (`cost_from_response`): a
    /// [`crate::Reservation`] settles this policy's estimate ([`PolicySpec::cost`]) at it.
    pub settle: bool,
}

/// A setting of a [`PolicySpec`] that an [`Error::InvalidPolicy`] is about; its `Display` is
/// the configuration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyField {
    /// `name`.
    Name,
    /// `limit` (or the algorithm's bounds on it).
    Limit,
    /// `period`.
    Period,
    /// `burst`.
    Burst,
    /// `cost`.
    Cost,
    /// `local_divisor`.
    LocalDivisor,
    /// `sync`.
    Sync,
    /// `lease_ttl`.
    LeaseTtl,
    /// `lease_max`.
    LeaseMax,
    /// `algorithm`.
    Algorithm,
}

impl PolicyField {
    /// The configuration key of the setting.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyField::Name => "name",
            PolicyField::Limit => "limit",
            PolicyField::Period => "period",
            PolicyField::Burst => "burst",
            PolicyField::Cost => "cost",
            PolicyField::LocalDivisor => "local_divisor",
            PolicyField::Sync => "sync",
            PolicyField::LeaseTtl => "lease_ttl",
            PolicyField::LeaseMax => "lease_max",
            PolicyField::Algorithm => "algorithm",
        }
    }
}

impl From<RateField> for PolicyField {
    fn from(f: RateField) -> Self {
        match f {
            RateField::Limit => PolicyField::Limit,
            RateField::Period => PolicyField::Period,
            RateField::Burst => PolicyField::Burst,
            RateField::Cost => PolicyField::Cost,
        }
    }
}

impl fmt::Display for PolicyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The shortest `lease_ttl`: a lease that expires sooner would cost a store call per request.
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(1);

impl PolicySpec {
    /// A policy enforcing `limit` with cost 1, failing open, exact, not shadow.
    pub fn new(name: impl Into<String>, limit: Limit) -> Self {
        Self {
            name: name.into(),
            limit,
            cost: 1,
            on_failure: FailurePolicy::Open,
            local_divisor: 1,
            shadow: false,
            sync: SyncMode::Exact,
            settle: false,
        }
    }

    /// Every rule a policy obeys beyond its [`Limit`] (which cannot be built invalid): a
    /// name, a cost the limit can admit, a local fallback that can be built, and a lease the
    /// algorithm can give back. [`crate::Limiter::policy`] accepts exactly the specs this
    /// accepts, so a configuration checked with it cannot fail when it is served.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |field: PolicyField, reason: String| Error::InvalidPolicy {
            policy: self.name.clone(),
            field,
            reason,
        };
        if self.name.is_empty() {
            return Err(invalid(PolicyField::Name, "must not be empty".into()));
        }
        self.limit
            .admits(self.cost)
            .map_err(|e| invalid(e.field().into(), e.to_string()))?;
        fallback_limit(&self.limit, self.local_divisor)
            .map_err(|(field, reason)| invalid(field, reason))?;
        let concurrency = self.limit.algorithm().is_concurrency();
        if (self.settle || concurrency) && self.sync != SyncMode::Exact {
            let what = if concurrency {
                "a concurrency limit"
            } else {
                "a cost settled after the response"
            };
            return Err(invalid(
                PolicyField::Sync,
                format!("{what} needs sync = \"exact\" (a lease cannot hold or give back a settled cost)"),
            ));
        }
        if self.settle && concurrency {
            return Err(invalid(
                PolicyField::Algorithm,
                "a concurrency limit holds one unit per request: it has no cost to settle".into(),
            ));
        }
        if let SyncMode::Lease { ttl, max } = self.sync {
            let algorithm = self.limit.algorithm();
            if !algorithm.is_leasable() {
                return Err(invalid(
                    PolicyField::Sync,
                    format!("\"lease\" is not supported by {algorithm} (its unused units cannot be given back exactly); use token_bucket, leaky_bucket, gcra or fixed_window, or sync = \"exact\""),
                ));
            }
            if ttl < MIN_LEASE_TTL {
                return Err(invalid(
                    PolicyField::LeaseTtl,
                    "is too short; must be at least 1ms".to_string(),
                ));
            }
            if max == 0 {
                return Err(invalid(
                    PolicyField::LeaseMax,
                    "must be at least 1".to_string(),
                ));
            }
        }
        Ok(())
    }
}

pub(crate) struct PolicyInner {
    pub(crate) rule: Rule,
    pub(crate) fallback: Rule,
    pub(crate) cost: u64,
    pub(crate) on_failure: FailurePolicy,
    /// Enforced, shadow (`PolicySpec::shadow`) or quota ([`Policy::in_quota_mode`]).
    pub(crate) mode: Mode,
    pub(crate) sync: SyncMode,
    /// See [`PolicySpec::settle`].
    pub(crate) settle: bool,
    pub(crate) stats: Arc<PolicyStats>,
    /// The deny cache's key of this rule: its name and its quota, so a denial decided under
    /// one quota never answers for another (after a reload changed it).
    pub(crate) deny_key: u64,
    /// Its item of `RateLimit-Policy`, written once (`crate::headers::policy_item`), shared
    /// by the responses that carry it alone.
    pub(crate) advertised: bytes::Bytes,
    /// The same item as text, for a list of several (checking the bytes are UTF-8 cost about
    /// 57 instructions an item, ten an RLS answer with ten descriptors, under callgrind).
    pub(crate) advertised_text: Arc<str>,
    /// The start of its `RateLimit` value, `"name";r=`, written once.
    pub(crate) remaining_prefix: Arc<str>,
}

/// The rule's name hash mixed with its algorithm and quota (per process: the deny cache is).
fn deny_key(rule: &Rule) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .build_hasher();
    rule.id().hash(&mut h);
    rule.limit().hash(&mut h);
    h.finish()
}

/// A policy registered with a [`crate::Limiter`]. Cheap to clone.
#[derive(Clone)]
pub struct Policy {
    pub(crate) inner: Arc<PolicyInner>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("limit", self.inner.rule.limit())
            .field("cost", &self.inner.cost)
            .field("on_failure", &self.inner.on_failure)
            .field("mode", &self.inner.mode)
            .field("sync", &self.inner.sync)
            .finish()
    }
}

impl Policy {
    /// Builds a policy from a spec [`PolicySpec::validate`] accepted.
    pub(crate) fn build(spec: PolicySpec, stats: Arc<PolicyStats>) -> Result<Self, Error> {
        let fallback =
            fallback_limit(&spec.limit, spec.local_divisor).map_err(|(field, reason)| {
                Error::InvalidPolicy {
                    policy: spec.name.clone(),
                    field,
                    reason,
                }
            })?;
        let rule = Rule::new(spec.name.clone(), spec.limit);
        let item = crate::headers::policy_item(rule.name(), rule.limit());
        Ok(Self {
            inner: Arc::new(PolicyInner {
                fallback: Rule::new(format!("{}:local", spec.name), fallback),
                deny_key: deny_key(&rule),
                advertised: bytes::Bytes::copy_from_slice(item.as_bytes()),
                advertised_text: item.into(),
                remaining_prefix: crate::headers::remaining_prefix(rule.name()).into(),
                rule,
                cost: spec.cost,
                on_failure: spec.on_failure,
                mode: if spec.shadow {
                    Mode::Shadow
                } else {
                    Mode::Enforce
                },
                sync: spec.sync,
                settle: spec.settle,
                stats,
            }),
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        self.inner.rule.name()
    }

    /// Its item of the `RateLimit-Policy` header.
    pub(crate) fn advertised(&self) -> &str {
        &self.inner.advertised_text
    }

    /// [`Policy::advertised`], shared (no copy).
    pub(crate) fn advertised_bytes(&self) -> bytes::Bytes {
        self.inner.advertised.clone()
    }

    /// `"name";r=`, the start of its `RateLimit` value.
    pub(crate) fn remaining_prefix(&self) -> &str {
        &self.inner.remaining_prefix
    }

    /// The rule the shared store enforces.
    pub(crate) fn rule(&self) -> &Rule {
        &self.inner.rule
    }

    /// The identity of the policy's state: equal for the policies of one name (and their
    /// [`Policy::with_cost`] copies), which share counts in the store.
    pub fn id(&self) -> u64 {
        self.inner.rule.id()
    }

    /// Algorithm and quota.
    pub fn limit(&self) -> &Limit {
        self.inner.rule.limit()
    }

    /// Units each request costs.
    pub fn cost(&self) -> u64 {
        self.inner.cost
    }

    /// Whether the policy only observes.
    pub fn is_shadow(&self) -> bool {
        self.inner.mode == Mode::Shadow
    }

    /// Whether the policy is in quota mode (see [`Policy::in_quota_mode`]).
    pub fn is_quota(&self) -> bool {
        self.inner.mode == Mode::Quota
    }

    /// How the policy's checks count in a plan.
    pub(crate) fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// What the policy does when the store fails.
    pub fn on_failure(&self) -> FailurePolicy {
        self.inner.on_failure
    }

    /// Exact or leased.
    pub fn sync(&self) -> SyncMode {
        self.inner.sync
    }

    /// Whether a [`crate::Reservation`] settles this policy's charge at the real cost.
    pub fn settles(&self) -> bool {
        self.inner.settle
    }

    /// Whether this policy limits requests in flight (`algorithm = "concurrency"`): a
    /// [`crate::Reservation`] holds one unit per request until it is released.
    pub fn is_concurrency(&self) -> bool {
        self.limit().algorithm().is_concurrency()
    }

    /// The rule the local fallback enforces (limit and burst divided by the divisor).
    pub(crate) fn fallback_rule(&self) -> &Rule {
        &self.inner.fallback
    }

    /// The same policy (same rule, state and metrics) at another cost per request, for a
    /// cost that only one request knows (an RLS descriptor's `hits_addend`; 0 checks without
    /// charging). The copy is distinct: [`Policy::is`] tells it from the original, so a
    /// caller can find its own plan items in a [`crate::LimitResult`].
    pub fn with_cost(&self, cost: u64) -> Policy {
        self.copy(cost, self.inner.mode)
    }

    /// The same policy (same rule, state and metrics) in envoyproxy/ratelimit's quota mode:
    /// over its limit it charges nothing and denies the request only when every quota-mode
    /// policy of the plan is over its limit; the plan's enforced policies deny as usual. A
    /// shadow policy stays a shadow. The copy is distinct, as [`Policy::with_cost`]'s is.
    pub fn in_quota_mode(&self) -> Policy {
        let mode = match self.inner.mode {
            Mode::Shadow => Mode::Shadow,
            Mode::Enforce | Mode::Quota => Mode::Quota,
        };
        self.copy(self.inner.cost, mode)
    }

    fn copy(&self, cost: u64, mode: Mode) -> Policy {
        let i = &self.inner;
        Policy {
            inner: Arc::new(PolicyInner {
                rule: i.rule.clone(),
                fallback: i.fallback.clone(),
                cost,
                on_failure: i.on_failure,
                mode,
                sync: i.sync,
                settle: i.settle,
                stats: Arc::clone(&i.stats),
                deny_key: i.deny_key,
                advertised: i.advertised.clone(),
                advertised_text: Arc::clone(&i.advertised_text),
                remaining_prefix: Arc::clone(&i.remaining_prefix),
            }),
        }
    }

    /// Whether `other` is this very policy value (not merely one with the same rule).
    pub fn is(&self, other: &Policy) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// The local fallback's limit: the same algorithm and period with limit and burst divided by
/// `divisor` (rounded down, at least 1), so that N gateways deciding alone admit about the
/// shared limit in total when N = divisor.
fn fallback_limit(limit: &Limit, divisor: u64) -> Result<Limit, (PolicyField, String)> {
    if divisor == 0 {
        return Err((PolicyField::LocalDivisor, "must be at least 1".to_string()));
    }
    let q = limit.quota();
    Limit::checked(
        limit.algorithm(),
        (q.limit() / divisor).max(1),
        q.period(),
        Some((q.burst() / divisor).max(1)),
        1,
    )
    .map_err(|e: RateError| {
        (
            PolicyField::LocalDivisor,
            format!("the local fallback's quota (limit and burst divided by it): {e}"),
        )
    })
}
