//! Past the bound on batch scripts: 256 lists of plan forms get one each, per process, and a
//! batch whose list comes after runs its plans one call each. Plans of many forms in every
//! order (a client can choose which policies its requests match) must not turn that into one
//! plan a round trip: those calls leave together, and decide exactly. This file is its own
//! test binary, so no other test shares the process's exhausted cache.

mod common;

use common::{client, rule, Rng};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Algorithm, Check, Rule};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::RedisServer;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);
/// Only a guard against a hung test; nothing asserts on time.
const HANG: Duration = Duration::from_secs(60);

/// The batch scripts the cache gives at most (`batch_script.rs`, `BATCH_SCRIPTS`).
const BOUND: usize = 256;

fn cached_scripts(server: &RedisServer) -> usize {
    common::cached_scripts(|a| server.cli(a)) as usize
}

/// A two-rule plan of the given first and second rules (each enforced or shadow): 100 forms.
fn plan<'a>(who: u128, first: &'a Rule, second: &'a Rule, shadow: (bool, bool)) -> Vec<Check<'a>> {
    let check = |r: &'a Rule, s: bool| {
        let c = Check::new(client(who), r, 1);
        if s {
            c.shadow()
        } else {
            c
        }
    };
    vec![check(first, shadow.0), check(second, shadow.1)]
}

/// `n` plans at once, each of a random form, for random clients of many: all must succeed.
async fn burst(store: &RedisStore, rules: &Arc<Vec<Rule>>, rng: &mut Rng, n: usize) {
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (store, rules) = (store.clone(), Arc::clone(rules));
        let (a, b) = (rng.range(0, 4) as usize, 5 + rng.range(0, 4) as usize);
        let shadow = (rng.chance(50), rng.chance(50));
        let who = u128::from(rng.range(1_000, 50_000));
        tasks.push(tokio::spawn(async move {
            let checks = plan(who, &rules[a], &rules[b], shadow);
            store.check(&checks, 0).await.map(|v| v.allowed)
        }));
    }
    for t in tasks {
        let v = tokio::time::timeout(HANG, t)
            .await
            .expect("hung")
            .expect("task");
        assert!(v.is_ok(), "a plan failed: {v:?}");
    }
}

async fn connect(url: String) -> RedisStore {
    RedisStore::connect(
        RedisConfig::standalone(url)
            .with_key_prefix("bound")
            .with_call_timeout(Duration::from_secs(20)),
    )
    .await
    .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_batch_scripts_bound_plans_still_leave_together_and_decide_exactly() {
    let server = RedisServer::start();
    let store = connect(server.url()).await;
    // Rules 0-4 come first in a plan, 5-9 second: one of each algorithm in each place.
    let rules: Arc<Vec<Rule>> = Arc::new(
        (0..10)
            .map(|i| {
                let algorithm = Algorithm::ALL[i % 5];
                rule(&format!("r{i}"), algorithm, 10_000, HOUR)
            })
            .collect(),
    );
    // Whatever the store loads on its own (before any plan).
    let own = cached_scripts(&server);
    let mut rng = Rng::new(25);
    // Bursts of plans of random forms make batches of random lists of up to four forms, far
    // more lists than the cache holds.
    let mut rounds = 0;
    while cached_scripts(&server) < own + BOUND && rounds < 20 {
        burst(&store, &rules, &mut rng, 3_000).await;
        rounds += 1;
    }
    let reached = cached_scripts(&server);
    assert!(
        reached >= own + BOUND,
        "{rounds} bursts loaded only {reached} scripts"
    );
    // The plans' own scripts (at most 100 forms) and the batch scripts (at most 256).
    assert!(
        reached <= own + BOUND + 100,
        "{reached} scripts: the bound did not hold"
    );

    // The plans below count a day on Redis's clock and are read back after their race: a
    // GCRA of 1,000 a day frees a unit every 86.4 s (of 1,000 an hour, every 3.6 s: a slow
    // machine could see one come back), and the fixed window is clear of the day's end from
    // here on (the bursts above may outlast the margin checked when the server started).
    tollgate_testkit::clear_of_window_end(DAY);

    // Past the bound, plans of a form no batch has had (three rules) find no batch script:
    // queued behind a call the relay holds, they leave one call each, written together, and
    // admit exactly the limit.
    let relay = common::relay::Relay::start(server.port()).await;
    let store = connect(relay.url()).await;
    let hot: Arc<Vec<Rule>> = Arc::new(vec![
        rule("hot-0", Algorithm::TokenBucket, 50, DAY),
        rule("hot-1", Algorithm::FixedWindow, 1_000, DAY),
        rule("hot-2", Algorithm::Gcra, 1_000, DAY),
    ]);
    let three = |who: u128, rules: &Arc<Vec<Rule>>, store: &RedisStore| {
        let (store, rules) = (store.clone(), Arc::clone(rules));
        tokio::spawn(async move {
            let checks: Vec<Check<'_>> = rules
                .iter()
                .map(|r| Check::new(client(who), r, 1))
                .collect();
            store.check(&checks, 0).await
        })
    };
    // The form's own script loaded, and the own connection open.
    three(8, &hot, &store).await.expect("task").expect("check");
    relay.hold();
    let before = relay.calls();
    let mut tasks = vec![three(7, &hot, &store)];
    relay.wait_for_calls(before + 1).await;
    tasks.extend((0..299).map(|_| three(7, &hot, &store)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.release();
    let mut allowed = 0;
    for t in tasks {
        match tokio::time::timeout(HANG, t)
            .await
            .expect("hung")
            .expect("task")
        {
            Ok(v) => allowed += usize::from(v.allowed),
            Err(e) => panic!("a plan failed: {e}"),
        }
    }
    assert_eq!(allowed, 50, "the token bucket of 50");
    let together = relay.most_calls_written_together();
    assert!(
        together >= 2,
        "the plans without a batch script left one a round trip ({together} together at most)"
    );
    let after = three(7, &hot, &store).await.expect("task").expect("check");
    assert!(!after.allowed);
    // All-or-nothing: the other two rules were charged with the first, 50 times.
    assert_eq!(after.decisions[1].remaining, 1_000 - 50);
    assert_eq!(after.decisions[2].remaining, 1_000 - 50);
    // No batch script was made for them: the three-rule form's own script is the one more.
    assert_eq!(cached_scripts(&server), reached + 1);
}
