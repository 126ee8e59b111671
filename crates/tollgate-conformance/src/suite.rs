//! The suite functions, one per behaviour; each takes a fresh store.

use crate::ConformanceStore;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{
    Algorithm, Check, ClientKey, Decision, Limit, Micros, Mode, Quota, Rule, State, Verdict,
};

/// A fixed synthetic instant (mid-2025), in microseconds since the epoch.
pub const T0: Micros = 1_750_000_000_123_456;
const THIRTY_DAYS: Duration = Duration::from_secs(30 * 24 * 3600);
const TASKS: usize = 8;

/// A client key no other test (and no earlier run against a persistent store) uses.
pub fn fresh_client() -> ClientKey {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let random = std::collections::hash_map::RandomState::new();
    let lo = random.hash_one(n);
    let hi = random.hash_one(!n);
    ClientKey::from_u128((u128::from(hi) << 64) | u128::from(lo))
}

/// A rule named after its algorithm and a tag, `limit` units per `period`.
pub fn rule(algorithm: Algorithm, limit: u64, period: Duration, tag: &str) -> Rule {
    let quota = Quota::new(limit, period).expect("valid test quota");
    let limit = Limit::new(algorithm, quota).expect("valid test limit");
    Rule::new(format!("{tag}-{}", algorithm.name()), limit)
}

async fn one<S: ConformanceStore>(
    s: &S,
    c: &ClientKey,
    r: &Rule,
    cost: u64,
    now: Micros,
) -> Decision {
    let v = s.check(&[Check::new(*c, r, cost)], now).await;
    assert_eq!(v.decisions.len(), 1, "one decision per check");
    assert_eq!(v.allowed, v.decisions[0].allowed);
    v.decisions[0]
}

/// Runs `TASKS` tasks each sending `per_task` identical requests at `T0`; returns how many
/// were admitted.
async fn hammer<S: ConformanceStore>(
    store: &Arc<S>,
    client: ClientKey,
    rules: &[Rule],
    cost: u64,
    per_task: usize,
) -> usize {
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = Arc::clone(store);
        let rules = rules.to_vec();
        tasks.push(tokio::spawn(async move {
            let checks: Vec<Check<'_>> = rules
                .iter()
                .map(|rule| Check::new(client, rule, cost))
                .collect();
            let mut admitted = 0;
            for _ in 0..per_task {
                if store.check(&checks, T0).await.allowed {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task panicked");
    }
    total
}

/// N tasks x M requests at one instant (so nothing refills) on one key with limit L admit
/// exactly L, for every algorithm: no lost update.
pub async fn concurrent_requests_on_one_key_admit_exactly_the_limit<S: ConformanceStore>(store: S) {
    let store = Arc::new(store);
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 100, THIRTY_DAYS, "exact");
        let client = fresh_client();
        let admitted = hammer(&store, client, std::slice::from_ref(&r), 1, 25).await;
        assert_eq!(
            admitted, 100,
            "{algorithm}: 8 x 25 requests against a limit of 100"
        );
        let d = one(&*store, &client, &r, 0, T0).await;
        assert_eq!(d.remaining, 0, "{algorithm}: all capacity used");
    }
}

/// With a cost of 7 and a limit of 100, exactly 14 requests pass (98 units), never 15.
pub async fn concurrent_requests_with_a_cost_admit_whole_requests_only<S: ConformanceStore>(
    store: S,
) {
    let store = Arc::new(store);
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 100, THIRTY_DAYS, "cost7");
        let client = fresh_client();
        let admitted = hammer(&store, client, std::slice::from_ref(&r), 7, 5).await;
        assert_eq!(
            admitted, 14,
            "{algorithm}: 40 requests of 7 units against 100"
        );
        let d = one(&*store, &client, &r, 0, T0).await;
        assert_eq!(d.remaining, 2, "{algorithm}: two units left");
    }
}

/// Three rules checked together: when one denies, none is charged.
pub async fn several_rules_are_decided_all_or_nothing<S: ConformanceStore>(store: S) {
    let a = rule(Algorithm::Gcra, 5, THIRTY_DAYS, "aon-a");
    let b = rule(Algorithm::FixedWindow, 3, THIRTY_DAYS, "aon-b");
    let c = rule(Algorithm::SlidingWindowLog, 10, THIRTY_DAYS, "aon-c");
    let client = fresh_client();
    let checks = [
        Check::new(client, &a, 1),
        Check::new(client, &b, 1),
        Check::new(client, &c, 1),
    ];
    let mut verdicts: Vec<Verdict> = Vec::new();
    for _ in 0..5 {
        verdicts.push(store.check(&checks, T0).await);
    }
    let allowed: Vec<bool> = verdicts.iter().map(|v| v.allowed).collect();
    assert_eq!(allowed, [true, true, true, false, false]);
    let denied = &verdicts[3];
    assert_eq!(denied.decisions.len(), 3);
    assert!(
        !denied.decisions[1].allowed,
        "the fixed window is the one that denies"
    );
    assert!(denied.decisions[0].allowed && denied.decisions[2].allowed);
    assert_eq!(denied.decisions[0].remaining, 2, "uncharged state of a");
    assert_eq!(denied.decisions[2].remaining, 7, "uncharged state of c");
    assert_eq!(one(&store, &client, &a, 0, T0).await.remaining, 2);
    assert_eq!(one(&store, &client, &c, 0, T0).await.remaining, 7);
    // a alone still has exactly two units.
    assert!(one(&store, &client, &a, 2, T0).await.allowed);
    assert!(!one(&store, &client, &a, 1, T0).await.allowed);
}

/// Many tasks sending the same two-rule request: the tighter rule's limit passes, and the
/// looser rule is charged for exactly those, never for the denied ones.
pub async fn concurrent_multi_rule_requests_charge_all_or_nothing<S: ConformanceStore>(store: S) {
    let store = Arc::new(store);
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let loose = rule(algorithm, 40, THIRTY_DAYS, "loose");
        let other = Algorithm::ALL[(i + 1) % Algorithm::ALL.len()];
        let tight = rule(other, 12, THIRTY_DAYS, "tight");
        let client = fresh_client();
        let admitted = hammer(&store, client, &[loose.clone(), tight.clone()], 1, 10).await;
        assert_eq!(admitted, 12, "{algorithm} with {other}");
        let d = one(&*store, &client, &loose, 0, T0).await;
        assert_eq!(
            d.remaining, 28,
            "{algorithm}: charged only for admitted requests"
        );
    }
}

/// Denied at t with retry r: still denied at t + r - 1us, allowed at t + r.
pub async fn retry_after_is_the_exact_earliest_time<S: ConformanceStore>(store: S) {
    if !store.uses_local_clock() {
        return;
    }
    for algorithm in Algorithm::ALL {
        for cost in [1, 3] {
            let r = rule(algorithm, 10, Duration::from_secs(60), "retry");
            let client = fresh_client();
            let mut t = T0;
            let mut denial = None;
            for _ in 0..40 {
                let d = one(&store, &client, &r, cost, t).await;
                if !d.allowed {
                    denial = Some(d);
                    break;
                }
                t += 1_000_000;
            }
            let d = denial.expect("the limit is reached within 40 requests");
            let wait = d.retry_after.expect("a retry time");
            assert!(wait > 0, "{algorithm}: a denial waits");
            let early = one(&store, &client, &r, cost, t + wait - 1).await;
            assert!(
                !early.allowed,
                "{algorithm} cost {cost}: denied 1us before retry_after"
            );
            let on_time = one(&store, &client, &r, cost, t + wait).await;
            assert!(
                on_time.allowed,
                "{algorithm} cost {cost}: allowed at retry_after"
            );
        }
    }
}

/// A tiny deterministic generator for traces (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The store's decisions equal tollgate-core's on a state that is never forgotten, through
/// long idle gaps (when a store may evict or expire the key) and traffic from other clients.
pub async fn expiry_never_changes_a_decision<S: ConformanceStore>(store: S) {
    if !store.uses_local_clock() {
        return;
    }
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 5, Duration::from_secs(10), "expiry");
        let limit = *r.limit();
        let client = fresh_client();
        let mut reference: State = limit.fresh();
        let mut rng = Rng(0x9e37_79b9 ^ algorithm as u64);
        let mut now = T0;
        for step in 0..300 {
            now += match rng.below(10) {
                0 => 3_600_000_000 + rng.below(10_000_000),
                1..=3 => rng.below(15_000_000),
                _ => rng.below(500_000),
            };
            for _ in 0..rng.below(8) {
                one(&store, &fresh_client(), &r, 1, now).await;
            }
            let cost = rng.below(4);
            let got = one(&store, &client, &r, cost, now).await;
            let want = limit.check(&mut reference, now, cost, true);
            assert_eq!(got, want, "{algorithm}: step {step} at {now} cost {cost}");
        }
    }
}

/// Random plans (several rules, two clients, some rules in shadow mode) decide exactly as
/// `tollgate_core::decide` on states that are never forgotten.
pub async fn multi_rule_traces_match_tollgate_core<S: ConformanceStore>(store: S) {
    if !store.uses_local_clock() {
        return;
    }
    let rules: Vec<Rule> = Algorithm::ALL
        .iter()
        .enumerate()
        .map(|(i, &a)| rule(a, 4 + i as u64, Duration::from_secs(5 + i as u64), "trace"))
        .collect();
    let clients = [fresh_client(), fresh_client()];
    // One state per (client, rule).
    let mut states: Vec<State> = clients
        .iter()
        .flat_map(|_| rules.iter().map(|r| r.limit().fresh()))
        .collect();
    let mut rng = Rng(42);
    let mut now = T0;
    for step in 0..600 {
        now += rng.below(1_500_000);
        let picked: Vec<(usize, usize)> = (0..clients.len() * rules.len())
            .filter(|_| rng.below(6) == 0)
            .map(|k| (k / rules.len(), k % rules.len()))
            .collect();
        let costs: Vec<u64> = picked.iter().map(|_| rng.below(3)).collect();
        let modes: Vec<Mode> = picked
            .iter()
            .map(|_| match rng.below(4) {
                0 => Mode::Shadow,
                _ => Mode::Enforce,
            })
            .collect();
        let checks: Vec<Check<'_>> = picked
            .iter()
            .zip(&costs)
            .zip(&modes)
            .map(|((&(c, r), &cost), &mode)| Check {
                client: clients[c],
                rule: &rules[r],
                cost,
                mode,
            })
            .collect();
        let got = store.check(&checks, now).await;
        let index = |(c, r): (usize, usize)| c * rules.len() + r;
        let mut scratch: Vec<State> = picked.iter().map(|&k| states[index(k)].clone()).collect();
        let want = tollgate_core::decide(
            picked
                .iter()
                .zip(scratch.iter_mut())
                .zip(&costs)
                .zip(&modes)
                .map(|(((&(_, r), s), &c), &m)| (rules[r].limit(), s, c, m)),
            now,
        );
        assert_eq!(
            got, want,
            "step {step}: (client, rule) {picked:?} costs {costs:?} modes {modes:?}"
        );
        for (&k, s) in picked.iter().zip(scratch) {
            states[index(k)] = s;
        }
    }
}

/// A request matched by a per-API-key rule and a per-IP rule (two identities, one plan): when
/// the IP's rule is exhausted the request is denied and the API key's rule is charged nothing,
/// for every algorithm (read back with a query).
pub async fn a_denial_under_one_identity_charges_no_other_identity<S: ConformanceStore>(store: S) {
    for algorithm in Algorithm::ALL {
        let per_key = rule(algorithm, 10, THIRTY_DAYS, "per-key");
        let per_ip = rule(algorithm, 3, THIRTY_DAYS, "per-ip");
        let (key, ip) = (fresh_client(), fresh_client());
        let plan = [Check::new(key, &per_key, 1), Check::new(ip, &per_ip, 1)];
        for i in 0..3 {
            let v = store.check(&plan, T0).await;
            assert!(v.allowed, "{algorithm}: request {i} fits both");
        }
        let before = one(&store, &key, &per_key, 0, T0).await.remaining;
        assert_eq!(before, 7, "{algorithm}: three charged to the key");
        for _ in 0..4 {
            let v = store.check(&plan, T0).await;
            assert!(!v.allowed, "{algorithm}: the IP's rule is exhausted");
            assert!(v.decisions[0].allowed && !v.decisions[1].allowed);
            assert_eq!(
                v.decisions[0].remaining, 7,
                "{algorithm}: reported uncharged"
            );
        }
        let after = one(&store, &key, &per_key, 0, T0).await.remaining;
        assert_eq!(after, before, "{algorithm}: the key's rule was not charged");
    }
}

/// A shadow rule never denies; it is charged when it allows and the request passes, and
/// charged nothing when it would deny or when an enforced rule denies.
pub async fn shadow_rules_never_deny_and_charge_only_what_they_allow<S: ConformanceStore>(
    store: S,
) {
    for algorithm in Algorithm::ALL {
        let enforced = rule(algorithm, 4, THIRTY_DAYS, "enforced");
        let shadow = rule(algorithm, 2, THIRTY_DAYS, "shadow");
        let client = fresh_client();
        let plan = [
            Check::new(client, &enforced, 1),
            Check::new(client, &shadow, 1).shadow(),
        ];
        let allowed: Vec<(bool, bool, bool)> = {
            let mut out = Vec::new();
            for _ in 0..6 {
                let v = store.check(&plan, T0).await;
                out.push((v.allowed, v.decisions[0].allowed, v.decisions[1].allowed));
            }
            out
        };
        // The shadow rule allows twice, then would deny; the enforced rule allows 4 times.
        assert_eq!(
            allowed,
            [
                (true, true, true),
                (true, true, true),
                (true, true, false),
                (true, true, false),
                (false, false, false),
                (false, false, false),
            ],
            "{algorithm}"
        );
        assert_eq!(one(&store, &client, &enforced, 0, T0).await.remaining, 0);
        assert_eq!(
            one(&store, &client, &shadow, 0, T0).await.remaining,
            0,
            "{algorithm}: the shadow rule was charged its two allowed units, no more"
        );
    }
}

/// One client's exhaustion does not touch another client, nor another rule of its own.
pub async fn distinct_clients_and_rules_are_independent<S: ConformanceStore>(store: S) {
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 5, THIRTY_DAYS, "indep");
        let r2 = rule(algorithm, 5, THIRTY_DAYS, "indep2");
        let (a, b) = (fresh_client(), fresh_client());
        assert!(one(&store, &a, &r, 5, T0).await.allowed);
        assert!(
            !one(&store, &a, &r, 1, T0).await.allowed,
            "{algorithm}: a is exhausted"
        );
        let db = one(&store, &b, &r, 5, T0).await;
        assert!(db.allowed, "{algorithm}: b has its own quota");
        let d2 = one(&store, &a, &r2, 5, T0).await;
        assert!(d2.allowed, "{algorithm}: a's other rule has its own quota");
    }
}

/// A zero-cost check reports the state and charges nothing, however often it is sent.
pub async fn zero_cost_is_a_pure_query<S: ConformanceStore>(store: S) {
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 10, THIRTY_DAYS, "query");
        let client = fresh_client();
        for _ in 0..20 {
            let d = one(&store, &client, &r, 0, T0).await;
            assert!(d.allowed);
            assert_eq!(d.remaining, 10, "{algorithm}: a query on a fresh key");
        }
        assert_eq!(one(&store, &client, &r, 4, T0).await.remaining, 6);
        for _ in 0..20 {
            assert_eq!(
                one(&store, &client, &r, 0, T0).await.remaining,
                6,
                "{algorithm}"
            );
        }
    }
}

/// A denied request leaves the state as it was: a smaller request still fits afterwards.
pub async fn denied_requests_consume_nothing<S: ConformanceStore>(store: S) {
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 10, THIRTY_DAYS, "deny");
        let client = fresh_client();
        assert!(one(&store, &client, &r, 8, T0).await.allowed);
        for _ in 0..5 {
            let d = one(&store, &client, &r, 3, T0).await;
            assert!(!d.allowed, "{algorithm}: 8 + 3 > 10");
            assert!(d.retry_after.is_some());
        }
        let d = one(&store, &client, &r, 2, T0).await;
        assert!(d.allowed, "{algorithm}: the denials consumed nothing");
        assert_eq!(d.remaining, 0);
    }
}

/// A cost above what the quota can ever admit is denied with no retry time, and charges
/// nothing.
pub async fn cost_above_capacity_is_denied_without_retry<S: ConformanceStore>(store: S) {
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 10, THIRTY_DAYS, "capacity");
        let client = fresh_client();
        let d = one(&store, &client, &r, 11, T0).await;
        assert!(d.exceeds_capacity(), "{algorithm}: {d:?}");
        assert_eq!(
            one(&store, &client, &r, 10, T0).await.remaining,
            0,
            "{algorithm}"
        );
    }
}
