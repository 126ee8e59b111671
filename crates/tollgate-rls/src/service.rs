//! `ShouldRateLimit`: a request's descriptors become ONE [`Plan`] decided by ONE
//! [`Limiter::check`], so either every descriptor is charged or none is (envoyproxy/ratelimit
//! charges the other descriptors of a denied request; tollgate does not).
//!
//! A descriptor with Envoy 1.38's `is_negative_hits` is no charge: its hits are given back
//! ([`Limiter::give_back`], never below a fresh state) whatever the request's other
//! descriptors decide, and it is answered OK with its remaining units after the give-back,
//! never OVER_LIMIT. A rule with `algorithm: concurrency` counts hits in flight the same way:
//! each request's hits are held, a negative-hits request gives them back (the oldest first),
//! and hits nothing gives back are dropped after `hold_ttl`. Its status reports
//! `requests_per_unit` with unit UNKNOWN: a limit in flight has no window, and UNKNOWN is
//! the only unit Envoy's protocol has that claims none.
//!
//! Each configured rule is a [`Policy`] registered once, named after the configured
//! descriptor (`domain.key_value.key`), so metric labels carry configuration, never request
//! values. A request descriptor's client key is the keyed hash of the domain and its entries:
//! each distinct value counts on its own, and raw values never reach the store.

use crate::config::{Found, Level, RlsConfig, Rule, RuleLimit, Unit};
use crate::metrics::DescriptorMetrics;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::request::{Descriptor, Override, RlsRequest, MAX_DESCRIPTORS, MAX_ENTRIES};
use crate::wire::response::{AddedHeaders, Current, Decided, DescriptorAnswer};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tollgate::policy::{FailurePolicy, SyncMode};
use tollgate::quota::{Algorithm, Limit};
use tollgate::{
    Action, ClientKey, IdentityHasher, LimitResult, Limiter, Outcome, Plan, Policy, PolicySpec,
};
use tonic::Status;

/// `limit_remaining` of an `unlimited` rule (u32::MAX, as envoyproxy/ratelimit answers).
pub const UNLIMITED_REMAINING: u32 = u32::MAX;
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
    /// `[rls] quota_mode`: every rule in quota mode (envoyproxy's global quota mode).
    pub quota_mode: bool,
    /// `[rls] shadow_mode`: no answer is ever OVER_LIMIT (envoyproxy's global shadow mode);
    /// each descriptor still reports its own code.
    pub shadow_mode: bool,
    /// `[rls] dynamic_metadata`: the response carries envoyproxy's dynamic metadata.
    pub dynamic_metadata: bool,
}

impl Default for RlsOptions {
    fn default() -> Self {
        Self {
            on_failure: FailurePolicy::Open,
            local_divisor: 1,
            response_headers: true,
            quota_mode: false,
            shadow_mode: false,
            dynamic_metadata: false,
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
    /// One per rule of `config`: the limit its answers report (`None` for a rule without one
    /// the store counts), written once here.
    limits: Vec<Option<Reported>>,
    options: RlsOptions,
    overrides: Mutex<OverrideCache<Policy>>,
    /// The series `detailed_metric` and `value_to_metric` ask for (bounded; carried over
    /// from one service generation to the next, see [`RlsService::keep_metrics_of`]).
    metrics: Arc<DescriptorMetrics>,
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

    /// Keeps `value`. When full, the least recently used eighth goes in one pass, so a
    /// request that brings many new quotas costs a scan per `bound / 8` misses, not per miss.
    fn insert(&mut self, key: (Option<usize>, Limit), value: V) {
        if self.map.len() >= self.bound && !self.map.contains_key(&key) {
            let mut stamps: Vec<u64> = self.map.values().map(|(_, used)| *used).collect();
            let drop = (self.bound / 8).max(1).min(stamps.len());
            let (_, &mut cut, _) = stamps.select_nth_unstable(drop - 1);
            self.map.retain(|_, (_, used)| *used > cut);
        }
        self.clock += 1;
        self.map.insert(key, (value, self.clock));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// A request's plan items, and the bytes of the client key being built (one buffer for all
/// the request's descriptors).
struct Items<'c> {
    list: Vec<Item<'c>>,
    key: IdentityBytes,
}

/// The limit a rule's answers report, when it has one that the store counts: its
/// `requests_per_unit` and unit (a limit in flight has no window: unit UNKNOWN, 0), and the
/// `current_limit` field of those (`Current::field`), written once for every answer.
struct Reported {
    requests_per_unit: u32,
    unit: i32,
    written: Box<[u8]>,
}

impl Reported {
    fn of(rule: &Rule) -> Option<Self> {
        let (requests_per_unit, unit) = match rule.limit {
            RuleLimit::InFlight {
                requests_per_unit, ..
            } => (requests_per_unit, 0),
            RuleLimit::Limited {
                requests_per_unit,
                unit,
                ..
            } => (requests_per_unit, unit.proto()),
            RuleLimit::Unlimited | RuleLimit::Blocked { .. } => return None,
        };
        let current = Current {
            name: &rule.name,
            requests_per_unit,
            unit,
            written: &[],
        };
        Some(Self {
            requests_per_unit,
            unit,
            written: current.field().into_boxed_slice(),
        })
    }

    /// The limit as rule `name`'s answers report it.
    fn current<'c>(&'c self, name: &'c str) -> Current<'c> {
        Current {
            name,
            requests_per_unit: self.requests_per_unit,
            unit: self.unit,
            written: &self.written,
        }
    }
}

/// The bytes a descriptor's identity is hashed from ([`RlsService::client`]): the source
/// (`rls`), its separator and the request's domain first, the same for every descriptor of
/// the request and so written once; then each descriptor's own parts, over the last one's.
struct IdentityBytes {
    bytes: Vec<u8>,
    /// The length of the request's part.
    prefix: usize,
}

impl IdentityBytes {
    /// Room for `gathered` identities one after the other, when a request's are hashed
    /// together ([`RlsService::keys_together`]); 0 when they are hashed one at a time.
    fn new(domain: &str, gathered: usize) -> Self {
        let mut bytes = Vec::with_capacity(256.max(96 * gathered));
        bytes.extend_from_slice(b"rls\0");
        put_part(&mut bytes, domain.as_bytes());
        let prefix = bytes.len();
        Self { bytes, prefix }
    }

    /// The buffer with the request's part alone, for a descriptor's parts to follow.
    fn descriptor(&mut self) -> &mut Vec<u8> {
        self.bytes.truncate(self.prefix);
        &mut self.bytes
    }

    /// The buffer with another copy of the request's part at its end, where it starts, for
    /// a descriptor's parts to follow: identities one after the other, to be hashed together
    /// ([`RlsService::keys_together`]).
    fn another(&mut self) -> (&mut Vec<u8>, usize) {
        let start = self.bytes.len();
        self.bytes.extend_from_within(..self.prefix);
        (&mut self.bytes, start)
    }
}

/// Client keys hashed together ([`RlsService::keys_together`]): `keys[k]` is descriptor
/// `of[k]`'s, in descriptor order.
#[derive(Default)]
struct Known {
    of: Vec<usize>,
    keys: Vec<ClientKey>,
    /// The next one to take.
    next: usize,
}

impl Known {
    /// Descriptor `n`'s key, if it was hashed together; asked in descriptor order.
    fn take(&mut self, n: usize) -> Option<ClientKey> {
        if self.of.get(self.next) != Some(&n) {
            return None;
        }
        self.next += 1;
        self.keys.get(self.next - 1).copied()
    }
}

/// The limit a blocked rule (or a limit override of 0) reports: nothing a `unit`, written
/// from its fields in each answer.
fn blocked_limit(name: &str, unit: Unit) -> Current<'_> {
    Current {
        name,
        requests_per_unit: 0,
        unit: unit.proto(),
        written: &[],
    }
}

/// One part of an identity: its length (eight bytes, little-endian), then its bytes.
fn put_part(bytes: &mut Vec<u8>, s: &[u8]) {
    bytes.extend_from_slice(&(s.len() as u64).to_le_bytes());
    bytes.extend_from_slice(s);
}

/// A request descriptor's answer before the store call.
enum Slot<'c> {
    /// No rule (unknown domain, no match, replaced): OK without a limit.
    NoLimit,
    /// An unlimited rule.
    Unlimited,
    /// `requests_per_unit: 0` (or a limit override of 0): over the limit, nothing stored.
    Blocked {
        current: Current<'c>,
        unit: Unit,
        /// The rule's own `shadow_mode`: reported OK.
        shadow: bool,
        /// In quota mode (and not a shadow).
        quota: bool,
        metadata: Option<usize>,
    },
    /// Checked as plan item `item`.
    Item(usize),
    /// A negative-hits descriptor of a blocked rule: nothing stored, nothing to give back.
    NothingToGive { current: Current<'c> },
}

/// One (client, policy) of the plan and how its status reads.
struct Item<'c> {
    client: ClientKey,
    /// The rule's registered policy, borrowed (a clone is a locked instruction to take and
    /// one to drop, ten of each for a request of ten descriptors), or an override's.
    policy: Cow<'c, Policy>,
    cost: u64,
    current: Current<'c>,
    /// In quota mode (and not a shadow).
    quota: bool,
    /// The rule's own `shadow_mode` (a descriptor of it never reports OVER_LIMIT).
    rule_shadow: bool,
    /// The rule whose `metadata` the item passes on when it passes.
    rule: Option<usize>,
    /// `is_negative_hits`: `cost` is given back, not charged.
    negative: bool,
}

impl RlsService {
    /// The policy each rule of `config` is enforced as, in rule order (`None`: unlimited or
    /// blocked, which never reach the store). [`RlsService::new`] registers exactly these, so a
    /// caller that checks them with [`PolicySpec::validate`] knows `new` cannot fail.
    pub fn specs<'a>(
        config: &'a RlsConfig,
        options: &'a RlsOptions,
    ) -> impl Iterator<Item = Option<PolicySpec>> + 'a {
        config.rules().iter().map(|rule| match rule.limit {
            RuleLimit::Unlimited | RuleLimit::Blocked { .. } => None,
            RuleLimit::Limited { limit, .. } | RuleLimit::InFlight { limit, .. } => {
                Some(PolicySpec {
                    name: rule.policy_name.clone(),
                    limit,
                    cost: 1,
                    on_failure: options.on_failure,
                    local_divisor: options.local_divisor,
                    // The global shadow mode: every rule decided and charged, none denying.
                    shadow: rule.shadow || options.shadow_mode,
                    sync: SyncMode::Exact,
                    settle: false,
                })
            }
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
        let limits = config.rules().iter().map(Reported::of).collect();
        Ok(Self {
            inner: Arc::new(Inner {
                limiter,
                hasher,
                config,
                policies,
                limits,
                options,
                overrides: Mutex::new(OverrideCache::new(MAX_OVERRIDES)),
                metrics: Arc::default(),
            }),
        })
    }

    /// The limiter the service decides with.
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// Counts on in `old`'s descriptor series (a reload keeps the counters), when this
    /// service is not shared yet.
    pub fn keep_metrics_of(&mut self, old: &RlsService) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.metrics = Arc::clone(&old.inner.metrics);
        }
    }

    /// `tollgate_rls_descriptor_decisions_total` (the series `detailed_metric` and
    /// `value_to_metric` ask for) in the Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        self.inner.metrics.render(out);
    }

    /// Decides one request. Errors are the gRPC statuses Envoy sees: `INVALID_ARGUMENT` for a
    /// request that cannot be decided, `UNAVAILABLE` when the store fails and a rule fails
    /// closed (Envoy then applies its own `failure_mode_deny`).
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        self.decide_request(&RlsRequest::of(req))
            .await
            .map(Decided::into_proto)
    }

    /// [`RlsService::decide`] for a request read in place ([`RlsRequest::decode`]), as the
    /// server reads every call's.
    pub(crate) async fn decide_request(&self, req: &RlsRequest<'_>) -> Result<Decided<'_>, Status> {
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
        // The domain's descriptors, found once for all the request's.
        let domain = i.config.level(req.domain);
        let found: Vec<Option<Found>> = req
            .descriptors
            .iter()
            .map(|d| self.rule_of(domain, d))
            .collect::<Result<_, _>>()?;
        let replaced = self.replaced(&found);
        let mut slots = Vec::with_capacity(found.len());
        // Sized once: a request's items are at most its descriptors (the identity's bytes
        // are a scratch buffer, reused for each).
        let (mut known, key) = self.keys_together(req, &found, &replaced);
        let mut items = Items {
            list: Vec::with_capacity(found.len()),
            key,
        };
        for (n, (d, f)) in req.descriptors.iter().zip(&found).enumerate() {
            let cost = d.hits_addend.unwrap_or(request_hits);
            let f = f.filter(|f| !replaced.contains(&f.rule));
            let known = known.take(n);
            slots.push(self.slot(req.domain, d, f, cost, known, &mut items)?);
        }
        let mut items = items.list;
        // A blocked descriptor denies the request (nothing is charged): the store is asked
        // only for what the others have left, at cost 0. Give-backs are no charge: they go
        // back whatever the request's other descriptors decide.
        let blocked = self.blocked_denies(&slots, &items);
        if blocked {
            for it in items.iter_mut().filter(|it| !it.negative) {
                it.cost = 0;
            }
        }
        let mut plan = Plan::with_capacity(items.len());
        let mut given = Plan::new();
        // Each item's policy must be a distinct value (results are matched back by identity):
        // the registered policy itself for the first item of its rule at its own cost, a copy
        // with the item's cost (or in quota mode) otherwise.
        let own_cost = |it: &Item| it.cost == it.policy.cost();
        // Borrowed where it is the item's own policy (see `Item::policy`).
        let policies: Vec<Cow<'_, Policy>> = items
            .iter()
            .enumerate()
            .map(|(k, it)| {
                // A linear look back: requests carry a few descriptors (at most
                // MAX_DESCRIPTORS), and a set would cost more than the scan.
                let first_of_rule = || {
                    !items[..k]
                        .iter()
                        .any(|e| e.policy.id() == it.policy.id() && own_cost(e))
                };
                let p = if own_cost(it) && first_of_rule() {
                    Cow::Borrowed(&*it.policy)
                } else {
                    Cow::Owned(it.policy.with_cost(it.cost))
                };
                if it.quota {
                    Cow::Owned(p.in_quota_mode())
                } else {
                    p
                }
            })
            .collect();
        for (it, p) in items.iter().zip(&policies) {
            if it.negative {
                given.push(it.client, Policy::clone(p));
            } else {
                plan.push(it.client, Policy::clone(p));
            }
        }
        // Give-backs first, so that a charge in the same call (Envoy's stream-end "estimate
        // back, real cost charged") finds the units given back. Their statuses read the
        // states after the give-back; their own answer never denies (nor fails) the request.
        let back = if given.is_empty() {
            Vec::new()
        } else {
            i.limiter.give_back(&given).await.results
        };
        let mut result = if plan.is_empty() {
            LimitResult {
                action: Action::Allow,
                results: Vec::new(),
            }
        } else {
            i.limiter.check(&plan).await
        };
        result.results.extend(back);
        tollgate::trace::record_decision(&tracing::Span::current(), &plan, &result);
        let answer = Answer {
            slots: &slots,
            items: &items,
            policies: &policies,
            result: &result,
            blocked,
        };
        self.respond(req, &found, &answer)
    }

    /// Whether a blocked descriptor denies the request: an enforced one (not in quota mode),
    /// or quota descriptors that are all blocked. The global shadow mode denies nothing.
    fn blocked_denies(&self, slots: &[Slot<'_>], items: &[Item<'_>]) -> bool {
        if self.inner.options.shadow_mode {
            return false;
        }
        let mut quota = 0usize;
        let mut quota_blocked = 0usize;
        for slot in slots {
            match slot {
                Slot::Blocked {
                    shadow: false,
                    quota: false,
                    ..
                } => return true,
                Slot::Blocked {
                    shadow: false,
                    quota: true,
                    ..
                } => {
                    quota += 1;
                    quota_blocked += 1;
                }
                Slot::Item(k) if items[*k].quota => quota += 1,
                _ => {}
            }
        }
        quota > 0 && quota == quota_blocked
    }

    /// What one request descriptor needs: a plan item (added to `items`), or an answer
    /// without the store. `found` is its rule after `replaces`; a limit override (in a known
    /// domain) wins over it.
    fn slot<'s>(
        &'s self,
        domain: &str,
        d: &Descriptor<'_>,
        found: Option<Found>,
        cost: u64,
        known: Option<ClientKey>,
        items: &mut Items<'s>,
    ) -> Result<Slot<'s>, Status> {
        let i = &self.inner;
        let negative = d.is_negative_hits;
        let rule = found.map(|f| f.rule);
        let configured = rule.map(|r| &i.config.rules()[r]);
        let rule_shadow = configured.is_some_and(|r| r.shadow) || i.options.shadow_mode;
        let quota = (configured.is_some_and(|r| r.quota) || i.options.quota_mode) && !rule_shadow;
        if let Some(o) = d.limit.filter(|_| i.config.has_domain(domain)) {
            if o.requests_per_unit == 0 {
                let unit = Unit::from_proto(o.unit).ok_or_else(|| {
                    Status::invalid_argument("the limit override needs a unit (SECOND to WEEK)")
                })?;
                let current = blocked_limit(configured.map_or("", |r| r.name.as_str()), unit);
                if negative {
                    return Ok(Slot::NothingToGive { current });
                }
                return Ok(Slot::Blocked {
                    current,
                    unit,
                    shadow: false,
                    quota: false,
                    metadata: None,
                });
            }
            // As envoyproxy: an override is never in shadow or quota mode.
            let (policy, current, salt) = self.override_policy(domain, rule, &o)?;
            let client = self.client(domain, d, None, Some(&salt), &mut items.key);
            let item = Item {
                client,
                policy: Cow::Owned(policy),
                cost,
                current,
                quota: false,
                rule_shadow: false,
                rule: None,
                negative,
            };
            return Ok(Self::add(items, item));
        }
        let (Some(f), Some(configured)) = (found, configured) else {
            return Ok(Slot::NoLimit);
        };
        match (&i.policies[f.rule], configured.limit, &i.limits[f.rule]) {
            (Some(policy), _, Some(reported)) => {
                let current = reported.current(&configured.name);
                // Hashed with the request's others when there were enough of them.
                let client =
                    known.unwrap_or_else(|| self.client(domain, d, Some(f), None, &mut items.key));
                let item = Item {
                    client,
                    policy: Cow::Borrowed(policy),
                    cost,
                    current,
                    quota,
                    rule_shadow: configured.shadow,
                    rule: Some(f.rule),
                    negative,
                };
                Ok(Self::add(items, item))
            }
            (_, RuleLimit::Blocked { unit }, _) => {
                let current = blocked_limit(&configured.name, unit);
                if negative {
                    return Ok(Slot::NothingToGive { current });
                }
                Ok(Slot::Blocked {
                    current,
                    unit,
                    shadow: rule_shadow,
                    quota,
                    metadata: Some(f.rule),
                })
            }
            _ => Ok(Slot::Unlimited),
        }
    }

    /// The rule of one request descriptor (before `replaces`).
    fn rule_of(&self, domain: Option<&Level>, d: &Descriptor<'_>) -> Result<Option<Found>, Status> {
        if d.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_ENTRIES} entries per descriptor"
            )));
        }
        Ok(self.inner.config.find_in(domain, d.pairs()))
    }

    /// The rules that another matched rule of the same request `replaces` (by name).
    fn replaced(&self, found: &[Option<Found>]) -> Vec<usize> {
        let all = self.inner.config.rules();
        let rules = || found.iter().flatten().map(|f| f.rule);
        if rules().all(|r| all[r].replaces.is_empty()) {
            return Vec::new();
        }
        let names: Vec<&str> = rules()
            .flat_map(|r| all[r].replaces.iter().map(String::as_str))
            .collect();
        rules()
            .filter(|&r| !all[r].name.is_empty() && names.contains(&all[r].name.as_str()))
            .collect()
    }

    /// Adds a plan item, or charges an identical one of the same request again. A linear
    /// search: a request has a few descriptors (at most [`MAX_DESCRIPTORS`]), where a map
    /// would cost an allocation and a hash per descriptor.
    fn add<'c>(items: &mut Items<'c>, item: Item<'c>) -> Slot<'c> {
        let id = item.policy.id();
        match items.list.iter().position(|it| {
            it.client == item.client && it.policy.id() == id && it.negative == item.negative
        }) {
            Some(k) => {
                items.list[k].cost = items.list[k].cost.saturating_add(item.cost);
                Slot::Item(k)
            }
            None => {
                items.list.push(item);
                Slot::Item(items.list.len() - 1)
            }
        }
    }

    /// The keyed hash of the domain and the entries (and an override's quota, which counts on
    /// its own): lengths delimit every part, so no two descriptors share a key by accident.
    /// An entry matched by a `share_threshold` wildcard counts as the pattern, so every value
    /// matching it shares one counter. `key` holds the request's part (its domain, `domain`);
    /// the descriptor's parts are written after it, over the last descriptor's.
    fn client(
        &self,
        domain: &str,
        d: &Descriptor<'_>,
        found: Option<Found>,
        salt: Option<&str>,
        key: &mut IdentityBytes,
    ) -> ClientKey {
        // The identity's source ("rls"), its separator and the domain first: the buffer is
        // hashed as it stands (`client_key_joined`), the same key as
        // `client_key("rls", parts)`.
        self.identity(domain, d, found, salt, key.descriptor());
        self.inner.hasher.client_key_joined(&key.bytes)
    }

    /// The client keys of the request's descriptors that count against a rule's limit
    /// without an override, where the hasher computes keys together for less than one at a
    /// time (`IdentityHasher::hashes_together`): each the key [`RlsService::client`] gives
    /// it, their identities written one after the other and hashed at once. Returns the
    /// keys in descriptor order with each one's descriptor, none for a request of one or two
    /// descriptors (Envoy's common ones), whose keys are hashed in place; and the request's
    /// identity buffer, sized for what it holds.
    fn keys_together(
        &self,
        req: &RlsRequest<'_>,
        found: &[Option<Found>],
        replaced: &[usize],
    ) -> (Known, IdentityBytes) {
        let i = &self.inner;
        let mut known = Known::default();
        if !i.hasher.hashes_together(req.descriptors.len()) {
            return (known, IdentityBytes::new(req.domain, 0));
        }
        let mut key = IdentityBytes::new(req.domain, found.len());
        let overridden = |d: &Descriptor<'_>| d.limit.is_some() && i.config.has_domain(req.domain);
        let mut spans = Vec::with_capacity(found.len());
        known.of.reserve(found.len());
        for (n, (d, f)) in req.descriptors.iter().zip(found).enumerate() {
            let Some(f) = f.filter(|f| !replaced.contains(&f.rule)) else {
                continue;
            };
            // Slot's branch that hashes `client(domain, d, Some(f), None)`; a key computed
            // here for a descriptor that turns out not to need one is only unused.
            if overridden(d) || i.policies[f.rule].is_none() || i.limits[f.rule].is_none() {
                continue;
            }
            let (bytes, start) = key.another();
            self.identity(req.domain, d, Some(f), None, bytes);
            spans.push((start, key.bytes.len()));
            known.of.push(n);
        }
        if !i.hasher.hashes_together(spans.len()) {
            // Too few left to pay: they hash in place.
            known.of.clear();
            return (known, key);
        }
        // Past the last identity, bytes read with it and masked (`client_keys_in`).
        key.bytes.extend_from_slice(&[0; 32]);
        known.keys.resize(spans.len(), ClientKey([0; 16]));
        i.hasher.client_keys_in(&key.bytes, &spans, &mut known.keys);
        (known, key)
    }

    /// Writes a descriptor's identity (see [`RlsService::client`]) after the request's part
    /// that `bytes` ends with.
    fn identity(
        &self,
        domain: &str,
        d: &Descriptor<'_>,
        found: Option<Found>,
        salt: Option<&str>,
        bytes: &mut Vec<u8>,
    ) {
        let mut part = |s: &[u8]| put_part(bytes, s);
        let shared = found.map_or(0, |f| f.shared);
        for (n, e) in d.entries.iter().enumerate() {
            part(e.key.as_bytes());
            let pattern = if n < 64 && shared >> n & 1 == 1 {
                self.inner.config.shared_pattern(domain, d.pairs(), n)
            } else {
                None
            };
            match pattern {
                // The marker is not UTF-8, so no request value (a string) can stand where
                // it does: a pattern never hashes like a request value equal to it.
                Some(p) => {
                    part(b"\xff*share");
                    part(p.as_bytes());
                }
                None => part(e.value.as_bytes()),
            }
        }
        if let Some(s) = salt {
            part(s.as_bytes());
        }
    }

    /// The policy of a request's limit override: the matched rule's algorithm (fixed_window
    /// when none matched) with the override's quota, kept for later requests up to a bound.
    fn override_policy(
        &self,
        domain: &str,
        rule: Option<usize>,
        o: &Override,
    ) -> Result<(Policy, Current<'_>, String), Status> {
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
        let current = Current {
            name: configured.map_or("", |r| r.name.as_str()),
            requests_per_unit: o.requests_per_unit,
            unit: unit.proto(),
            written: &[],
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
                settle: false,
            })
            .map_err(|e| Status::invalid_argument(format!("invalid limit override: {e}")))?;
        cache.insert(key, policy.clone());
        Ok((policy, current, salt))
    }

    fn respond<'s>(
        &'s self,
        req: &RlsRequest<'_>,
        found: &[Option<Found>],
        a: &Answer<'_, 's>,
    ) -> Result<Decided<'s>, Status> {
        let i = &self.inner;
        let result = a.result;
        let overall = match result.action {
            Action::Unavailable { .. } => {
                return Err(Status::unavailable(
                    "the rate limit store is unavailable and a matched rule fails closed",
                ))
            }
            _ if a.blocked => Code::OverLimit,
            Action::Allow => Code::Ok,
            Action::Limit { .. } => Code::OverLimit,
        };
        // Each item's result: the limiter answers in plan order, so the next unmatched result
        // is nearly always the one; a search only when it is not.
        let mut next = 0;
        let by_item: smallvec::SmallVec<[Option<&tollgate::PolicyResult>; 16]> = a
            .policies
            .iter()
            .map(|p| match result.results.get(next) {
                Some(r) if r.policy.is(p) => {
                    next += 1;
                    Some(r)
                }
                _ => result.results.iter().find(|r| r.policy.is(p)),
            })
            .collect();
        let mut statuses = Vec::with_capacity(a.slots.len());
        // Which descriptors passed, with the rule whose metadata they pass on: only for the
        // dynamic metadata (no allocation otherwise).
        let with_metadata = i.options.dynamic_metadata;
        let mut passed: Vec<Option<usize>> = Vec::new();
        for (n, slot) in a.slots.iter().enumerate() {
            let (status, outcome, meta) = match slot {
                Slot::NoLimit => (
                    DescriptorAnswer {
                        code: Code::Ok.into(),
                        current: None,
                        remaining: 0,
                        reset: None,
                    },
                    None,
                    Some(None),
                ),
                Slot::Unlimited => (
                    DescriptorAnswer {
                        code: Code::Ok.into(),
                        current: None,
                        remaining: UNLIMITED_REMAINING,
                        reset: None,
                    },
                    None,
                    None,
                ),
                Slot::Blocked {
                    current,
                    unit,
                    shadow,
                    metadata,
                    ..
                } => {
                    let own_shadow = *shadow && !i.options.shadow_mode;
                    let code = if own_shadow {
                        Code::Ok
                    } else {
                        Code::OverLimit
                    };
                    let status = DescriptorAnswer {
                        code: code.into(),
                        current: Some(*current),
                        remaining: 0,
                        reset: Some(proto_duration(until_window_end(*unit, i.limiter.now()))),
                    };
                    let outcome = if *shadow {
                        Outcome::ShadowLimited
                    } else {
                        Outcome::Limited
                    };
                    (status, Some(outcome), own_shadow.then_some(*metadata))
                }
                Slot::NothingToGive { current } => (
                    DescriptorAnswer {
                        code: Code::Ok.into(),
                        current: Some(*current),
                        remaining: 0,
                        reset: None,
                    },
                    None,
                    None,
                ),
                Slot::Item(k) => {
                    let it = &a.items[*k];
                    let r = by_item[*k];
                    let outcome = r.map(|r| r.outcome);
                    let over = !it.negative
                        && match outcome {
                            Some(Outcome::Limited | Outcome::FallbackLimited) => true,
                            // Shadow under the global shadow mode only: reported over, never
                            // denied (envoyproxy's global shadow changes only the overall code).
                            Some(Outcome::ShadowLimited) => !it.rule_shadow,
                            _ => false,
                        };
                    let status = match r.and_then(|r| r.decision) {
                        Some(d) => DescriptorAnswer {
                            code: if over { Code::OverLimit } else { Code::Ok }.into(),
                            current: Some(it.current),
                            remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
                            reset: Some(proto_duration(d.reset_after)),
                        },
                        // The store did not answer and the rule failed open: nothing was
                        // charged and nothing is known to be used.
                        None => DescriptorAnswer {
                            code: if over { Code::OverLimit } else { Code::Ok }.into(),
                            current: Some(it.current),
                            remaining: it.current.requests_per_unit,
                            reset: None,
                        },
                    };
                    (status, outcome, (!over).then_some(it.rule))
                }
            };
            if let (Some(outcome), Some(f)) = (outcome, found[n]) {
                let rule = &i.config.rules()[f.rule];
                if rule.detailed_metric || rule.value_to_metric {
                    let d = &req.descriptors[n];
                    let entries: Vec<(&str, &str)> = d.pairs().collect();
                    if let Some(key) = i.config.metric_key(req.domain, &entries) {
                        i.metrics.record(&key, outcome);
                    }
                }
            }
            if let (Some(m), true) = (meta, with_metadata) {
                passed.push(m);
            }
            statuses.push(status);
        }
        let mut headers = AddedHeaders::default();
        if i.options.response_headers {
            headers.reserve_for(a.policies.len());
            self.headers(a, &mut headers);
        }
        let dynamic_metadata = with_metadata.then(|| self.dynamic_metadata(req, &passed));
        Ok(Decided {
            overall_code: overall.into(),
            statuses,
            headers,
            rest: RateLimitResponse {
                dynamic_metadata,
                ..Default::default()
            },
        })
    }

    /// RateLimit-Policy, RateLimit and Retry-After for Envoy to add to the response, each
    /// value written straight into the answer's bytes. A blocked descriptor that denied is
    /// the most constrained: it leads, with nothing remaining and no Retry-After (waiting
    /// never helps).
    fn headers(&self, a: &Answer<'_, '_>, out: &mut AddedHeaders) {
        let blocked = a.blocked.then(|| {
            a.slots.iter().find_map(|s| match s {
                Slot::Blocked {
                    current,
                    unit,
                    shadow: false,
                    ..
                } => Some((current, *unit)),
                _ => None,
            })
        });
        let result = a.result;
        if let Some(Some((current, unit))) = blocked {
            let name = if current.name.is_empty() {
                "blocked"
            } else {
                current.name
            };
            let name = tollgate::headers::sf_string(name);
            out.push("ratelimit-policy", |v| {
                v.extend_from_slice(name.as_bytes());
                v.extend_from_slice(b";q=0;w=");
                tollgate::headers::write_u64(v, unit.seconds());
                let own = v.len();
                v.extend_from_slice(b", ");
                if !tollgate::headers::write_ratelimit_policy(result, v) {
                    v.truncate(own);
                }
                true
            });
            out.push("ratelimit", |v| {
                v.extend_from_slice(name.as_bytes());
                v.extend_from_slice(b";r=0;t=");
                tollgate::headers::write_u64(
                    v,
                    until_window_end(unit, self.inner.limiter.now())
                        .as_secs()
                        .max(1),
                );
                true
            });
            return;
        }
        let advertised = tollgate::headers::Advertised::of(result);
        out.push("ratelimit-policy", |v| advertised.write_policy(v));
        out.push("ratelimit", |v| advertised.write_ratelimit(v).is_some());
        if let (
            Action::Limit {
                retry_after: Some(wait),
            },
            false,
        ) = (result.action, a.blocked)
        {
            out.push("retry-after", |v| {
                tollgate::headers::write_u64(v, tollgate::headers::retry_after_secs(wait));
                true
            });
        }
    }

    /// envoyproxy/ratelimit's response dynamic metadata: the domain, every descriptor (its
    /// entries as `key=value`, its limit override, its hits), the request's hits, and the
    /// configured `metadata` of the rules of the descriptors that passed, merged.
    fn dynamic_metadata(
        &self,
        req: &RlsRequest<'_>,
        passed: &[Option<usize>],
    ) -> prost_types::Struct {
        use prost_types::value::Kind;
        let text = |s: String| prost_types::Value {
            kind: Some(Kind::StringValue(s)),
        };
        let number = |n: f64| prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        };
        let descriptors = req
            .descriptors
            .iter()
            .map(|d| {
                let mut fields = std::collections::BTreeMap::new();
                let entries = d
                    .entries
                    .iter()
                    .map(|e| text(format!("{}={}", e.key, e.value)))
                    .collect();
                fields.insert(
                    "entries".to_string(),
                    prost_types::Value {
                        kind: Some(Kind::ListValue(prost_types::ListValue { values: entries })),
                    },
                );
                if let Some(o) = d.limit {
                    let unit = Unit::from_proto(o.unit)
                        .map_or_else(|| "UNKNOWN".to_string(), |u| u.name().to_uppercase());
                    fields.insert(
                        "limit".to_string(),
                        text(format!(
                            "requests_per_unit:{} unit:{unit}",
                            o.requests_per_unit
                        )),
                    );
                }
                if let Some(h) = d.hits_addend {
                    fields.insert("hitsAddend".to_string(), number(h as f64));
                }
                prost_types::Value {
                    kind: Some(Kind::StructValue(prost_types::Struct { fields })),
                }
            })
            .collect();
        let mut fields = std::collections::BTreeMap::new();
        fields.insert("domain".to_string(), text(req.domain.to_string()));
        fields.insert(
            "descriptors".to_string(),
            prost_types::Value {
                kind: Some(Kind::ListValue(prost_types::ListValue {
                    values: descriptors,
                })),
            },
        );
        if req.hits_addend != 0 {
            fields.insert("hitsAddend".to_string(), number(f64::from(req.hits_addend)));
        }
        let mut merged = prost_types::Struct::default();
        let rules = self.inner.config.rules();
        for meta in passed
            .iter()
            .flatten()
            .filter_map(|&r| rules[r].metadata.as_ref())
        {
            crate::config::merge_metadata(&mut merged, meta);
        }
        if !merged.fields.is_empty() {
            fields.insert(
                "metadata".to_string(),
                prost_types::Value {
                    kind: Some(Kind::StructValue(merged)),
                },
            );
        }
        prost_types::Struct { fields }
    }
}

/// A decided request, as [`RlsService::respond`] reads it.
struct Answer<'a, 'c> {
    slots: &'a [Slot<'c>],
    items: &'a [Item<'c>],
    policies: &'a [Cow<'a, Policy>],
    result: &'a LimitResult,
    /// A blocked descriptor denied the request.
    blocked: bool,
}

/// How long from `now` (since the Unix epoch: the limiter's clock) until the current window
/// of `unit` ends (windows aligned to the epoch, as envoyproxy/ratelimit's fixed windows are).
fn until_window_end(unit: Unit, now: std::time::Duration) -> std::time::Duration {
    let len = unit.seconds().max(1);
    std::time::Duration::from_secs(len - now.as_secs() % len).saturating_sub(
        std::time::Duration::from_nanos(u64::from(now.subsec_nanos())),
    )
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
    use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use std::time::Duration;
    use tollgate::quota::Quota;
    use tollgate::{Backend, IdentityHasher, Limiter, LimiterConfig};

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

    #[test]
    fn a_full_override_cache_evicts_the_oldest_eighth_at_once() {
        // A request with hundreds of new quotas must not scan the cache once per quota.
        let mut c = OverrideCache::new(64);
        for n in 1..=64 {
            c.insert(key(n), n);
        }
        assert_eq!(c.get(&key(1)), Some(1), "1 is the most recently used now");
        c.insert(key(65), 65);
        assert_eq!(c.len(), 57, "8 gone in one pass");
        assert_eq!(c.get(&key(1)), Some(1));
        assert_eq!(c.get(&key(2)), None, "2..=9 were the oldest");
        assert_eq!(c.get(&key(9)), None);
        assert_eq!(c.get(&key(10)), Some(10));
        for n in 66..=72 {
            c.insert(key(n), n);
        }
        assert_eq!(c.len(), 64, "no eviction until full again");
    }

    const YAML: &str = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n  - key: b\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n";

    /// A whole minute (1.8e9 s since the epoch).
    const T0: u64 = 1_800_000_000_000_000;

    /// `YAML` served from the memory store on a clock that stands still at [`T0`]: its rules
    /// are fixed windows of a minute (the default algorithm), and on the system clock a minute
    /// turning between a test's two answers (one charged, the next refused) would let the
    /// second in.
    fn service() -> RlsService {
        service_on(YAML, Arc::new(tollgate::clock::ManualClock::new(T0)))
    }

    /// `yaml` served from the memory store on `clock`.
    fn service_on(yaml: &str, clock: Arc<tollgate::clock::ManualClock>) -> RlsService {
        let limiter = Limiter::new(LimiterConfig {
            clock,
            ..LimiterConfig::new(Backend::default())
        });
        let config = crate::config::load_str([("test.yaml", yaml)]).expect("yaml");
        RlsService::new(
            limiter,
            IdentityHasher::new(b"s"),
            config,
            RlsOptions::default(),
        )
        .expect("service")
    }

    /// A blocked descriptor's reset is the end of its epoch-aligned window on the limiter's
    /// clock, not the machine's: in its status and in the `RateLimit` header. (On the system
    /// clock the minute's end would be anywhere.)
    #[tokio::test]
    async fn a_blocked_descriptors_reset_is_on_the_limiters_clock() {
        let clock = Arc::new(tollgate::clock::ManualClock::new(T0));
        let yaml = "domain: edge\ndescriptors:\n  - key: banned\n    rate_limit:\n      unit: minute\n      requests_per_unit: 0\n";
        let s = service_on(yaml, clock.clone());
        let message = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(&[("banned", "x")])],
            hits_addend: 0,
        };
        for (after, reset, header) in [
            (0, 60_000_000, "t=60"),
            (10_250_000, 49_750_000, "t=49"),
            (59_999_999, 1, "t=1"),
            (60_000_000, 60_000_000, "t=60"),
        ] {
            clock.set(T0 + after);
            let answer = s.decide(&message).await.expect("decided");
            assert_eq!(answer.overall_code, i32::from(Code::OverLimit), "{after}");
            let d = answer.statuses[0].duration_until_reset.expect("a reset");
            let micros = u64::try_from(d.seconds).expect("seconds") * 1_000_000
                + u64::try_from(d.nanos).expect("nanos") / 1_000;
            assert_eq!(micros, reset, "{after}");
            let value = answer
                .response_headers_to_add
                .iter()
                .find(|h| h.key == "ratelimit")
                .map(|h| h.value.as_str())
                .expect("a RateLimit header");
            assert!(value.ends_with(header), "{after}: {value}");
        }
    }

    fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: pairs
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Each descriptor's identity is the request's part and its own, whatever came before it
    /// in the request: the key `client_key("rls", parts)` gives, and a descriptor counts the
    /// same client alone as behind another.
    #[tokio::test]
    async fn a_descriptors_identity_does_not_depend_on_the_ones_before_it() {
        let s = service();
        let message = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                descriptor(&[("a", "a long value of the first descriptor")]),
                descriptor(&[("b", "y")]),
            ],
            hits_addend: 0,
        };
        let req = RlsRequest::of(&message);
        let mut key = IdentityBytes::new(req.domain, 0);
        let keys: Vec<ClientKey> = req
            .descriptors
            .iter()
            .map(|d| s.client(req.domain, d, None, None, &mut key))
            .collect();
        // Written here as the key's layout is, not with `put_part`: a change to how a part
        // is written (and so to every client's Redis key) fails this test.
        let parts = |k: &str, v: &str| {
            let mut b = Vec::new();
            for p in ["edge", k, v] {
                b.extend_from_slice(&(p.len() as u64).to_le_bytes());
                b.extend_from_slice(p.as_bytes());
            }
            b
        };
        let hasher = IdentityHasher::new(b"s");
        assert_eq!(
            keys,
            [
                hasher.client_key("rls", &parts("a", "a long value of the first descriptor")),
                hasher.client_key("rls", &parts("b", "y")),
            ]
        );
        // b=y, 1 a minute: charged behind a=..., then refused alone.
        let both = s.decide(&message).await.expect("decided");
        assert_eq!(both.overall_code, i32::from(Code::Ok));
        let alone = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(&[("b", "y")])],
            hits_addend: 0,
        };
        let again = s.decide(&alone).await.expect("decided");
        assert_eq!(again.overall_code, i32::from(Code::OverLimit));
    }

    /// Each descriptor's rule, as `decide_request` finds them.
    fn found(s: &RlsService, req: &RlsRequest<'_>) -> Vec<Option<Found>> {
        let domain = s.inner.config.level(req.domain);
        req.descriptors
            .iter()
            .map(|d| s.rule_of(domain, d))
            .collect::<Result<_, _>>()
            .expect("found")
    }

    /// A request of many descriptors hashes their keys together where the processor can
    /// (`IdentityHasher::hashes_together`): each key is the one its descriptor's identity
    /// gives alone, in its own place, whatever the mix around it (identities of one block,
    /// of two, past a chunk; no rule; an override, which hashes in place with its quota).
    #[tokio::test]
    async fn keys_hashed_together_are_each_descriptors_own() {
        let s = service();
        let two_blocks = "m".repeat(70);
        let past_a_chunk = "v".repeat(2000);
        let mut message = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                descriptor(&[("a", "1")]),
                descriptor(&[("no rule", "x")]),
                descriptor(&[("a", &two_blocks)]),
                descriptor(&[("b", "y")]),
                descriptor(&[("a", "overridden")]),
                descriptor(&[("a", &past_a_chunk)]),
                descriptor(&[("a", "2")]),
                descriptor(&[("b", "z")]),
                descriptor(&[("a", "3")]),
                descriptor(&[("b", &two_blocks)]),
            ],
            hits_addend: 0,
        };
        message.descriptors[4].limit = Some(
            crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
                requests_per_unit: 5,
                unit: 2,
            },
        );
        let req = RlsRequest::of(&message);
        let found = found(&s, &req);
        let (known, mut key) = s.keys_together(&req, &found, &[]);
        if !s.inner.hasher.hashes_together(req.descriptors.len()) {
            assert!(known.of.is_empty(), "keys are hashed in place here");
            return;
        }
        assert_eq!(
            known.of[..],
            [0, 2, 3, 5, 6, 7, 8, 9],
            "no rule and the override hash in place"
        );
        let mut known = known;
        for (n, d) in req.descriptors.iter().enumerate() {
            let hashed = known.of.contains(&n);
            let together = known.take(n);
            if hashed {
                let alone = s.client(req.domain, d, found[n], None, &mut key);
                assert_eq!(together, Some(alone), "descriptor {n}");
            } else {
                assert_eq!(together, None, "descriptor {n}");
            }
        }
        // A rule replaced by another's is not counted: no key for it.
        let replaced = found[3].map(|f| f.rule).into_iter().collect::<Vec<_>>();
        let (known, _) = s.keys_together(&req, &found, &replaced);
        assert_eq!(known.of[..], [0, 2, 5, 6, 8]);
        // A request of two descriptors hashes in place.
        let two = RateLimitRequest {
            domain: "edge".into(),
            descriptors: message.descriptors[..2].to_vec(),
            hits_addend: 0,
        };
        let req = RlsRequest::of(&two);
        assert!(s.keys_together(&req, &found[..2], &[]).0.of.is_empty());
    }

    /// A hostile request's most descriptors, of sizes that break every run of lanes (one
    /// block, two, past a chunk, in turns): every key is still its descriptor's own, and the
    /// gathered identities take the request's bytes, not a multiple of them. Under an unknown
    /// domain nothing is gathered.
    #[tokio::test]
    async fn the_most_descriptors_of_mixed_sizes_hash_as_alone() {
        let s = service();
        let sizes = [3, 70, 1500, 40, 40, 40, 200];
        let values: Vec<String> = (0..MAX_DESCRIPTORS)
            .map(|n| format!("{n:04}{}", "x".repeat(sizes[n % sizes.len()])))
            .collect();
        let message = RateLimitRequest {
            domain: "edge".into(),
            descriptors: values.iter().map(|v| descriptor(&[("a", v)])).collect(),
            hits_addend: 0,
        };
        let req = RlsRequest::of(&message);
        let found = found(&s, &req);
        let (mut known, key) = s.keys_together(&req, &found, &[]);
        if s.inner.hasher.hashes_together(MAX_DESCRIPTORS) {
            assert_eq!(known.of.len(), MAX_DESCRIPTORS);
            let values: usize = values.iter().map(String::len).sum();
            // Each identity: the request's part (about 30 bytes), the entry's two lengths and
            // key, and its value.
            assert!(
                key.bytes.len() <= values + MAX_DESCRIPTORS * 64 + 32,
                "{} bytes gathered for {values} of values",
                key.bytes.len()
            );
        }
        let mut alone = IdentityBytes::new(req.domain, 1);
        for (n, d) in req.descriptors.iter().enumerate() {
            let together = known.take(n);
            if !known.of.is_empty() {
                let own = s.client(req.domain, d, found[n], None, &mut alone);
                assert_eq!(together, Some(own), "descriptor {n}");
            }
        }
        let unknown = RateLimitRequest {
            domain: "not configured".into(),
            ..message.clone()
        };
        let req = RlsRequest::of(&unknown);
        let found = vec![None; req.descriptors.len()];
        assert!(s.keys_together(&req, &found, &[]).0.of.is_empty());
        let answer = s.decide(&unknown).await.expect("decided");
        assert_eq!(answer.overall_code, i32::from(Code::Ok));
        assert_eq!(answer.statuses.len(), MAX_DESCRIPTORS);
    }

    /// Ten descriptors of a rule of one a minute, every value its own client: all charged
    /// together once, then each refused alone and an eleventh value still allowed.
    #[tokio::test]
    async fn ten_descriptors_count_ten_clients() {
        let s = service();
        let values: Vec<String> = (0..10).map(|n| format!("client-{n:04}-of-ten")).collect();
        let message = RateLimitRequest {
            domain: "edge".into(),
            descriptors: values.iter().map(|v| descriptor(&[("b", v)])).collect(),
            hits_addend: 0,
        };
        let first = s.decide(&message).await.expect("decided");
        assert_eq!(first.overall_code, i32::from(Code::Ok));
        for v in values.iter().map(String::as_str).chain(["another"]) {
            let alone = RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![descriptor(&[("b", v)])],
                hits_addend: 0,
            };
            let code = s.decide(&alone).await.expect("decided").overall_code;
            let want = if v == "another" {
                Code::Ok
            } else {
                Code::OverLimit
            };
            assert_eq!(code, i32::from(want), "{v}");
        }
    }
}
