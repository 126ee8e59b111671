//! What an operator does to one client, outside the request path: read its state under a
//! policy without charging it, and reset it.

use crate::metrics::StoreErrorKind;
use crate::store::StoreFailure;
use crate::{ClientKey, Decision, Limiter, Policy};
use std::time::Duration;
use tollgate_core::{micros_to_duration, Check};

/// The least time an operator's store call is given (the request path's `store.timeout` is
/// sized for traffic, not for an occasional call that must not fail on a busy store).
const OPERATOR_TIMEOUT: Duration = Duration::from_secs(1);

/// A store call of an operator that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the store failed ({kind}): {message}")]
pub struct StoreUnavailable {
    /// The `tollgate_store_errors_total` kind it would count as.
    pub kind: StoreErrorKind,
    /// What went wrong.
    pub message: String,
}

impl From<StoreFailure> for StoreUnavailable {
    fn from(f: StoreFailure) -> Self {
        Self {
            kind: f.kind,
            message: f.message,
        }
    }
}

/// A client's state under one policy, as [`Limiter::peek`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientState {
    /// The store's answer to a request of no cost: the limit, what remains, when the state is
    /// full again (a client never seen reads as full).
    pub decision: Decision,
    /// How long this process's deny cache still answers 429 for the client without asking the
    /// store.
    pub denied_here_for: Option<Duration>,
}

impl Limiter {
    /// Reads `client`'s state under `policy` without charging it (a check of cost 0, which
    /// creates no state). Not behind the breaker and not counted in the metrics: it is an
    /// operator's call, not traffic.
    pub async fn peek(
        &self,
        client: &ClientKey,
        policy: &Policy,
    ) -> Result<ClientState, StoreUnavailable> {
        let i = &self.inner;
        let now = i.clock.now();
        let check = [Check::new(*client, policy.rule(), 0)];
        let timeout = i.timeout.max(OPERATOR_TIMEOUT);
        let verdict = i.store.check(&check, now, timeout).await?;
        let decision = verdict
            .decisions
            .first()
            .copied()
            .map(Decision::from)
            .ok_or_else(|| StoreUnavailable {
                kind: StoreErrorKind::Protocol,
                message: "the store answered no decision".to_string(),
            })?;
        let denied_here_for = i
            .deny_cache
            .as_ref()
            .and_then(|c| c.peek(client, policy.inner.deny_key, now))
            .map(|until| micros_to_duration(until - now));
        Ok(ClientState {
            decision,
            denied_here_for,
        })
    }

    /// Resets `client` under `policy`: its state in the store and in the local fallback, its
    /// deny-cache entry and its local lease (whose units are dropped, not given back: the state
    /// they came from is gone). Its next request starts from a full quota. Whether the store
    /// held a state. Another gateway's deny cache may still answer 429 until the retry time it
    /// saw (at most that long).
    pub async fn reset(
        &self,
        client: &ClientKey,
        policy: &Policy,
    ) -> Result<bool, StoreUnavailable> {
        let i = &self.inner;
        let forget = || {
            if let Some(cache) = &i.deny_cache {
                cache.forget(client, policy.inner.deny_key);
            }
            if let Some(last) = &i.last {
                last.forget(client, policy.inner.deny_key);
            }
        };
        forget();
        if let Some(leases) = &i.leases {
            leases.forget(client, policy.rule().id());
        }
        i.fallback.remove(client, policy.fallback_rule());
        let timeout = i.timeout.max(OPERATOR_TIMEOUT);
        let had = i.store.reset(client, policy.rule(), timeout).await?;
        // Again: a request the store decided before the reset may have remembered its denial
        // since.
        forget();
        Ok(had)
    }
}
