//! A request's plan: which policies apply to it, each for the client key its identity
//! resolved to. The limiter decides a whole plan at once (see [`crate::Limiter::check`]).

use crate::policy::Policy;
use smallvec::SmallVec;
use std::collections::HashSet;
use tollgate_core::ClientKey;

/// The (client key, policy) pairs one request is checked against. A request matched by a
/// per-API-key policy and a per-IP policy is one plan of two items with two client keys: the
/// limiter charges both or neither. A pair given twice is kept once.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Inline up to two pairs: most requests are matched by one policy or two, and a plan is
    /// made for every request (a heap block allocated and freed a request otherwise).
    items: SmallVec<[(ClientKey, Policy); 2]>,
    /// The pairs present, once the plan is past a few items (a linear scan is cheaper below;
    /// above, a request matched by thousands of policies must not cost a quadratic scan).
    seen: Option<HashSet<(ClientKey, u64)>>,
}

/// Items up to which `push` scans for a duplicate instead of keeping a set.
const SCAN: usize = 16;

impl Plan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty plan with room for `n` pairs (a front end that knows how many it will push,
    /// as the RLS does from a request's descriptors, grows it once).
    pub fn with_capacity(n: usize) -> Self {
        Self {
            items: SmallVec::with_capacity(n),
            seen: None,
        }
    }

    /// A plan of `policies`, all for `client`.
    pub fn for_client<'a>(
        client: ClientKey,
        policies: impl IntoIterator<Item = &'a Policy>,
    ) -> Self {
        let mut plan = Self::new();
        for p in policies {
            plan.push(client, p.clone());
        }
        plan
    }

    /// Adds `policy` for `client` (once: the same pair again is ignored).
    pub fn push(&mut self, client: ClientKey, policy: Policy) {
        let id = policy.rule().id();
        let new = match &mut self.seen {
            Some(seen) => seen.insert((client, id)),
            None => !self
                .items
                .iter()
                .any(|(c, p)| *c == client && p.rule().id() == id),
        };
        if !new {
            return;
        }
        self.items.push((client, policy));
        if self.seen.is_none() && self.items.len() > SCAN {
            self.seen = Some(
                self.items
                    .iter()
                    .map(|(c, p)| (*c, p.rule().id()))
                    .collect(),
            );
        }
    }

    /// Whether no policy applies.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many (client, policy) pairs.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The pairs, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&ClientKey, &Policy)> {
        self.items.iter().map(|(c, p)| (c, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Algorithm, Limit, Quota};
    use crate::{Limiter, LimiterConfig, PolicySpec};

    #[test]
    fn a_pair_is_kept_once_below_and_above_the_scan_bound() {
        let limiter = Limiter::new(LimiterConfig::default());
        let limit = Limit::new(Algorithm::Gcra, Quota::per_hour(5).expect("quota")).expect("limit");
        let policies: Vec<Policy> = (0..40)
            .map(|i| {
                limiter
                    .policy(PolicySpec::new(format!("p{i}"), limit))
                    .expect("policy")
            })
            .collect();
        let (a, b) = (ClientKey([1; 16]), ClientKey([2; 16]));
        let mut plan = Plan::new();
        for _ in 0..3 {
            for p in &policies {
                plan.push(a, p.clone());
            }
            plan.push(b, policies[0].clone());
        }
        assert_eq!(plan.len(), 41);
        let firsts: Vec<&str> = plan.iter().take(3).map(|(_, p)| p.name()).collect();
        assert_eq!(firsts, ["p0", "p1", "p2"], "order is kept");
    }
}
