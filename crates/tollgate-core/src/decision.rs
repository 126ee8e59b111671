//! Being limited is a value, not an error: a [`Decision`] says whether the request passes and,
//! when it does not, the exact earliest time it would.

use crate::time::Micros;

/// The answer of one algorithm for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted (and, when committed, charged).
    pub allowed: bool,
    /// The quota's limit (units per period), for `RateLimit-Policy: q=`.
    pub limit: u64,
    /// Units left after this request (after charging it when allowed).
    pub remaining: u64,
    /// Microseconds until the state is back to fresh (a new client's).
    pub reset_after: Micros,
    /// When denied: microseconds until the same request would pass if nothing else happened.
    /// `None` when allowed, and when denied because the cost exceeds what the algorithm can
    /// ever admit (see [`Decision::exceeds_capacity`]).
    pub retry_after: Option<Micros>,
}

impl Decision {
    /// Denied because the cost is larger than anything this quota can ever admit: retrying
    /// never helps.
    pub fn exceeds_capacity(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }

    /// How constrained this decision is, as an ordering key (greater = more constrained): a
    /// denial over an allowance, then the longer wait (never passing longest), then the
    /// fewer remaining units, then the later reset. What `RateLimit` reports is the maximum.
    pub fn constraint(&self) -> impl Ord {
        let wait = match (self.allowed, self.retry_after) {
            (true, _) => 0,
            (false, Some(r)) => r,
            (false, None) => u64::MAX,
        };
        (
            !self.allowed,
            wait,
            u64::MAX - self.remaining,
            self.reset_after,
        )
    }
}

/// The answer for a plan's checks decided together, all-or-nothing (see [`crate::decide`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// True when every enforced check allowed, and so every check that allowed was charged.
    pub allowed: bool,
    /// One decision per check, in the order given. When the verdict is a denial, nothing was
    /// charged: the checks that would have allowed report their uncharged state.
    pub decisions: Decisions,
}

/// A verdict's decisions: a plan of one check (most are) keeps its one inline, so deciding it
/// allocates nothing, on any store.
pub type Decisions = smallvec::SmallVec<[Decision; 1]>;

impl Verdict {
    /// When denied: the earliest time the plan would pass (the largest of the enforced
    /// denials' retry times and, when every quota check denied, the earliest of theirs), or
    /// `None` when it can never pass or nothing was denied. `checks` are the checks this
    /// verdict answers, in order.
    pub fn retry_after(&self, checks: &[crate::Check<'_>]) -> Option<Micros> {
        if self.allowed {
            return None;
        }
        let worst = worst_of_enforced(self, checks)?;
        let mut quota = self
            .decisions
            .iter()
            .zip(checks)
            .filter(|(_, c)| c.mode == crate::Mode::Quota)
            .peekable();
        if quota.peek().is_none() || quota.clone().any(|(d, _)| d.allowed) {
            return Some(worst);
        }
        // Every quota check denied: the plan passes when the first of them does.
        let earliest = quota.filter_map(|(d, _)| d.retry_after).min()?;
        Some(worst.max(earliest))
    }

    /// The index of the most constrained decision: the denial with the longest wait, or, when
    /// all allowed, the one with the least remaining (what `RateLimit` reports).
    pub fn most_constrained(&self) -> Option<usize> {
        (0..self.decisions.len()).max_by_key(|&i| self.decisions[i].constraint())
    }
}

/// The largest retry time of the enforced denials (`None`: one can never pass).
fn worst_of_enforced(v: &Verdict, checks: &[crate::Check<'_>]) -> Option<Micros> {
    let mut worst: Micros = 0;
    for (d, _) in v
        .decisions
        .iter()
        .zip(checks)
        .filter(|(d, c)| !d.allowed && c.enforces())
    {
        worst = worst.max(d.retry_after?);
    }
    Some(worst)
}
