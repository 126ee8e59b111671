//! Validated config -> the objects that serve it: the limiter over its store, the rate-limit
//! layer with every policy, tier and override registered, and the Envoy rate limit service.
//!
//! Everything here is built from values `tollgate-config` already checked with the library's
//! own rules (`PolicySpec::validate`), so a config that `check-config` accepts assembles: the
//! errors below can only be a bug, and a test holds that over the config fuzz corpus.

use crate::config::{Config, StoreBackend};
use tollgate::store::{MemoryConfig, RedisConfig, StoreClock};
use tollgate::{Backend, ClientKey, Limiter, LimiterConfig, Policy, PolicySpec};
use tollgate_rls::RlsService;
use tollgate_tower::{RateLimitLayer, RoutedPolicy};

/// Builds the limiter described by `config` (not yet connected to a shared store).
pub fn limiter(config: &Config) -> Limiter {
    let s = &config.store;
    let clock = if s.clock_local {
        StoreClock::Local
    } else {
        StoreClock::Store
    };
    let redis = |c: RedisConfig| {
        Backend::Redis(
            c.with_key_prefix(s.key_prefix.clone())
                .with_clock(clock)
                .with_max_batch(s.max_batch),
        )
    };
    let backend = match &s.backend {
        StoreBackend::Memory { max_keys } => Backend::Memory(MemoryConfig {
            max_keys: *max_keys,
            ..MemoryConfig::default()
        }),
        StoreBackend::Redis { url } => redis(RedisConfig::standalone(url.clone())),
        StoreBackend::RedisCluster { urls } => redis(RedisConfig::cluster(urls.clone())),
        StoreBackend::RedisSentinel { urls, master_name } => {
            redis(RedisConfig::sentinel(urls.clone(), master_name.clone()))
        }
    };
    let mut lc = LimiterConfig::new(backend);
    lc.timeout = s.timeout;
    lc.breaker = s.breaker;
    Limiter::new(lc)
}

/// One policy's rules as the admin API reads them: the policy's own, its tiers', and its
/// overrides'.
pub struct PolicyRules {
    /// The policy's own rule (clients in no tier).
    pub policy: Policy,
    /// `(tier name, rule)`.
    pub tiers: Vec<(String, Policy)>,
    /// `(client, rule)`.
    pub overrides: Vec<(ClientKey, Policy)>,
}

/// What one config assembles into over a limiter.
pub struct Assembled {
    /// The HTTP rate-limit layer.
    pub layer: RateLimitLayer,
    /// The rules of each policy, by policy name (in config order).
    pub rules: Vec<(String, PolicyRules)>,
    /// The Envoy rate limit service of `[rls]`.
    pub rls: Option<RlsService>,
}

/// Registers every rule of `config` with `limiter` and builds what serves them.
pub fn assemble(config: &Config, limiter: &Limiter) -> Result<Assembled, tollgate::Error> {
    let (layer, rules) = layer(config, limiter)?;
    let rls = rls_service(config, limiter)?;
    Ok(Assembled { layer, rules, rls })
}

fn layer(
    config: &Config,
    limiter: &Limiter,
) -> Result<(RateLimitLayer, Vec<(String, PolicyRules)>), tollgate::Error> {
    let mut rules = Vec::with_capacity(config.policies.len());
    let mut layer = RateLimitLayer::new(limiter.clone(), config.hasher.clone())
        .identity(config.identity.clone())
        .forward_auth(
            config
                .decision_mode()
                .then(|| config.server.forward_auth.clone()),
        )
        .allow_ambiguous_paths(config.server.allow_ambiguous_paths);
    let register = |spec: &PolicySpec| limiter.policy(spec.clone());
    for p in &config.policies {
        let own = register(&p.spec)?;
        let mut routed = RoutedPolicy::new(own.clone())
            .path_prefix(p.path_prefix.clone())
            .methods(p.methods.clone())
            .case_insensitive(p.case_insensitive)
            .costs(p.costs.clone());
        if let Some(sources) = &p.identity {
            routed = routed.identity(sources.clone());
        }
        let mut tiers = Vec::new();
        if let Some(source) = &p.tier {
            for t in &p.tiers {
                tiers.push((t.name.clone(), register(&t.spec)?));
            }
            routed = routed.tiers(source.clone(), tiers.clone());
        }
        let mut overrides = Vec::new();
        for o in config.overrides.iter().filter(|o| o.policy == p.name()) {
            overrides.push((o.client, register(&o.spec)?));
        }
        if !overrides.is_empty() {
            routed = routed.overrides(overrides.clone());
        }
        layer = layer.policy(routed);
        rules.push((
            p.name().to_string(),
            PolicyRules {
                policy: own,
                tiers,
                overrides,
            },
        ));
    }
    Ok((layer, rules))
}

fn rls_service(config: &Config, limiter: &Limiter) -> Result<Option<RlsService>, tollgate::Error> {
    let Some(rls) = &config.rls else {
        return Ok(None);
    };
    let service = RlsService::new(
        limiter.clone(),
        config.hasher.clone(),
        rls.config.clone(),
        rls.options,
    )?;
    Ok(Some(service))
}
