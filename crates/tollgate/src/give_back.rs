//! Giving back units of a charge nothing recorded (shared/DESIGN.md "Costs known later"):
//! Envoy's `is_negative_hits` undoes hits charged by an earlier call, and holds no id of it.
//! [`Limiter::give_back`] gives each plan item's cost back to its client's state
//! ([`tollgate_core::Limit::give_back`]: never below a fresh state, never more than the state
//! holds), then answers with each state as it is now.
//!
//! Unlike a reservation's settle, which leaves in a batch and is never waited for, a give-back
//! is awaited: its caller (an RLS answer) reports the state after it. It takes the store path
//! settles take (the settle script on Redis, one call per server or slot, behind the
//! client's breaker and under the store timeout); the memory store applies it at once. A
//! give-back that fails gives nothing back (the units stay charged until the state refills
//! or its window ends) and is counted in `tollgate_settle_errors_total{reason="store"}`.

use crate::metrics::SettleError;
use crate::{LimitResult, Limiter, Plan};
use tollgate_core::ClientKey;

impl Limiter {
    /// Gives back each plan item's cost ([`crate::Policy::cost`]) to its client's state under
    /// its policy, then returns each state as a query (cost 0, nothing charged) reads it: its
    /// remaining units and reset, each result under the plan's own policy value (so a caller
    /// finds its items with [`crate::Policy::is`]). Units go back wherever the state holds
    /// them (see [`tollgate_core::Limit::give_back`]); a state holds no more than fresh after
    /// it, whatever the cost. Given-back units count in
    /// `tollgate_settled_units_total{direction="refunded"}` and clear the deny cache's memory
    /// of the client.
    pub async fn give_back(&self, plan: &Plan) -> LimitResult {
        let i = &self.inner;
        let items: Vec<(ClientKey, &tollgate_core::Rule, u64)> = plan
            .iter()
            .filter(|(_, p)| p.cost() > 0)
            .map(|(c, p)| (*c, p.rule(), p.cost()))
            .collect();
        let policies: Vec<&crate::Policy> = plan
            .iter()
            .filter(|(_, p)| p.cost() > 0)
            .map(|(_, p)| p)
            .collect();
        if let Some(first) = items.first() {
            let now = i.clock.now();
            let result = if i.store.is_remote() {
                self.guarded(&first.0, now, i.store.give_back(&items, now, i.timeout))
                    .await
                    .ok()
            } else {
                i.store.give_back(&items, now, i.timeout).await.ok()
            };
            for (k, (client, p)) in items.iter().map(|it| it.0).zip(&policies).enumerate() {
                match result.as_ref().and_then(|v| v.get(k).copied()) {
                    Some(units) => {
                        p.inner.stats.settled(units, 0);
                        if units > 0 {
                            self.forget_denial(&client, p);
                        }
                    }
                    None => p.inner.stats.settle_error(SettleError::Store),
                }
            }
        }
        self.query(plan).await
    }

    /// Units went back: a denial remembered for this client may pass sooner.
    fn forget_denial(&self, client: &ClientKey, p: &crate::Policy) {
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(client, p.inner.deny_key);
        }
        if let Some(last) = &self.inner.last {
            last.forget(client, p.inner.deny_key);
        }
    }

    /// `plan` checked at cost 0 (nothing charged), each result under the plan's own policy.
    async fn query(&self, plan: &Plan) -> LimitResult {
        let mut probe = Plan::new();
        let mut originals = Vec::with_capacity(plan.len());
        for (c, p) in plan.iter() {
            let q = p.with_cost(0);
            originals.push((q.clone(), p.clone()));
            probe.push(*c, q);
        }
        let mut result = self.check(&probe).await;
        for r in &mut result.results {
            if let Some((_, own)) = originals.iter().find(|(q, _)| q.is(&r.policy)) {
                r.policy = own.clone();
            }
        }
        result
    }
}
