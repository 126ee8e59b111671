//! A plan of several checks, decided under the write locks of every shard it touches.

use crate::shard::{denial, Shard};
use crate::Place;
use tollgate_core::{Check, Micros, State, Verdict};

/// Decides `checks` all-or-nothing (the rules of [`tollgate_core::decide`]); `keys[i]` is
/// where check `i`'s client lives and `at[i]` the index of its shard in `shards`.
/// A key checked twice in one plan shares its state: the second check sees the first's charge.
///
/// Order of work, so that nothing is half written: read every state; decide; when allowed,
/// make room for every new key in every shard (a full table may refuse: then nothing is
/// charged); only then write.
pub(crate) fn decide<G: std::ops::DerefMut<Target = Shard>>(
    shards: &mut [G],
    keys: &[Place],
    at: &[usize],
    checks: &[Check<'_>],
    now: Micros,
) -> Verdict {
    let n = checks.len();
    let mut rules = Vec::with_capacity(n);
    let mut states: Vec<State> = Vec::with_capacity(n);
    let mut owner = Vec::with_capacity(n);
    for (i, (c, k)) in checks.iter().zip(keys).enumerate() {
        let (rule, state) = shards[at[i]].locate(k.lo, k.hi, k.ch, c.rule);
        let same = |j: &usize| {
            rule.is_some() && rules[*j] == rule && keys[*j].lo == k.lo && keys[*j].hi == k.hi
        };
        owner.push((0..i).find(same).unwrap_or(i));
        rules.push(rule);
        states.push(state);
    }
    let before = states.clone();
    let mut decisions: tollgate_core::Decisions = checks
        .iter()
        .zip(&owner)
        .map(|(c, &o)| c.rule.limit().check(&mut states[o], now, c.cost, true))
        .collect();
    let allowed = tollgate_core::plan_allows(
        checks
            .iter()
            .zip(&decisions)
            .map(|(c, d)| (c.mode, d.allowed)),
    );
    if !allowed {
        for ((c, &o), d) in checks.iter().zip(&owner).zip(decisions.iter_mut()) {
            if d.allowed {
                let mut state = before[o].clone();
                *d = c.rule.limit().check(&mut state, now, 0, false);
            }
        }
        return Verdict { allowed, decisions };
    }
    // The keys to write: each owner that some allowed check with a cost charged.
    let mut charged = vec![false; n];
    for (i, (c, d)) in checks.iter().zip(&decisions).enumerate() {
        if d.allowed && c.cost > 0 && rules[owner[i]].is_some() {
            charged[owner[i]] = true;
        }
    }
    // Room for the new keys, shard by shard, sparing every client of the plan (whether a
    // key is new was found when its state was read: nothing has changed the tables since).
    let spare: Vec<(u64, u64)> = keys.iter().map(|k| (k.lo, k.hi)).collect();
    let mut new_keys = vec![0usize; shards.len()];
    for i in (0..n).filter(|&i| charged[i]) {
        if rules[i].is_some_and(|r| !r.kept) {
            new_keys[at[i]] += 1;
        }
    }
    let mut record = vec![true; shards.len()];
    for (g, shard) in shards.iter_mut().enumerate() {
        if new_keys[g] == 0 {
            continue;
        }
        match shard.reserve(new_keys[g], now, &spare) {
            Ok(r) => record[g] = r,
            Err(wait) => {
                for d in decisions.iter_mut() {
                    *d = denial(*d, wait);
                }
                return Verdict {
                    allowed: false,
                    decisions,
                };
            }
        }
    }
    for i in (0..n).filter(|&i| charged[i]) {
        let (k, g) = (&keys[i], at[i]);
        if let Some(r) = rules[i] {
            let state = std::mem::replace(&mut states[i], State::Gcra(Default::default()));
            shards[g].put(k.lo, k.hi, k.ch, r.rule, state, record[g]);
        }
    }
    Verdict { allowed, decisions }
}
