//! `[store]`: which backend, where it is, and how calls to it fail. Store URLs are checked
//! with the Redis client's own parser (plus a host and port check it leaves out), so a URL
//! that `check-config` accepts is one `serve` can connect with; `${ENV_VAR}` is expanded so
//! passwords can stay out of the file.

use super::error::Reporter;
use super::fields::{duration, expand_env, failure_policy, field, one_of, positive};
use super::raw::RawStore;
use super::{StoreBackend, StoreConfig};
use crate::schema as key;
use std::time::Duration;
use tollgate::policy::FailurePolicy;
use tollgate::store::BreakerConfig;

/// The longest `store.timeout`. A frozen store holds each request that long, and every
/// request meanwhile, until `store.breaker.failures` of them have timed out; past a minute it
/// is a unit typed wrong (`"20m"` for `"20ms"`: twenty minutes), not a store far away.
const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(60);

/// A URL the Redis client can connect with; the error quotes it without its secrets.
fn redis_url(s: &str) -> Result<String, String> {
    match tollgate_redis::check_url(s) {
        Ok(()) => Ok(s.to_string()),
        Err(why) => Err(format!(
            "is not a usable Redis URL: {why}; expected redis://[USER:PASSWORD@]HOST:PORT[/DB] or rediss://..."
        )),
    }
}

pub(super) fn store(
    r: &mut Reporter<'_>,
    raw: RawStore,
    env: &impl Fn(&str) -> Option<String>,
) -> StoreConfig {
    #[derive(Clone, Copy)]
    enum Kind {
        Memory,
        Redis,
        Cluster,
        Sentinel,
    }
    let kind = field(r, key::STORE_BACKEND, &raw.backend, Kind::Memory, |s| {
        one_of(
            s,
            &[
                ("memory", Kind::Memory),
                ("redis", Kind::Redis),
                ("redis-cluster", Kind::Cluster),
                ("redis-sentinel", Kind::Sentinel),
            ],
        )
    });
    let max_keys = field(r, key::STORE_MAX_KEYS, &raw.max_keys, 1_000_000, |v| {
        positive(v, "max_keys").map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    });
    // `${REDIS_PASSWORD}` keeps the password out of the file.
    let url = field(r, key::STORE_URL, &raw.url, None, |s| {
        redis_url(&expand_env(s, env)?).map(Some)
    });
    let mut urls = Vec::new();
    if let Some(list) = &raw.urls {
        for u in list.get_ref() {
            match expand_env(u.get_ref(), env).and_then(|s| redis_url(&s)) {
                Ok(u) => urls.push(u),
                Err(m) => r.at(u.span(), key::STORE_URLS, m),
            }
        }
    }
    let backend = match kind {
        Kind::Memory => StoreBackend::Memory { max_keys },
        Kind::Redis => {
            if let Some(list) = &raw.urls {
                r.at(
                    list.span(),
                    key::STORE_URLS,
                    "is for backends \"redis-cluster\" and \"redis-sentinel\"; backend \"redis\" takes url = \"redis://...\"",
                );
            }
            StoreBackend::Redis {
                url: url.unwrap_or_else(|| "redis://127.0.0.1:6379".to_string()),
            }
        }
        Kind::Cluster => {
            several_urls(
                r,
                &raw,
                "backend \"redis-cluster\" takes urls = [\"redis://...\", ...]",
                "backend \"redis-cluster\" needs urls = [\"redis://HOST:PORT\", ...] with at least one node",
            );
            StoreBackend::RedisCluster { urls }
        }
        Kind::Sentinel => sentinel(r, &raw, urls),
    };
    if !matches!(kind, Kind::Sentinel) {
        if let Some(m) = &raw.master_name {
            r.at(
                m.span(),
                key::STORE_MASTER_NAME,
                "only applies with backend = \"redis-sentinel\"",
            );
        }
    }
    let timeout = field(
        r,
        key::STORE_TIMEOUT,
        &raw.timeout,
        Duration::from_millis(20),
        |s| {
            let d = duration(s)?;
            if d > MAX_STORE_TIMEOUT {
                return Err(format!(
                    "is longer than a request may wait for the store (at most {}s); \
                     \"m\" is minutes, \"ms\" milliseconds",
                    MAX_STORE_TIMEOUT.as_secs()
                ));
            }
            Ok(d)
        },
    );
    let key_prefix = field(
        r,
        key::STORE_KEY_PREFIX,
        &raw.key_prefix,
        "tollgate".to_string(),
        |s| {
            if s.is_empty() || s.contains(['{', '}']) || s.chars().any(char::is_whitespace) {
                Err(
                    "is not allowed; expected a non-empty prefix without braces or spaces"
                        .to_string(),
                )
            } else {
                Ok(s.clone())
            }
        },
    );
    let clock_local = field(r, key::STORE_CLOCK, &raw.clock, false, |s| {
        one_of(s, &[("store", false), ("local", true)])
    });
    let on_failure = field(
        r,
        key::STORE_ON_FAILURE,
        &raw.on_failure,
        FailurePolicy::Open,
        |s| failure_policy(s),
    );
    let local_divisor = field(r, key::STORE_LOCAL_DIVISOR, &raw.local_divisor, 20, |v| {
        positive(v, "local_divisor")
    });
    let max_batch = field(
        r,
        key::STORE_MAX_BATCH,
        &raw.max_batch,
        tollgate_redis::DEFAULT_MAX_BATCH,
        |v| max_batch(*v),
    );
    let mut breaker = BreakerConfig {
        failures: 5,
        open_for: Duration::from_secs(1),
    };
    if let Some(b) = &raw.breaker {
        let b = b.get_ref();
        breaker.failures = field(r, key::STORE_BREAKER_FAILURES, &b.failures, 5, |v| {
            positive(v, "failures").and_then(|n| {
                u32::try_from(n).map_err(|_| "failures must be at most 4294967295".to_string())
            })
        });
        breaker.open_for = field(
            r,
            key::STORE_BREAKER_OPEN_FOR,
            &b.open_for,
            breaker.open_for,
            |s| duration(s),
        );
    }
    StoreConfig {
        backend,
        timeout,
        key_prefix,
        clock_local,
        on_failure,
        local_divisor,
        max_batch,
        breaker,
    }
}

/// `store.max_batch`: 1 (one plan per script call) to `tollgate_redis::MAX_BATCH`.
fn max_batch(v: i64) -> Result<usize, String> {
    let max = tollgate_redis::MAX_BATCH;
    usize::try_from(v)
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("must be an integer from 1 (one plan per script call) to {max}"))
}

/// A backend of several nodes refuses `url` (`takes` says what it wants instead) and needs
/// `urls` with at least one node (`needs` says so, at the `backend` key).
fn several_urls(r: &mut Reporter<'_>, raw: &RawStore, takes: &str, needs: &str) {
    if let Some(u) = &raw.url {
        r.at(u.span(), key::STORE_URL, takes);
    } else if raw.urls.as_ref().is_none_or(|l| l.get_ref().is_empty()) {
        let backend_span = raw.backend.as_ref().map_or(0..0, |b| b.span());
        r.at(backend_span, key::STORE_URLS, needs);
    }
}

fn sentinel(r: &mut Reporter<'_>, raw: &RawStore, urls: Vec<String>) -> StoreBackend {
    let backend_span = raw.backend.as_ref().map_or(0..0, |b| b.span());
    several_urls(
        r,
        raw,
        "backend \"redis-sentinel\" takes urls = [\"redis://SENTINEL:26379\", ...] (the sentinels)",
        "backend \"redis-sentinel\" needs urls = [\"redis://HOST:26379\", ...] with at least one sentinel",
    );
    let master_name = match &raw.master_name {
        Some(m) if !m.get_ref().is_empty() && !m.get_ref().chars().any(char::is_whitespace) => {
            m.get_ref().clone()
        }
        Some(m) => {
            r.at(
                m.span(),
                key::STORE_MASTER_NAME,
                "is empty or has spaces; expected the name the sentinels monitor (sentinel monitor NAME ...)",
            );
            String::new()
        }
        None => {
            r.at(
                backend_span,
                key::STORE_MASTER_NAME,
                "is missing; backend \"redis-sentinel\" needs the name the sentinels monitor the master under",
            );
            String::new()
        }
    };
    StoreBackend::RedisSentinel { urls, master_name }
}
