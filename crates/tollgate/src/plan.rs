//! A request's plan: which policies apply to it, each for the client key its identity
//! resolved to. The limiter decides a whole plan at once (see [`crate::Limiter::check`]).

use crate::policy::Policy;
use tollgate_core::ClientKey;

/// The (client key, policy) pairs one request is checked against. A request matched by a
/// per-API-key policy and a per-IP policy is one plan of two items with two client keys: the
/// limiter charges both or neither. A pair given twice is kept once.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    items: Vec<(ClientKey, Policy)>,
}

impl Plan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
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
        if !self
            .items
            .iter()
            .any(|(c, p)| *c == client && p.rule().id() == id)
        {
            self.items.push((client, policy));
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
