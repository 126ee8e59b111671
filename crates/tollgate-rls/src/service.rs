//! `ShouldRateLimit`: a request's descriptors become ONE [`Plan`] decided by ONE
//! [`Limiter::check`], so either every descriptor is charged or none is (envoyproxy/ratelimit
//! charges the other descriptors of a denied request; tollgate does not).
//!
//! Each configured rule is a [`Policy`] registered once, named after the configured
//! descriptor (`domain.key_value.key`), so metric labels carry configuration, never request
//! values. A request descriptor's client key is the keyed hash of the domain and its entries:
//! each distinct value counts on its own, and raw values never reach the store.

use crate::config::{RlsConfig, RuleLimit, Unit};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tollgate::policy::{FailurePolicy, SyncMode};
use tollgate::quota::{Algorithm, Limit};
use tollgate::{
    Action, ClientKey, IdentityHasher, LimitResult, Limiter, Outcome, Plan, Policy, PolicySpec,
};
use tonic::Status;

/// `limit_remaining` of an `unlimited` rule (u32::MAX, as envoyproxy/ratelimit answers).
pub const UNLIMITED_REMAINING: u32 = u32::MAX;
/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 256;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 64;
/// The most limit-override quotas whose policy is kept for later requests (bounded memory);
/// past it, the least recently used one is evicted. Override policies share one metric name
/// per rule (`<rule>.override`, or `<domain>.override` when none matched), so the limiter's
/// registry stays bounded whatever quotas clients send.
const MAX_OVERRIDES: usize = 1024;

/// How the service answers, from the gateway's configuration.
#[derive(Debug, Clone, Copy)]
pub struct RlsOptions {
    /// What each rule does when the store fails (`store.on_failure`).
    pub on_failure: FailurePolicy,
    /// The local fallback's divisor (`store.local_divisor`).
    pub local_divisor: u64,
    /// `[rls] response_headers = "draft"`: RateLimit-Policy and RateLimit in
    /// `response_headers_to_add`.
    pub response_headers: bool,
}

impl Default for RlsOptions {
    fn default() -> Self {
        Self {
            on_failure: FailurePolicy::Open,
            local_divisor: 1,
            response_headers: true,
        }
    }
}

/// The rate limit service: the YAML rules as policies of one [`Limiter`]. Cheap to clone.
#[derive(Clone)]
pub struct RlsService {
    inner: Arc<Inner>,
}

struct Inner {
    limiter: Limiter,
    hasher: IdentityHasher,
    config: RlsConfig,
    /// One per rule of `config` (`None` for unlimited rules).
    policies: Vec<Option<Policy>>,
    options: RlsOptions,
    overrides: Mutex<OverrideCache<Policy>>,
}

/// The policies of limit overrides by (matched rule, limit): a bounded LRU.
struct OverrideCache<V> {
    bound: usize,
    /// Bumped on every use; an entry's stamp is its last use.
    clock: u64,
    map: HashMap<(Option<usize>, Limit), (V, u64)>,
}

impl<V: Clone> OverrideCache<V> {
    fn new(bound: usize) -> Self {
        Self {
            bound: bound.max(1),
            clock: 0,
            map: HashMap::new(),
        }
    }

    fn get(&mut self, key: &(Option<usize>, Limit)) -> Option<V> {
        self.clock += 1;
        let now = self.clock;
        self.map.get_mut(key).map(|(p, used)| {
            *used = now;
            p.clone()
        })
    }

    /// Keeps `policy`, evicting the least recently used entry when full. A scan of at most
    /// `bound` entries, on a miss only.
    fn insert(&mut self, key: (Option<usize>, Limit), value: V) {
        if self.map.len() >= self.bound && !self.map.contains_key(&key) {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.map.remove(&k);
            }
        }
        self.clock += 1;
        self.map.insert(key, (value, self.clock));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// A request's plan items, and where each (client, rule) sits among them.
#[derive(Default)]
struct Items {
    list: Vec<Item>,
    index: HashMap<(ClientKey, u64), usize>,
}

/// A request descriptor's answer before the store call.
enum Slot {
    /// No rule (unknown domain, no match, replaced): OK without a limit.
    NoLimit,
    /// An unlimited rule.
    Unlimited,
    /// Checked as plan item `item`.
    Item(usize),
}

/// One (client, policy) of the plan and how its status reads.
struct Item {
    client: ClientKey,
    policy: Policy,
    cost: u64,
    current: RateLimit,
}

impl RlsService {
    /// The policy each rule of `config` is enforced as, in rule order (`None`: unlimited).
    /// [`RlsService::new`] registers exactly these, so a caller that checks them with
    /// [`PolicySpec::validate`] knows `new` cannot fail.
    pub fn specs<'a>(
        config: &'a RlsConfig,
        options: &'a RlsOptions,
    ) -> impl Iterator<Item = Option<PolicySpec>> + 'a {
        config.rules().iter().map(|rule| match rule.limit {
            RuleLimit::Unlimited => None,
            RuleLimit::Limited { limit, .. } => Some(PolicySpec {
                name: rule.policy_name.clone(),
                limit,
                cost: 1,
                on_failure: options.on_failure,
                local_divisor: options.local_divisor,
                shadow: rule.shadow,
                sync: SyncMode::Exact,
            }),
        })
    }

    /// Registers every rule of `config` with `limiter`.
    pub fn new(
        limiter: Limiter,
        hasher: IdentityHasher,
        config: RlsConfig,
        options: RlsOptions,
    ) -> Result<Self, tollgate::Error> {
        let policies = Self::specs(&config, &options)
            .map(|spec| spec.map(|s| limiter.policy(s)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                limiter,
                hasher,
                config,
                policies,
                options,
                overrides: Mutex::new(OverrideCache::new(MAX_OVERRIDES)),
            }),
        })
    }

    /// The limiter the service decides with.
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// Decides one request. Errors are the gRPC statuses Envoy sees: `INVALID_ARGUMENT` for a
    /// request that cannot be decided, `UNAVAILABLE` when the store fails and a rule fails
    /// closed (Envoy then applies its own `failure_mode_deny`).
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let i = &self.inner;
        if req.domain.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        if req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_DESCRIPTORS} descriptors per request"
            )));
        }
        let request_hits = u64::from(req.hits_addend.max(1));
        let rules: Vec<Option<usize>> = req
            .descriptors
            .iter()
            .map(|d| self.rule_of(&req.domain, d))
            .collect::<Result<_, _>>()?;
        let replaced = self.replaced(&rules);
        let mut slots = Vec::with_capacity(rules.len());
        let mut items = Items::default();
        for (d, rule) in req.descriptors.iter().zip(&rules) {
            let cost = d.hits_addend.unwrap_or(request_hits);
            let rule = rule.filter(|r| !replaced.contains(r));
            slots.push(self.slot(&req.domain, d, rule, cost, &mut items)?);
        }
        let items = items.list;
        let mut plan = Plan::new();
        // Each item's policy must be a distinct value (results are matched back by identity):
        // the registered policy itself for the first item of its rule at its own cost, a copy
        // with the item's cost otherwise.
        let mut shared = HashSet::with_capacity(items.len());
        let policies: Vec<Policy> = items
            .iter()
            .map(|it| {
                if it.cost == it.policy.cost() && shared.insert(it.policy.id()) {
                    it.policy.clone()
                } else {
                    it.policy.with_cost(it.cost)
                }
            })
            .collect();
        for (it, p) in items.iter().zip(&policies) {
            plan.push(it.client, p.clone());
        }
        let result = if plan.is_empty() {
            LimitResult {
                action: Action::Allow,
                results: Vec::new(),
            }
        } else {
            i.limiter.check(&plan).await
        };
        tollgate::trace::record_decision(&tracing::Span::current(), &plan, &result);
        self.respond(&slots, &items, &policies, &result)
    }

    /// What one request descriptor needs: a plan item (added to `items`), or an answer
    /// without the store. `rule` is its rule after `replaces`; a limit override (in a known
    /// domain) wins over it.
    fn slot(
        &self,
        domain: &str,
        d: &RateLimitDescriptor,
        rule: Option<usize>,
        cost: u64,
        items: &mut Items,
    ) -> Result<Slot, Status> {
        let i = &self.inner;
        if let Some(o) = d.limit.as_ref().filter(|_| i.config.has_domain(domain)) {
            let (policy, current, salt) = self.override_policy(domain, rule, o)?;
            let client = self.client(domain, d, Some(&salt));
            return Ok(Self::add(items, client, policy, cost, current));
        }
        let Some(r) = rule else {
            return Ok(Slot::NoLimit);
        };
        let configured = &i.config.rules()[r];
        match (&i.policies[r], configured.limit) {
            (
                Some(policy),
                RuleLimit::Limited {
                    requests_per_unit,
                    unit,
                    ..
                },
            ) => {
                let current = RateLimit {
                    name: configured.name.clone(),
                    requests_per_unit,
                    unit: unit.proto(),
                };
                let client = self.client(domain, d, None);
                Ok(Self::add(items, client, policy.clone(), cost, current))
            }
            _ => Ok(Slot::Unlimited),
        }
    }

    /// The rule of one request descriptor (before `replaces`).
    fn rule_of(&self, domain: &str, d: &RateLimitDescriptor) -> Result<Option<usize>, Status> {
        if d.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_ENTRIES} entries per descriptor"
            )));
        }
        Ok(self.inner.config.find(
            domain,
            d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())),
        ))
    }

    /// The rules that another matched rule of the same request `replaces` (by name).
    fn replaced(&self, rules: &[Option<usize>]) -> Vec<usize> {
        let all = self.inner.config.rules();
        let names: Vec<&str> = rules
            .iter()
            .flatten()
            .flat_map(|&r| all[r].replaces.iter().map(String::as_str))
            .collect();
        if names.is_empty() {
            return Vec::new();
        }
        rules
            .iter()
            .flatten()
            .copied()
            .filter(|&r| !all[r].name.is_empty() && names.contains(&all[r].name.as_str()))
            .collect()
    }

    /// Adds a plan item, or charges an identical one of the same request again.
    fn add(
        items: &mut Items,
        client: ClientKey,
        policy: Policy,
        cost: u64,
        current: RateLimit,
    ) -> Slot {
        let next = items.list.len();
        match items.index.entry((client, policy.id())) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let k = *e.get();
                items.list[k].cost = items.list[k].cost.saturating_add(cost);
                Slot::Item(k)
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(next);
                items.list.push(Item {
                    client,
                    policy,
                    cost,
                    current,
                });
                Slot::Item(next)
            }
        }
    }

    /// The keyed hash of the domain and the entries (and an override's quota, which counts on
    /// its own): lengths delimit every part, so no two descriptors share a key by accident.
    fn client(&self, domain: &str, d: &RateLimitDescriptor, salt: Option<&str>) -> ClientKey {
        let mut bytes = Vec::with_capacity(64);
        let mut part = |s: &[u8]| {
            bytes.extend_from_slice(&(s.len() as u64).to_le_bytes());
            bytes.extend_from_slice(s);
        };
        part(domain.as_bytes());
        for e in &d.entries {
            part(e.key.as_bytes());
            part(e.value.as_bytes());
        }
        if let Some(s) = salt {
            part(s.as_bytes());
        }
        self.inner.hasher.client_key("rls", &bytes)
    }

    /// The policy of a request's limit override: the matched rule's algorithm (fixed_window
    /// when none matched) with the override's quota, kept for later requests up to a bound.
    fn override_policy(
        &self,
        domain: &str,
        rule: Option<usize>,
        o: &crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride,
    ) -> Result<(Policy, RateLimit, String), Status> {
        let i = &self.inner;
        let unit = Unit::from_proto(o.unit).ok_or_else(|| {
            Status::invalid_argument("the limit override needs a unit (SECOND to WEEK)")
        })?;
        let configured = rule.map(|r| &i.config.rules()[r]);
        let algorithm = match configured.map(|r| r.limit) {
            Some(RuleLimit::Limited { limit, .. }) => limit.algorithm(),
            _ => Algorithm::FixedWindow,
        };
        let limit = Limit::checked(
            algorithm,
            u64::from(o.requests_per_unit),
            unit.duration(),
            None,
            1,
        )
        .map_err(|e| Status::invalid_argument(format!("invalid limit override: {e}")))?;
        let current = RateLimit {
            name: configured.map(|r| r.name.clone()).unwrap_or_default(),
            requests_per_unit: o.requests_per_unit,
            unit: unit.proto(),
        };
        let salt = format!("override {} {}", o.requests_per_unit, unit.name());
        let key = (rule, limit);
        let mut cache = i
            .overrides
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = cache.get(&key) {
            return Ok((p, current, salt));
        }
        let name = match configured {
            Some(r) => format!("{}.override", r.policy_name),
            None => format!("{domain}.override"),
        };
        let policy = i
            .limiter
            .policy(PolicySpec {
                name,
                limit,
                cost: 1,
                on_failure: i.options.on_failure,
                local_divisor: i.options.local_divisor,
                shadow: false,
                sync: SyncMode::Exact,
            })
            .map_err(|e| Status::invalid_argument(format!("invalid limit override: {e}")))?;
        cache.insert(key, policy.clone());
        Ok((policy, current, salt))
    }

    fn respond(
        &self,
        slots: &[Slot],
        items: &[Item],
        policies: &[Policy],
        result: &LimitResult,
    ) -> Result<RateLimitResponse, Status> {
        let overall = match result.action {
            Action::Allow => Code::Ok,
            Action::Limit { .. } => Code::OverLimit,
            Action::Unavailable { .. } => {
                return Err(Status::unavailable(
                    "the rate limit store is unavailable and a matched rule fails closed",
                ))
            }
        };
        // Each item's result: the limiter answers in plan order (a subsequence of it when the
        // deny cache answers), so the next unmatched result is nearly always the one; a search
        // only when it is not.
        let mut next = 0;
        let by_item: Vec<Option<&tollgate::PolicyResult>> = policies
            .iter()
            .map(|p| match result.results.get(next) {
                Some(r) if r.policy.is(p) => {
                    next += 1;
                    Some(r)
                }
                _ => result.results.iter().find(|r| r.policy.is(p)),
            })
            .collect();
        let statuses = slots
            .iter()
            .map(|slot| match slot {
                Slot::NoLimit => DescriptorStatus {
                    code: Code::Ok.into(),
                    ..Default::default()
                },
                Slot::Unlimited => DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: UNLIMITED_REMAINING,
                    ..Default::default()
                },
                Slot::Item(k) => {
                    let r = by_item[*k];
                    let limited = r.is_some_and(|r| {
                        matches!(r.outcome, Outcome::Limited | Outcome::FallbackLimited)
                    });
                    let d = r.and_then(|r| r.decision);
                    DescriptorStatus {
                        code: if limited { Code::OverLimit } else { Code::Ok }.into(),
                        current_limit: Some(items[*k].current.clone()),
                        limit_remaining: d
                            .map_or(0, |d| u32::try_from(d.remaining).unwrap_or(u32::MAX)),
                        duration_until_reset: d.map(|d| proto_duration(d.reset_after)),
                    }
                }
            })
            .collect();
        let mut response_headers_to_add = Vec::new();
        if self.inner.options.response_headers {
            if let Some(v) = tollgate::headers::ratelimit_policy(result) {
                response_headers_to_add.push(header("ratelimit-policy", v));
            }
            if let Some(v) = tollgate::headers::ratelimit(result) {
                response_headers_to_add.push(header("ratelimit", v));
            }
            if let Action::Limit {
                retry_after: Some(wait),
            } = result.action
            {
                response_headers_to_add.push(header(
                    "retry-after",
                    tollgate::headers::retry_after_secs(wait).to_string(),
                ));
            }
        }
        Ok(RateLimitResponse {
            overall_code: overall.into(),
            statuses,
            response_headers_to_add,
            ..Default::default()
        })
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        ..Default::default()
    }
}

fn proto_duration(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tollgate::quota::Quota;

    fn key(n: u64) -> (Option<usize>, Limit) {
        let q = Quota::new(n, Duration::from_secs(60)).expect("quota");
        (
            Some(0),
            Limit::new(Algorithm::FixedWindow, q).expect("limit"),
        )
    }

    #[test]
    fn the_override_cache_stays_bounded_and_evicts_the_least_recently_used() {
        let mut c = OverrideCache::new(4);
        for n in 1..=4 {
            c.insert(key(n), n);
        }
        // 1 is used again, so 2 is now the oldest.
        assert_eq!(c.get(&key(1)), Some(1));
        for n in 5..=100 {
            c.insert(key(n), n);
            assert!(c.len() <= 4, "len {} after {n}", c.len());
            if n == 5 {
                assert_eq!(c.get(&key(2)), None, "2 was the least recently used");
                assert_eq!(c.get(&key(1)), Some(1), "1 was used recently");
            }
        }
        assert_eq!(c.len(), 4);
        for n in 97..=100 {
            assert_eq!(c.get(&key(n)), Some(n));
        }
        // Re-inserting a present key replaces it without evicting another.
        c.insert(key(100), 1000);
        assert_eq!(c.len(), 4);
        assert_eq!(c.get(&key(97)), Some(97));
        assert_eq!(c.get(&key(100)), Some(1000));
    }
}
