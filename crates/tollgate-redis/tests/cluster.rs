//! The Redis store against a real Redis Cluster: one client's keys share a slot (so the
//! multi-key script is legal), clients spread over every master, and a killed master's
//! replica takes over without recreating the store (NOSCRIPT on the promoted replica is
//! answered by reloading the script).

mod common;

use common::{client, rule};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Algorithm, Check, Rule};
use tollgate_redis::{plan_script_sha, ErrorKind, RuleShape, StoreClock};
use tollgate_testkit::RedisCluster;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_clients_keys_share_one_slot_and_clients_spread_over_every_master() {
    // Two of every algorithm an hour on Redis's clock, the third refused: within one hour.
    tollgate_testkit::clear_of_window_end(HOUR);
    let cluster = RedisCluster::start(3, 0);
    let store = common::connect_cluster(cluster.seed_urls(), StoreClock::Store).await;
    let rules: Vec<_> = Algorithm::ALL
        .iter()
        .map(|&a| rule(&format!("c-{a}"), a, 2, HOUR))
        .collect();
    let mut masters = HashSet::new();
    for n in 0..30u128 {
        let who = client(n);
        let checks: Vec<Check<'_>> = rules.iter().map(|rule| Check::new(who, rule, 1)).collect();
        // Six keys in one request: a cross-slot request would be refused by the cluster.
        for expect in [true, true, false] {
            let v = store.check(&checks, 0).await.expect("check");
            assert_eq!(v.allowed, expect, "client {n}");
        }
        let owners: HashSet<_> = rules
            .iter()
            .map(|r| cluster.master_of_key(&store.key(&who, r.name())))
            .collect();
        assert_eq!(owners.len(), 1, "client {n}: one slot, one master");
        masters.extend(owners);
    }
    assert_eq!(masters.len(), 3, "30 clients land on all three masters");
}

#[tokio::test]
async fn the_expiry_frequency_and_the_memory_policy_are_read_from_the_nodes() {
    let cluster = RedisCluster::start_with_args(3, 0, &common::ADVISED_ARGS);
    let store = common::connect_cluster(cluster.seed_urls(), StoreClock::Store).await;
    let hz = store.expiry_hz().await.expect("INFO server");
    assert!(!hz.is_empty() && hz.iter().all(|&hz| hz == 100), "{hz:?}");
    // The memory policy the same way (docs/operations.md, "Redis: memory").
    let limits = store.memory_limits().await.expect("INFO memory");
    let advised = (64 << 20, "volatile-ttl".to_string());
    assert!(
        !limits.is_empty() && limits.iter().all(|l| *l == advised),
        "{limits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_gateways_admit_exactly_the_limit_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let mut stores = Vec::new();
    for _ in 0..20 {
        stores.push(common::connect_cluster(cluster.seed_urls(), StoreClock::Store).await);
    }
    let r = Arc::new(rule("race", Algorithm::Gcra, 100, HOUR));
    for rep in 0..20u128 {
        let mut tasks = Vec::new();
        for i in 0..300 {
            let store = stores[i % stores.len()].clone();
            let r = r.clone();
            tasks.push(tokio::spawn(async move {
                let checks = [Check::new(client(1000 + rep), &r, 1)];
                store.check(&checks, 0).await
            }));
        }
        let mut allowed = 0;
        for t in tasks {
            allowed += usize::from(t.await.expect("task").expect("check").allowed);
        }
        assert_eq!(allowed, 100, "repetition {rep}");
    }
}

#[tokio::test]
async fn a_failover_is_survived_without_recreating_the_store() {
    let mut cluster = RedisCluster::start(3, 1);
    let store = common::connect_cluster(cluster.seed_urls(), StoreClock::Store).await;
    let r = rule("fo", Algorithm::TokenBucket, 1000, HOUR);
    let who = client(77);
    let checks = [Check::new(who, &r, 1)];
    assert!(store.check(&checks, 0).await.expect("check").allowed);
    let key = store.key(&who, r.name());
    let dead = cluster.kill_master_of_key(&key);
    // While the cluster notices and promotes the replica, calls fail (transiently) or, once
    // it is done, succeed; they never hang.
    let mut errors = 0;
    let mut recovered = false;
    for _ in 0..300 {
        match tokio::time::timeout(Duration::from_secs(10), store.check(&checks, 0)).await {
            Ok(Ok(v)) => {
                assert!(v.allowed);
                recovered = true;
                break;
            }
            Ok(Err(e)) => {
                assert!(e.is_transient(), "{e}");
                errors += 1;
            }
            Err(_) => panic!("a call hung for 10 s during a failover"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "no success within 300 attempts ({errors} errors)"
    );
    // The store may reach the promoted master before every node's view of the slots says
    // so: ask again for a bounded while (50 x 100 ms).
    let mut promoted = cluster.master_of_key(&key);
    for _ in 0..50 {
        if promoted.is_some_and(|p| p != dead) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        promoted = cluster.master_of_key(&key);
    }
    let promoted = promoted.expect("a master serves the key");
    assert_ne!(promoted, dead);
    // The promoted replica never had the script loaded by us: NOSCRIPT was answered by a
    // reload, and the next call uses EVALSHA again.
    let exists = cluster.nodes()[promoted].cli(&[
        "script",
        "exists",
        &plan_script_sha(&[RuleShape {
            limit: *r.limit(),
            mode: tollgate_core::Mode::Enforce,
        }])
        .expect("script"),
    ]);
    assert_eq!(exists.trim(), "1");
    assert!(store.check(&checks, 0).await.expect("check").allowed);
}

/// A plan whose two clients live in two slots, the second slot denying: the first slot's
/// charge is given back exactly (read back with a query), for every algorithm whose state can
/// be given back; a sliding algorithm is exact too as long as it is the only slot that cannot
/// be given back (its slot is called last). Slot order and the limits of this are in
/// docs/operations.md.
#[tokio::test]
async fn a_plan_across_two_slots_gives_back_the_first_slot_when_the_second_denies() {
    // Fixed windows of an hour on Redis's clock, read before and after: within one hour.
    tollgate_testkit::clear_of_window_end(HOUR);
    let cluster = RedisCluster::start(3, 0);
    let store = common::connect_cluster(cluster.seed_urls(), StoreClock::Store).await;
    let slot = |key: &str| cluster.nodes()[0].cli(&["cluster", "keyslot", key]);
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let first = rule(&format!("first-{algorithm}"), algorithm, 10, HOUR);
        // The denying rule: the same algorithm when it can be given back, else GCRA, so that
        // the slot of the sliding rule is the only one that cannot be given back.
        let second_alg = if algorithm.is_leasable() {
            algorithm
        } else {
            Algorithm::Gcra
        };
        let second = rule(&format!("second-{algorithm}"), second_alg, 2, HOUR);
        let a = client(10_000 + i as u128);
        let b = (0..1000u128)
            .map(|n| client(20_000 + 1000 * i as u128 + n))
            .find(|b| slot(&store.key(b, second.name())) != slot(&store.key(&a, first.name())))
            .expect("a client in another slot");
        let plan = [Check::new(a, &first, 1), Check::new(b, &second, 1)];
        for n in 0..2 {
            let v = store.check(&plan, 0).await.expect("check");
            assert!(v.allowed, "{algorithm}: request {n}");
        }
        let query = [Check::new(a, &first, 0)];
        let before = store.check(&query, 0).await.expect("query").decisions[0];
        assert_eq!(before.remaining, 8, "{algorithm}");
        for n in 0..3 {
            let v = store.check(&plan, 0).await.expect("check");
            assert!(
                !v.allowed,
                "{algorithm}: request {n} is over the second rule"
            );
            assert!(v.decisions[0].allowed && !v.decisions[1].allowed);
            assert_eq!(
                v.decisions[0].remaining, 8,
                "{algorithm}: reported uncharged"
            );
        }
        let after = store.check(&query, 0).await.expect("query").decisions[0];
        assert_eq!(
            after.remaining, before.remaining,
            "{algorithm}: the first slot was given back"
        );
    }
}

/// Quota checks in several slots are alternatives across them: while one of them allows, the
/// plan is allowed (the over one charged nothing); when every one is over, the plan is denied
/// and what the other slots charged is given back.
#[tokio::test]
async fn quota_checks_across_slots_deny_only_together_and_give_back_the_rest() {
    // Fixed windows of an hour on Redis's clock, read before and after: within one hour.
    tollgate_testkit::clear_of_window_end(HOUR);
    let cluster = RedisCluster::start(3, 0);
    let store = common::connect_cluster(cluster.seed_urls(), StoreClock::Store).await;
    let slot = |key: &str| cluster.nodes()[0].cli(&["cluster", "keyslot", key]);
    let user = rule("user", Algorithm::FixedWindow, 10, HOUR);
    let qa = rule("quota-a", Algorithm::FixedWindow, 2, HOUR);
    let qb = rule("quota-b", Algorithm::TokenBucket, 1, HOUR);
    let u = client(90_001);
    let mut slots = HashSet::new();
    slots.insert(slot(&store.key(&u, user.name())));
    let mut other = |name: &str, from: u128| {
        (0..1000u128)
            .map(|n| client(from + n))
            .find(|c| slots.insert(slot(&store.key(c, name))))
            .expect("a client in another slot")
    };
    let a = other(qa.name(), 91_000);
    let b = other(qb.name(), 92_000);
    let plan = [
        Check::new(u, &user, 1),
        Check::new(a, &qa, 1).quota(),
        Check::new(b, &qb, 1).quota(),
    ];
    let first = store.check(&plan, 0).await.expect("check");
    assert!(first.allowed);
    // quota-b is over, quota-a is not: allowed, quota-b charged nothing.
    let second = store.check(&plan, 0).await.expect("check");
    assert!(second.allowed && !second.decisions[2].allowed);
    assert_eq!(second.decisions[1].remaining, 0);
    let query = [Check::new(u, &user, 0)];
    let before = store.check(&query, 0).await.expect("query").decisions[0];
    assert_eq!(before.remaining, 8);
    // Both over: denied, with a retry time, and the user's slot given back.
    for n in 0..3 {
        let v = store.check(&plan, 0).await.expect("check");
        assert!(!v.allowed, "request {n}");
        assert!(v.retry_after(&plan).is_some(), "request {n}");
        assert_eq!(
            v.decisions[0].remaining, 8,
            "request {n}: reported uncharged"
        );
    }
    let after = store.check(&query, 0).await.expect("query").decisions[0];
    assert_eq!(after.remaining, before.remaining, "given back");
}

/// Nodes with a `timeout` close connections idle that many seconds: the store's PINGs keep
/// redis-rs's connection to every node busy, so the first plans after a quiet spell (with
/// `max_batch = 1`, all on those connections) are decided, not failed with "no connections
/// found", on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_fails_after_a_quiet_spell_longer_than_the_nodes_idle_timeout() {
    // The timeout is set once the cluster is up: `redis-cli --cluster create` holds connections
    // idle while the nodes join, and on a loaded machine a node closed them under it (the
    // whole test run then waited on it).
    let cluster = RedisCluster::start(3, 0);
    for node in cluster.nodes() {
        assert_eq!(node.cli(&["config", "set", "timeout", "1"]).trim(), "OK");
    }
    let config = tollgate_redis::RedisConfig::cluster(cluster.seed_urls())
        .with_max_batch(1)
        .with_key_prefix("test");
    let store = tollgate_redis::RedisStore::connect(config)
        .await
        .expect("connect");
    let r = rule("quiet", Algorithm::TokenBucket, 5, HOUR);
    // Clients on every master.
    let mut masters = HashSet::new();
    let clients: Vec<u128> = (0..64u128)
        .filter(|&n| masters.insert(cluster.master_of_key(&store.key(&client(n), "quiet"))))
        .collect();
    assert_eq!(masters.len(), 3);
    for &n in &clients {
        let checks = [Check::new(client(n), &r, 1)];
        assert!(store.check(&checks, 0).await.expect("check").allowed);
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for &n in &clients {
        let checks = [Check::new(client(n), &r, 1)];
        let v = store.check(&checks, 0).await;
        let v = v.unwrap_or_else(|e| panic!("client {n}: {e}"));
        assert_eq!(v.decisions[0].remaining, 3, "client {n}");
    }
}

/// A new form's script is loaded on every master (SCRIPT LOAD goes to each). Right after one
/// master restarted, before the keep-alive PING saw its connection drop, the load failed on
/// that connection and with it the first call of the form, for a client of a healthy master
/// (`broken pipe`, with the store's cluster client built without redis-rs's retries). A load
/// does the same twice as once, so it is sent again: the call is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_forms_first_call_on_a_healthy_master_survives_another_masters_restart() {
    let mut cluster = RedisCluster::start(3, 0);
    let config = tollgate_redis::RedisConfig::cluster(cluster.seed_urls())
        .with_max_batch(1)
        .with_call_timeout(Duration::from_secs(5));
    let store = tollgate_redis::RedisStore::connect(config)
        .await
        .expect("connect");
    let warm = rule("warm", Algorithm::TokenBucket, 1000, HOUR);
    let restarted = client(5);
    let v = store
        .check(&[Check::new(restarted, &warm, 1)], 0)
        .await
        .expect("warm");
    assert!(v.allowed);
    let node = cluster
        .master_of_key(&store.key(&restarted, "warm"))
        .expect("a master");
    let healthy = (0..1000u128)
        .map(client)
        .find(|c| cluster.master_of_key(&store.key(c, "warm")) != Some(node))
        .expect("a client of another master");
    cluster.node_mut(node).restart();
    let fresh = rule("fresh", Algorithm::SlidingWindowLog, 1000, HOUR);
    let v = store
        .check_bounded(&[Check::new(healthy, &fresh, 1)], 0)
        .await
        .expect("the healthy master's client is answered");
    assert!(v.allowed);
    assert_eq!(v.decisions[0].remaining, 999);
}

/// A store on `config`, with `max_batch` when given (else the default).
async fn connect_at(
    config: tollgate_redis::RedisConfig,
    max_batch: Option<usize>,
) -> tollgate_redis::RedisStore {
    let config = match max_batch {
        Some(b) => config.with_max_batch(b),
        None => config,
    };
    tollgate_redis::RedisStore::connect(config)
        .await
        .expect("connect")
}

/// What a client's plans got while a resharding ran: the client, how many were admitted, how
/// many it sent, and the failures.
type Outcome = (u128, u32, usize, Vec<tollgate_redis::RedisStoreError>);

/// Each of `clients` asks `plan` (a bucket and a window, one unit each) every 3 ms while
/// `reshard` runs on a thread of its own, and 300 ms past it: each client's outcome, and what
/// `reshard` returned.
async fn asking_while<T: Send + 'static>(
    store: &tollgate_redis::RedisStore,
    rules: [&Arc<Rule>; 2],
    clients: &[u128],
    reshard: impl FnOnce() -> T + Send + 'static,
) -> (Vec<Outcome>, T) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for &w in clients {
        let (store, stop) = (store.clone(), stop.clone());
        let (bucket, window) = (Arc::clone(rules[0]), Arc::clone(rules[1]));
        tasks.push(tokio::spawn(async move {
            let plan = [
                Check::new(client(w), &bucket, 1),
                Check::new(client(w), &window, 1),
            ];
            let (mut admitted, mut sent, mut errors) = (0u32, 0usize, Vec::new());
            // Bounded: about 4 s at most (a resharding here takes 1-2 s).
            for _ in 0..1000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                sent += 1;
                match store.check(&plan, 0).await {
                    Ok(v) => admitted += u32::from(v.allowed),
                    Err(e) => errors.push(e),
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            (w, admitted, sent, errors)
        }));
    }
    let done = tokio::task::spawn_blocking(reshard)
        .await
        .expect("the resharding's thread");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("task"));
    }
    (outcomes, done)
}

/// Whether `e` is a TRYAGAIN, or an ASK after the resends: a call whose keys a slot being
/// migrated has split between two nodes (each sends it on to the other, or refuses it).
fn split(e: &tollgate_redis::RedisStoreError) -> bool {
    use redis::ServerErrorKind::{Ask, TryAgain};
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<redis::RedisError>())
        .is_some_and(|r| matches!(r.kind(), redis::ErrorKind::Server(TryAgain | Ask)))
}

/// Every client admitted five in all (the movers one of them before the resharding), and few
/// failures (at most one call in a hundred: a store that cannot follow an ASK fails more
/// than one in twenty), each one `expected` says may happen.
fn exact_and_few_failures(
    what: &str,
    outcomes: &[Outcome],
    movers: &[u128],
    expected: fn(&tollgate_redis::RedisStoreError) -> bool,
) {
    let (mut failed, mut calls) = (0, 0);
    for (w, admitted, sent, errors) in outcomes {
        let already = u32::from(movers.contains(w));
        assert_eq!(admitted + already, 5, "{what}: client {w}");
        assert!(
            errors.iter().all(expected),
            "{what}: client {w}: {errors:?}"
        );
        failed += errors.len();
        calls += sent;
    }
    assert!(
        failed * 100 <= calls,
        "{what}: {failed} of {calls} calls failed"
    );
}

/// Each of `clients` is answered after a resharding, its bucket (`rule`) empty: the store did
/// not stop answering (redis-rs's client once stopped for good). A call that times out is
/// asked again, up to five times: on a loaded machine (once in twelve runs with four copies
/// of this test at once) the first call after the slot moved at `max_batch = 1` outlived its
/// 2 s, the stall the phase itself allows a call. A store that stopped answering times out
/// all five.
async fn answered(
    what: &str,
    store: &tollgate_redis::RedisStore,
    rule: &Arc<Rule>,
    clients: &[u128],
) {
    for &w in clients {
        let mut tries = 1;
        let v = loop {
            match store.check(&[Check::new(client(w), rule, 0)], 0).await {
                Ok(v) => break v,
                Err(e) if e.kind() == ErrorKind::Timeout && tries < 5 => tries += 1,
                Err(e) => panic!("{what}: client {w} after, try {tries}: {e}"),
            }
        };
        assert_eq!(v.decisions[0].remaining, 0, "{what}: client {w} after");
    }
}

/// A bucket of five and a window of eight an hour, named after `phase`, of which each of
/// `movers` has taken one: their state exists before the resharding.
async fn one_taken(
    store: &tollgate_redis::RedisStore,
    phase: &str,
    movers: &[u128],
) -> (Arc<Rule>, Arc<Rule>) {
    let bucket = Arc::new(rule(&format!("{phase}-b"), Algorithm::TokenBucket, 5, HOUR));
    let window = Arc::new(rule(&format!("{phase}-w"), Algorithm::FixedWindow, 8, HOUR));
    for &w in movers {
        let plan = [
            Check::new(client(w), &bucket, 1),
            Check::new(client(w), &window, 1),
        ];
        assert!(store.check(&plan, 0).await.expect("first").allowed);
    }
    (bucket, window)
}

/// A cluster scaled out and back in under load. Out: a master added after the store
/// connected (redis-rs has no connection to it, and it serves no slot until the end), then the
/// keys of a slot moved to it one at a time while twelve clients of that slot and forty of
/// its node's others keep asking, two rules a plan. In: the slot moved back the same way, and
/// the master removed (`--cluster del-node`, its process gone).
///
/// Before the store followed MOVED and ASK on connections of its own (`resend.rs`), every
/// call that met an ASK failed (redis-rs reaches by address only nodes it knows), and with
/// `max_batch = 1` redis-rs's connection then answered nothing for good (every later call
/// timed out); and a batch that followed an ASK (its one declared key moved) read keys of the
/// slot still on the owner as absent on the new node and wrote them there, so their MIGRATE
/// found them (BUSYKEY) and those clients had two buckets. Now each client is admitted its
/// five exactly, the keys all move, every client is answered after each way, and at most one
/// call in a hundred fails: where a client's two keys are split between the nodes past the
/// resends, a call that outlived its timeout, and calls in flight to the master removed. And
/// the new master, which had none of the scripts, never ran one sent whole (`EVAL`): each was
/// loaded there when a redirected call met NOSCRIPT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_scaled_out_and_in_under_load_decides_exactly_and_keeps_answering() {
    for max_batch in [None, Some(1)] {
        let mut cluster = RedisCluster::start(3, 0);
        let config = tollgate_redis::RedisConfig::cluster(cluster.seed_urls())
            .with_call_timeout(Duration::from_secs(2));
        let store = connect_at(config, max_batch).await;
        let slot = u32::from(client(1).cluster_slot());
        let movers: Vec<u128> = (1..2_000_000u128)
            .filter(|&w| u32::from(client(w).cluster_slot()) == slot)
            .take(12)
            .collect();
        assert_eq!(movers.len(), 12);
        let from = cluster.master_of_slot(slot).expect("the slot's master");
        let others: Vec<u128> = (3_000_000u128..3_100_000)
            .filter(|&w| {
                let s = u32::from(client(w).cluster_slot());
                s != slot && cluster.master_of_slot(s) == Some(from)
            })
            .take(40)
            .collect();
        let clients: Vec<u128> = movers.iter().chain(&others).copied().collect();
        let keys_of_slot = |c: &RedisCluster, node: usize| {
            c.nodes()[node]
                .cli(&["cluster", "countkeysinslot", &slot.to_string()])
                .trim()
                .to_string()
        };

        // Out.
        let (bucket, window) = one_taken(&store, "out", &movers).await;
        let rules = [&bucket, &window];
        let new = cluster.add_master();
        let cluster = Arc::new(cluster);
        let mover = Arc::clone(&cluster);
        let (outcomes, moved) = asking_while(&store, rules, &clients, move || {
            mover.move_slot(slot, new, Duration::from_millis(30))
        })
        .await;
        let what = format!("out, max_batch {max_batch:?}");
        moved.unwrap_or_else(|e| panic!("{what}: {e}"));
        // Only a client's two keys split between the nodes for longer than the resends wait,
        // or a call that outlived its timeout (on a loaded machine, once in about twenty runs,
        // every call of `max_batch = 1` in flight timed out at once as the slot moved: redis-rs
        // holds its client's lock while it reads the new slot map and connects).
        let expected =
            |e: &tollgate_redis::RedisStoreError| split(e) || e.kind() == ErrorKind::Timeout;
        exact_and_few_failures(&what, &outcomes, &movers, expected);
        answered(&what, &store, rules[0], &movers).await;
        assert_eq!(
            keys_of_slot(&cluster, new),
            "24",
            "{what}: the movers' keys"
        );
        // Redirected there before it served a slot, the plans met no script: each was loaded
        // there and run by its SHA, none sent whole.
        let stats = cluster.nodes()[new].cli(&["info", "commandstats"]);
        assert!(
            !stats.contains("cmdstat_eval:"),
            "{what}: EVAL sent:\n{stats}"
        );

        // In.
        let (bucket, window) = one_taken(&store, "in", &movers).await;
        let rules = [&bucket, &window];
        let Ok(mut cluster) = Arc::try_unwrap(cluster) else {
            panic!("the cluster is still shared");
        };
        let (outcomes, removed) = asking_while(&store, rules, &clients, move || {
            let moved = cluster.move_slot(slot, from, Duration::from_millis(30));
            let removed = moved.is_ok() && cluster.remove_master(new);
            (moved, removed, cluster)
        })
        .await;
        let (moved, removed, cluster) = removed;
        let what = format!("in, max_batch {max_batch:?}");
        moved.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(removed, "{what}: the master was not removed");
        // Also calls in flight to the master as it went: the store's node table (read at
        // most once a second) may still have sent its old slot's plans there. And, as out, a
        // call that outlived its timeout while redis-rs read the new slot map (in a full
        // `scripts/test` run, once: a client's call at `max_batch = 1`).
        let expected = |e: &tollgate_redis::RedisStoreError| {
            split(e) || matches!(e.kind(), ErrorKind::Connection | ErrorKind::Timeout)
        };
        exact_and_few_failures(&what, &outcomes, &movers, expected);
        assert_eq!(
            keys_of_slot(&cluster, from),
            "48",
            "{what}: both rounds' keys"
        );
    }
}

/// A master added to scale a cluster out has loaded none of the store's scripts, and serves
/// no slot until its first is handed over, so a SCRIPT LOAD sent to every master does not
/// reach it. A plan redirected there (ASK while the slot moves, MOVED after) is answered
/// NOSCRIPT: the script is loaded on the node the redirection named, and the plan runs by its
/// SHA, never as EVAL, which a user without `+eval` may not send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_redirected_to_a_new_master_loads_its_script_there_and_never_sends_eval() {
    for max_batch in [None, Some(1)] {
        let mut cluster = RedisCluster::start(3, 0);
        let config = tollgate_redis::RedisConfig::cluster(cluster.seed_urls())
            .with_clock(StoreClock::Local)
            .with_key_prefix("new")
            .with_call_timeout(Duration::from_secs(5));
        let store = connect_at(config, max_batch).await;
        let bucket = rule("scaled", Algorithm::TokenBucket, 5, HOUR);
        let who = client(1);
        let slot = u32::from(who.cluster_slot());
        let take = |n: u64| {
            let store = &store;
            let bucket = &bucket;
            async move {
                match store.check(&[Check::new(who, bucket, 1)], n).await {
                    Ok(v) => (v.allowed, v.decisions[0].remaining),
                    Err(e) => panic!("{max_batch:?}, plan {n}: {e}"),
                }
            }
        };
        assert_eq!(take(0).await, (true, 4), "{max_batch:?}");
        let new = cluster.add_master();
        assert!(cluster.begin_migration(slot, new));
        let from = cluster.master_of_slot(slot).expect("an owner");
        let key = store.key(&who, "scaled");
        let port = cluster.nodes()[new].port().to_string();
        let out = cluster.nodes()[from].cli(&["migrate", "127.0.0.1", &port, &key, "0", "5000"]);
        assert!(out.contains("OK"), "{out}");
        // ASK: the key is on the importing node, which has no script yet.
        assert_eq!(take(1).await, (true, 3), "{max_batch:?}: after an ASK");
        assert!(cluster.move_empty_slot(slot, new));
        // MOVED: the slot is the new master's.
        assert_eq!(take(2).await, (true, 2), "{max_batch:?}: after a MOVED");
        let stats = cluster.nodes()[new].cli(&["info", "commandstats"]);
        assert!(
            stats.contains("cmdstat_evalsha:calls="),
            "{max_batch:?}: the plans ran on the new master:\n{stats}"
        );
        assert!(
            !stats.contains("cmdstat_eval:"),
            "{max_batch:?}: a script sent whole to the new master:\n{stats}"
        );
        // Scaled in again: the slot back (a plan sent there by the map that has the slot on
        // the new master, and sent on), then the new master gone. A NOSCRIPT now (the old
        // owner flushed) also loads on the nodes noted before, the gone one among them: that
        // load fails, and the plan does not.
        cluster
            .move_slot(slot, from, Duration::ZERO)
            .unwrap_or_else(|e| panic!("{max_batch:?}: {e}"));
        assert_eq!(take(3).await, (true, 1), "{max_batch:?}: moved back");
        assert!(cluster.remove_master(new), "{max_batch:?}");
        let flushed = cluster.nodes()[from].cli(&["script", "flush"]);
        assert!(flushed.contains("OK"), "{flushed}");
        assert_eq!(take(4).await, (true, 0), "{max_batch:?}: after a flush");
    }
}

/// redis-rs's cluster client can stop taking calls for good (`watchdog.rs`: its recovery after
/// a MOVED waits on a lock a call it no longer polls holds; seen in one scale-out of twenty at
/// `max_batch = 1`). Made so here at will: its connection swapped for one to another Cluster,
/// whose nodes are then paused, so every call on it goes unanswered. The store's watchdog
/// builds the client again from the store's own seeds within seconds, and the bucket carries on
/// exactly: the calls that timed out never ran on the store's Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_that_answers_nothing_is_built_again_and_decides_exactly() {
    let cluster = RedisCluster::start(3, 0);
    let silent = RedisCluster::start(3, 0);
    let config = tollgate_redis::RedisConfig::cluster(cluster.seed_urls())
        .with_call_timeout(Duration::from_millis(300));
    // Every plan on redis-rs's client.
    let store = connect_at(config, Some(1)).await;
    let bucket = rule("watched", Algorithm::TokenBucket, 5, HOUR);
    let who = client(7);
    let plan = [Check::new(who, &bucket, 1)];
    let take = || store.check_bounded(&plan, 0);
    assert_eq!(take().await.expect("first").decisions[0].remaining, 4);
    assert_eq!(store.cluster_client_rebuilds(), 0);

    assert!(
        store
            .replace_cluster_connection_for_tests(&silent.seed_urls())
            .await
    );
    for node in silent.nodes() {
        node.pause();
    }
    let e = take().await.expect_err("a silent client answers nothing");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");

    // Bounded: the watchdog acts after 2 s of silence, probing every 0.5-1 s.
    let began = std::time::Instant::now();
    let answer = loop {
        match take().await {
            Ok(v) => break v,
            Err(e) if e.kind() == ErrorKind::Timeout && began.elapsed() < HALF_MINUTE => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("still not answered after {:?}: {e}", began.elapsed()),
        }
    };
    assert_eq!(store.cluster_client_rebuilds(), 1);
    assert!(answer.allowed);
    assert_eq!(
        answer.decisions[0].remaining, 3,
        "the timed-out calls ran nowhere"
    );
    for left in [2, 1, 0] {
        assert_eq!(take().await.expect("after").decisions[0].remaining, left);
    }
    assert!(!take().await.expect("the sixth").allowed);
    for node in silent.nodes() {
        node.resume();
    }
}

/// The whole Cluster paused for 6 s (every node silent, as when the network to it is cut):
/// the watchdog finds redis-rs's client silent, and its rebuilds cannot connect (they wait
/// longer each time), so the old client stays, and once the nodes answer again the store
/// decides at once. At most one rebuild lands: one under way as the nodes resume may connect.
/// The calls that timed out meanwhile sat in the nodes' sockets and ran as they resumed (a
/// timeout says nothing about whether a call ran), so the bucket is down by at most those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_paused_whole_decides_again_once_it_answers() {
    let cluster = RedisCluster::start(3, 0);
    let config = tollgate_redis::RedisConfig::cluster(cluster.seed_urls())
        .with_call_timeout(Duration::from_millis(300));
    let store = connect_at(config, Some(1)).await;
    let bucket = rule("outage", Algorithm::TokenBucket, 1_000, HOUR);
    let plan = [Check::new(client(8), &bucket, 1)];
    let take = || store.check_bounded(&plan, 0);
    assert_eq!(take().await.expect("first").decisions[0].remaining, 999);
    for node in cluster.nodes() {
        node.pause();
    }
    let paused = std::time::Instant::now();
    let mut unanswered = 0;
    while paused.elapsed() < Duration::from_secs(6) {
        let e = take().await.expect_err("a paused Cluster answers nothing");
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        unanswered += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for node in cluster.nodes() {
        node.resume();
    }
    let resumed = std::time::Instant::now();
    let answer = loop {
        match take().await {
            Ok(v) => break v,
            Err(e) if resumed.elapsed() < HALF_MINUTE => {
                assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
                unanswered += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "not answered {:?} after the nodes resumed: {e}",
                resumed.elapsed()
            ),
        }
    };
    assert!(store.cluster_client_rebuilds() <= 1);
    assert!(answer.allowed);
    let left = answer.decisions[0].remaining;
    assert!(
        (998 - unanswered..=998).contains(&left),
        "{left} left after {unanswered} unanswered calls"
    );
    let next = take().await.expect("after").decisions[0].remaining;
    assert_eq!(next, left - 1);
}

const HALF_MINUTE: Duration = Duration::from_secs(30);
