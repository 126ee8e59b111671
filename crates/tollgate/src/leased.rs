//! The limiter's side of `sync = "lease"`: deciding leased policies from local leases, calling
//! the store when a lease runs out, giving units back. The lease rules and their error bound
//! are in `lease.rs`.

use crate::lease::{self, Leases, Take};
use crate::metrics::LeaseKind;
use crate::policy::SyncMode;
use crate::store::LeaseCall;
use crate::{Action, Decision, Limiter, Outcome, Policy, PolicyResult};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{duration_to_micros, micros_to_duration, Algorithm, ClientKey, Micros};

impl Limiter {
    /// Whether `p` is decided through leases here (a lease policy on a shared store; on the
    /// memory store leasing would save nothing, so it is exact).
    pub(crate) fn leases(&self, p: &Policy) -> bool {
        matches!(p.sync(), SyncMode::Lease { .. }) && self.inner.leases.is_some()
    }

    pub(crate) fn register_lease_policy(&self, p: &Policy) {
        let mut list = self
            .inner
            .lease_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // The newest registration of a name wins: after a reload changed its quota, expired
        // units go back under the quota they are now counted by.
        list.insert(p);
        drop(list);
        self.start_sweeper();
    }

    /// A background task that gives back expired leases every 50 ms, so unused units return
    /// to the shared state after `lease_ttl` even when the key gets no more requests here.
    /// Without a tokio runtime there is no sweeper: leftovers then go back with the next
    /// lease call of their key, or at shutdown.
    fn start_sweeper(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.sweeper.set(()).is_err() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        handle.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Limiter { inner }.return_leases(false).await;
            }
        });
    }

    /// Gives back the units of expired leases (or of all leases, at shutdown).
    pub(crate) async fn return_leases(&self, all: bool) {
        let Some(leases) = &self.inner.leases else {
            return;
        };
        let now = self.inner.clock.now();
        let drained = leases.drain(now, all);
        if drained.is_empty() {
            return;
        }
        let found: Vec<Option<Policy>> = {
            let list = self
                .inner
                .lease_policies
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            drained.iter().map(|(_, id, _, _)| list.get(*id)).collect()
        };
        for ((client, _, units, window), p) in drained.into_iter().zip(found) {
            // A policy no longer configured: its units stay charged until its window ends.
            let Some(p) = p else {
                continue;
            };
            let call = LeaseCall {
                want: 0,
                need: 0,
                give_back: units,
                window,
            };
            let i = &self.inner;
            let result = self
                .guarded(
                    &client,
                    now,
                    i.store.lease(&client, p.rule(), call, now, i.timeout),
                )
                .await;
            if result.is_ok() {
                lease::count(&p.inner.stats, 0, units);
            }
        }
    }

    /// Decides the leased policies of one request; appends their results and remembers the
    /// units taken (to put back if the request is rejected after all).
    pub(crate) async fn decide_leased(
        &self,
        group: &[(&ClientKey, &Policy)],
        now: Micros,
        results: &mut Vec<PolicyResult>,
        taken: &mut Vec<(ClientKey, Policy, u64)>,
    ) -> Action {
        let mut action = Action::Allow;
        for &(client, p) in group {
            let (SyncMode::Lease { ttl, max }, Some(leases)) = (p.sync(), &self.inner.leases)
            else {
                // `leases()` selected only lease policies on a store with leases.
                continue;
            };
            let (result, a) = self
                .decide_one_leased(client, p, now, ttl, max, leases)
                .await;
            if result.outcome == Outcome::Allowed {
                taken.push((*client, p.clone(), p.cost()));
            }
            results.push(result);
            action = worse(action, a);
        }
        action
    }

    /// Decides one leased policy and counts its outcome.
    async fn decide_one_leased(
        &self,
        client: &ClientKey,
        p: &Policy,
        now: Micros,
        ttl: Duration,
        max: u64,
        leases: &Leases,
    ) -> (PolicyResult, Action) {
        let i = &self.inner;
        let id = p.rule().id();
        let cost = p.cost();
        let limit = p.limit().quota().limit();
        let decided = |allowed: bool, remaining: u64, retry: Option<Micros>| {
            let d = Decision {
                allowed,
                limit,
                remaining,
                reset_after: micros_to_duration(retry.unwrap_or(0)),
                retry_after: if allowed {
                    None
                } else {
                    retry.map(micros_to_duration)
                },
            };
            let outcome = if allowed {
                Outcome::Allowed
            } else {
                Outcome::Limited
            };
            // An admission is counted once the whole plan is decided (`Limiter::check`): a
            // later rule may deny the request, and then this one charged nothing.
            if !allowed {
                p.inner.stats.record(outcome);
            }
            let action = if allowed {
                Action::Allow
            } else {
                Action::limit_micros(retry)
            };
            (
                PolicyResult {
                    policy: p.clone(),
                    outcome,
                    decision: Some(d),
                },
                action,
            )
        };
        let take = leases.take(client, id, cost, now, ttl, max);
        let (give_back, window, want) = match take {
            Some(Take::Served { left }) => return decided(true, left, None),
            Some(Take::Cooling { retry_after }) => return decided(false, 0, Some(retry_after)),
            Some(Take::Call {
                give_back,
                window,
                want,
            }) => (give_back, window, want),
            // The lease table is full: take exactly what this request needs.
            None => (0, 0, cost),
        };
        let call = LeaseCall {
            want,
            need: cost,
            give_back,
            window,
        };
        let result = self
            .guarded(
                client,
                now,
                i.store.lease(client, p.rule(), call, now, i.timeout),
            )
            .await;
        match result {
            Ok(grant) => {
                lease::count(&p.inner.stats, grant.granted, give_back);
                if grant.granted >= cost {
                    let mut expires = now.saturating_add(duration_to_micros(ttl));
                    if p.limit().algorithm() == Algorithm::FixedWindow {
                        expires = expires.min(now.saturating_add(grant.window_end_after));
                    }
                    let left = leases.granted(
                        client,
                        id,
                        cost,
                        grant.granted,
                        want,
                        expires,
                        grant.window,
                        now,
                        ttl,
                    );
                    decided(true, grant.remaining + left, None)
                } else {
                    match grant.retry_after {
                        Some(r) => {
                            let wait = leases.refused(client, id, now, r, ttl);
                            decided(false, grant.remaining, Some(wait))
                        }
                        None => decided(false, grant.remaining, None),
                    }
                }
            }
            Err(skip_for) => {
                // The given-back units are lost if the call failed after Redis ran it; that
                // can only under-admit.
                // apply_failure counts the outcome.
                let mut out = Vec::with_capacity(1);
                let action = self.apply_failure(&[(client, p)], now, skip_for, &mut out);
                match out.pop() {
                    Some(r) => (r, action),
                    None => decided(true, 0, None),
                }
            }
        }
    }

    /// Settles the lease units a request took: counted as used when the request was
    /// allowed, put back into the lease when another policy rejected it (all-or-nothing).
    pub(crate) fn settle(&self, taken: &[(ClientKey, Policy, u64)], allowed: bool) {
        let Some(leases) = &self.inner.leases else {
            return;
        };
        for (client, p, cost) in taken {
            if allowed {
                p.inner.stats.lease(LeaseKind::Used, *cost);
            } else {
                leases.untake(client, p.rule().id(), *cost);
            }
        }
    }
}

/// The stricter of two actions: 503 over 429 over allow; the longer wait within a kind.
pub(crate) fn worse(a: Action, b: Action) -> Action {
    match (a, b) {
        (Action::Unavailable { retry_after: x }, Action::Unavailable { retry_after: y }) => {
            Action::Unavailable {
                retry_after: x.max(y),
            }
        }
        (u @ Action::Unavailable { .. }, _) | (_, u @ Action::Unavailable { .. }) => u,
        (Action::Limit { retry_after: x }, Action::Limit { retry_after: y }) => Action::Limit {
            retry_after: x.zip(y).map(|(x, y)| x.max(y)),
        },
        (l @ Action::Limit { .. }, _) | (_, l @ Action::Limit { .. }) => l,
        _ => Action::Allow,
    }
}

/// The leased policies by rule id, held weakly (a policy lives as long as a config or an
/// override cache holds it), with dead entries swept as the map grows.
#[derive(Default)]
pub(crate) struct LeasePolicies {
    by_id: std::collections::HashMap<u64, std::sync::Weak<crate::policy::PolicyInner>>,
    /// The size at which dead entries are next swept out.
    sweep_at: usize,
}

impl LeasePolicies {
    /// The size below which no sweep is done.
    const SWEEP_FLOOR: usize = 1024;

    pub(crate) fn insert(&mut self, p: &Policy) {
        self.by_id
            .insert(p.rule().id(), std::sync::Arc::downgrade(&p.inner));
        if self.by_id.len() >= self.sweep_at.max(Self::SWEEP_FLOOR) {
            self.by_id.retain(|_, w| w.strong_count() > 0);
            // Amortised: the next sweep waits for as many new entries as are live now.
            self.sweep_at = self.by_id.len() * 2;
        }
    }

    pub(crate) fn get(&self, id: u64) -> Option<Policy> {
        self.by_id
            .get(&id)
            .and_then(std::sync::Weak::upgrade)
            .map(|inner| Policy { inner })
    }
}
