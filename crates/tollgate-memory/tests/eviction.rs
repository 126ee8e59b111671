//! Behaviour of the memory store that no other store shares: entries, bounds and eviction.

use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Algorithm, Check, ClientKey, Limit, Quota, Rule};
use tollgate_memory::{MemoryConfig, MemoryStore, WhenFull};

const T0: u64 = 1_750_000_000_000_000;

fn rule(algorithm: Algorithm, limit: u64, period: Duration) -> Rule {
    let quota = Quota::new(limit, period).expect("valid quota");
    Rule::new(
        algorithm.name(),
        Limit::new(algorithm, quota).expect("valid limit"),
    )
}

fn client(n: u64) -> ClientKey {
    // Spread the bits like a keyed hash would.
    let x = u128::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) ^ 0x5555;
    ClientKey::from_u128(x)
}

fn small(max_keys: usize) -> MemoryStore {
    MemoryStore::new(MemoryConfig {
        max_keys,
        ..MemoryConfig::default()
    })
}

fn check(store: &MemoryStore, c: &ClientKey, r: &Rule, cost: u64, now: u64) -> bool {
    store.check(&[Check::new(*c, r, cost)], now).allowed
}

#[test]
fn zero_cost_and_denied_requests_create_no_entry() {
    let store = MemoryStore::default();
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 10, Duration::from_secs(60));
        for n in 0..100 {
            assert!(check(&store, &client(n), &r, 0, T0));
            assert!(!check(&store, &client(n), &r, 11, T0));
        }
        assert!(store.is_empty(), "{algorithm}: {} entries", store.len());
        let both = [Check::new(client(1), &r, 1), Check::new(client(1), &r, 10)];
        assert!(!store.check(&both, T0).allowed);
        assert!(store.is_empty(), "{algorithm}: a denied multi-rule request");
    }
    let r = rule(Algorithm::Gcra, 10, Duration::from_secs(60));
    assert!(check(&store, &client(1), &r, 1, T0));
    assert_eq!(store.len(), 1);
}

#[test]
fn a_full_store_never_exceeds_max_keys() {
    for max_keys in [1, 7, 100, 5_000] {
        let store = small(max_keys);
        let r = rule(Algorithm::TokenBucket, 10, Duration::from_secs(60));
        for n in 0..(max_keys as u64 * 3 + 50) {
            assert!(
                check(&store, &client(n), &r, 1, T0),
                "a new client is admitted"
            );
            assert!(store.len() <= max_keys, "{} > {max_keys}", store.len());
        }
        assert_eq!(
            store.len(),
            max_keys,
            "a full table stays full, not emptier"
        );
    }
}

#[test]
fn tiny_bounds_and_many_shards_still_track_keys() {
    let r = rule(Algorithm::Gcra, 10, Duration::from_secs(60));
    for (max_keys, shards) in [(0, 0), (3, 64), (100, 1_000)] {
        let store = MemoryStore::new(MemoryConfig {
            max_keys,
            shards,
            ..MemoryConfig::default()
        });
        for n in 0..50 {
            assert!(
                check(&store, &client(n), &r, 1, T0),
                "{max_keys}/{shards}: key {n}"
            );
        }
        // Every shard has room for at least one key, so every new key was admitted and
        // tracked (or replaced one); with more shards than a few keys fill, some evict early.
        assert!(store.len() <= max_keys.clamp(1, 50), "{max_keys}/{shards}");
        if max_keys < 10 {
            assert_eq!(store.len(), max_keys.max(1), "{max_keys}/{shards}");
        }
    }
}

#[test]
fn a_limited_key_survives_a_flood_of_new_keys() {
    let store = small(1_000);
    for algorithm in Algorithm::ALL {
        let r = rule(algorithm, 5, Duration::from_secs(3600));
        let victim = client(u64::MAX);
        assert!(check(&store, &victim, &r, 5, T0));
        assert!(!check(&store, &victim, &r, 1, T0), "{algorithm}: limited");
        for n in 0..50_000 {
            let now = T0 + n;
            check(&store, &client(n), &r, 1, now);
            if n % 997 == 0 {
                assert!(
                    !check(&store, &victim, &r, 1, now),
                    "{algorithm}: after {n}"
                );
            }
            assert!(store.len() <= 1_000);
        }
        assert!(
            !check(&store, &victim, &r, 1, T0 + 50_000),
            "{algorithm}: still limited"
        );
    }
}

fn fill_with_limited_keys(store: &MemoryStore, r: &Rule) {
    for n in 0..64 {
        assert!(check(store, &client(n), r, 2, T0));
    }
    assert_eq!(store.len(), 64);
}

/// The keys `fill_with_limited_keys` put in are all still there, and still limited.
fn assert_limited_keys_kept(store: &MemoryStore, r: &Rule) {
    for n in 0..64 {
        assert!(
            !check(store, &client(n), r, 1, T0),
            "limited key {n} was kept"
        );
    }
}

fn denying(max_keys: usize) -> MemoryStore {
    MemoryStore::new(MemoryConfig {
        max_keys,
        when_full: WhenFull::Deny,
        ..MemoryConfig::default()
    })
}

#[test]
fn a_table_full_of_limited_keys_admits_new_clients_by_forgetting_the_limited_key_closest_to_fresh()
{
    let store = small(64);
    let r = rule(Algorithm::Gcra, 2, Duration::from_secs(3600));
    // A spray of keys, one a microsecond, each spending its whole hour's quota.
    for n in 0..64 {
        assert!(check(&store, &client(n), &r, 2, T0 + n));
    }
    let now = T0 + 1_000;
    for n in 0..20 {
        let newcomer = client(10_000 + n);
        assert!(check(&store, &newcomer, &r, 1, now), "new client {n}");
        // Recorded like any other client: its second unit is its last.
        assert!(check(&store, &newcomer, &r, 1, now), "new client {n}");
        assert!(!check(&store, &newcomer, &r, 1, now), "new client {n}");
    }
    assert_eq!(store.len(), 64);
    assert_eq!(store.untracked(), 0);
}

#[test]
fn under_deny_a_table_full_of_limited_keys_denies_new_keys() {
    let store = denying(64);
    let r = rule(Algorithm::Gcra, 2, Duration::from_secs(3600));
    fill_with_limited_keys(&store, &r);
    let checks = [Check::new(client(1_000), &r, 1)];
    let v = store.check(&checks, T0);
    assert!(
        !v.allowed,
        "no room and nothing evictable: the new key is refused"
    );
    // One unit of the sampled keys comes back after one emission interval (30 minutes).
    assert_eq!(v.retry_after(&checks), Some(1_800_000_000));
    assert_eq!(store.len(), 64);
    assert_eq!(store.untracked(), 1);
    assert_limited_keys_kept(&store, &r);
    // Once the old keys can take a request again, they are evictable and new keys get in.
    let later = T0 + 1_800_000_000;
    assert!(check(&store, &client(1_000), &r, 1, later));
    assert_eq!(store.len(), 64);
}

#[test]
fn under_deny_a_full_table_refuses_a_multi_rule_request_without_charging_it() {
    let store = denying(64);
    let r = rule(Algorithm::Gcra, 2, Duration::from_secs(3600));
    let r2 = rule(Algorithm::FixedWindow, 2, Duration::from_secs(3600));
    let c = client(7);
    fill_with_limited_keys(&store, &r);
    // Client 7 is present under r (limited) but new under r2; use a fresh client instead.
    let newcomer = client(5_000);
    let both = [Check::new(newcomer, &r, 1), Check::new(newcomer, &r2, 1)];
    assert!(!store.check(&both, T0).allowed);
    assert_eq!(store.len(), 64);
    assert!(!check(&store, &c, &r, 1, T0));
}

#[test]
fn admit_untracked_decides_new_keys_as_fresh_when_the_table_is_pinned() {
    let store = MemoryStore::new(MemoryConfig {
        max_keys: 64,
        when_full: WhenFull::AdmitUntracked,
        ..MemoryConfig::default()
    });
    let r = rule(Algorithm::Gcra, 2, Duration::from_secs(3600));
    fill_with_limited_keys(&store, &r);
    for _ in 0..3 {
        assert!(
            check(&store, &client(1_000), &r, 1, T0),
            "admitted, not recorded"
        );
    }
    assert_eq!(store.len(), 64);
    assert_eq!(store.untracked(), 3);
    assert_limited_keys_kept(&store, &r);
}

#[test]
fn eviction_takes_the_key_closest_to_fresh_first() {
    let store = small(2);
    let r = rule(Algorithm::Gcra, 10, Duration::from_secs(10));
    let (heavy, light, new) = (client(1), client(2), client(3));
    assert!(check(&store, &heavy, &r, 8, T0));
    assert!(check(&store, &light, &r, 1, T0));
    assert!(check(&store, &new, &r, 1, T0));
    assert_eq!(store.len(), 2);
    // heavy kept its charge (2 left), light was forgotten (fresh again: 10 left).
    let remaining =
        |c: &ClientKey| store.check(&[Check::new(*c, &r, 0)], T0).decisions[0].remaining;
    assert_eq!(remaining(&heavy), 2);
    assert_eq!(remaining(&light), 10);
    assert_eq!(remaining(&new), 9);
}

#[test]
fn idle_keys_are_dropped_by_normal_traffic() {
    let store = small(100_000);
    let r = rule(Algorithm::FixedWindow, 10, Duration::from_secs(1));
    for n in 0..20_000 {
        assert!(check(&store, &client(n), &r, 1, T0));
    }
    assert_eq!(store.len(), 20_000);
    // An hour later, requests from five thousand other clients sweep the old keys out.
    let later = T0 + 3_600_000_000;
    for n in 0..800_000 {
        check(&store, &client(1_000_000 + n % 5_000), &r, 1, later + n);
    }
    // What remains is the five thousand active clients: the twenty thousand old keys are gone.
    assert!(store.len() <= 5_100, "{} keys still tracked", store.len());
}

#[test]
fn sliding_logs_use_the_slab_and_are_freed_on_eviction() {
    let store = small(1_000);
    let r = rule(Algorithm::SlidingWindowLog, 100, Duration::from_secs(1));
    for round in 0..5u64 {
        for n in 0..5_000 {
            let now = T0 + round * 10_000_000 + n;
            assert!(check(&store, &client(n), &r, 1 + n % 3, now));
            assert!(store.len() <= 1_000);
        }
    }
    let d = store.check(&[Check::new(client(4_999), &r, 0)], T0 + 40_005_000);
    assert_eq!(d.decisions[0].remaining, 100 - (1 + 4_999 % 3));
}

#[test]
fn a_policy_that_changes_algorithm_starts_fresh() {
    let store = MemoryStore::default();
    let c = client(9);
    let before = Rule::new(
        "p",
        Limit::new(
            Algorithm::SlidingWindowLog,
            Quota::per_minute(3).expect("q"),
        )
        .expect("l"),
    );
    let after = Rule::new(
        "p",
        Limit::new(Algorithm::Gcra, Quota::per_minute(5).expect("q")).expect("l"),
    );
    assert!(check(&store, &c, &before, 3, T0));
    assert!(!check(&store, &c, &before, 1, T0));
    assert!(
        check(&store, &c, &after, 5, T0),
        "another algorithm starts from a fresh state"
    );
    assert!(!check(&store, &c, &after, 1, T0));
}

#[test]
fn os_threads_on_one_key_admit_exactly_the_limit() {
    let store = Arc::new(small(10_000));
    for algorithm in Algorithm::ALL {
        let r = Arc::new(rule(algorithm, 1_000, Duration::from_secs(86_400)));
        let c = client(77);
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let (store, r) = (Arc::clone(&store), Arc::clone(&r));
                    s.spawn(move || (0..600).filter(|_| check(&store, &c, &r, 1, T0)).count())
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        assert_eq!(admitted, 1_000, "{algorithm}");
    }
}

#[test]
fn remove_forgets_one_client_under_one_rule_and_nothing_else() {
    for algorithm in Algorithm::ALL {
        let store = MemoryStore::default();
        let r = rule(algorithm, 3, Duration::from_secs(60));
        let other_rule = Rule::new("other", *r.limit());
        for c in [client(1), client(2)] {
            for rule in [&r, &other_rule] {
                for _ in 0..3 {
                    assert!(check(&store, &c, rule, 1, T0), "{algorithm}");
                }
                assert!(!check(&store, &c, rule, 1, T0), "{algorithm}: limited");
            }
        }
        assert_eq!(store.len(), 4, "{algorithm}");
        // The same rule name under another limit (a reloaded quota) names the same state.
        let reloaded = rule(algorithm, 5, Duration::from_secs(60));
        let reloaded = Rule::new(r.name().to_string(), *reloaded.limit());
        assert!(store.remove(&client(1), &reloaded), "{algorithm}");
        assert!(!store.remove(&client(1), &r), "{algorithm}: already gone");
        assert!(!store.remove(&client(3), &r), "{algorithm}: never tracked");
        assert_eq!(store.len(), 3, "{algorithm}");
        for _ in 0..3 {
            assert!(check(&store, &client(1), &r, 1, T0), "{algorithm}: fresh");
        }
        assert!(!check(&store, &client(1), &r, 1, T0), "{algorithm}");
        assert!(
            !check(&store, &client(2), &r, 1, T0),
            "{algorithm}: untouched"
        );
        assert!(
            !check(&store, &client(1), &other_rule, 1, T0),
            "{algorithm}"
        );
    }
}
