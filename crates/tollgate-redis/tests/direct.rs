//! The store's own connection for coalesced calls (`src/direct.rs`) against a real
//! redis-server: which connection the calls take (on a Cluster, each node's own), credentials
//! and database from the URL, a Unix socket, replies owed to callers that gave up, and servers
//! that close connections.

mod common;

use common::{client, rule};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Algorithm, Check, Rule};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::{RedisCluster, RedisServer};

const HOUR: Duration = Duration::from_secs(3600);

/// The lines of `CLIENT LIST` other than redis-cli's own.
fn store_clients(server: &RedisServer, auth: &[&str]) -> Vec<String> {
    let mut args: Vec<&str> = auth.to_vec();
    args.extend(["client", "list"]);
    server
        .cli(&args)
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .map(str::to_string)
        .collect()
}

/// Whether some line of `clients` holds every one of `parts`.
fn any_with(clients: &[String], parts: &[&str]) -> bool {
    clients.iter().any(|l| parts.iter().all(|p| l.contains(p)))
}

async fn remaining(store: &RedisStore, r: &Rule, who: u128) -> u64 {
    let v = tokio::time::timeout(
        Duration::from_secs(10),
        store.check(&[Check::new(client(who), r, 1)], 0),
    )
    .await
    .expect("no hang")
    .expect("check");
    v.decisions[0].remaining
}

#[tokio::test]
async fn coalesced_calls_take_the_stores_own_connection_and_max_batch_1_has_none() {
    let server = RedisServer::start();
    let r = rule("own", Algorithm::TokenBucket, 10, HOUR);
    let store = RedisStore::connect(RedisConfig::standalone(server.url()))
        .await
        .expect("connect");
    assert_eq!(remaining(&store, &r, 1).await, 9);
    let clients = store_clients(&server, &[]);
    assert_eq!(clients.len(), 2, "{clients:?}");
    // `cmd=eval` is EVAL or EVALSHA: the plan's first call loads its script (NOSCRIPT, then
    // EVAL) on the connection that runs it.
    assert_eq!(
        clients.iter().filter(|l| l.contains("cmd=eval")).count(),
        1,
        "one connection ran the plan: {clients:?}"
    );
    assert!(
        any_with(&clients, &[" name=tollgate-batch ", "cmd=eval"]),
        "the plan ran on the store's own, named connection: {clients:?}"
    );
    drop(store);

    let one = RedisStore::connect(RedisConfig::standalone(server.url()).with_max_batch(1))
        .await
        .expect("connect");
    assert_eq!(remaining(&one, &r, 1).await, 8);
    // The first store's connections close as it drops; then only the second's is left.
    let mut left = Vec::new();
    for _ in 0..50 {
        left = store_clients(&server, &[]);
        if left.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        left.len(),
        1,
        "max_batch = 1 keeps one connection: {left:?}"
    );
    assert!(!left[0].contains("tollgate-batch"), "{left:?}");
}

#[tokio::test]
async fn the_own_connection_authenticates_as_the_urls_user_in_its_database() {
    let server = RedisServer::start_with_args(&["--requirepass", "adm1n"]);
    let admin = ["-a", "adm1n", "--no-auth-warning"];
    let mut acl: Vec<&str> = admin.to_vec();
    acl.extend(["acl", "setuser", "gw", "on", ">pw-9x", "~*", "+@all"]);
    server.cli(&acl);
    let url = format!("redis://gw:pw-9x@127.0.0.1:{}/3", server.port());
    let store = RedisStore::connect(RedisConfig::standalone(url))
        .await
        .expect("connect");
    let r = rule("db", Algorithm::Gcra, 5, HOUR);
    assert_eq!(remaining(&store, &r, 7).await, 4);
    let clients = store_clients(&server, &admin);
    let planner = clients
        .iter()
        .find(|l| l.contains("cmd=eval"))
        .unwrap_or_else(|| panic!("no connection ran the plan: {clients:?}"));
    assert!(planner.contains(" user=gw "), "{planner}");
    assert!(planner.contains(" db=3 "), "{planner}");
    let mut keys: Vec<&str> = admin.to_vec();
    keys.extend(["-n", "3", "dbsize"]);
    assert_eq!(server.cli(&keys).trim(), "1", "the key is in database 3");
    let mut zero: Vec<&str> = admin.to_vec();
    zero.extend(["-n", "0", "dbsize"]);
    assert_eq!(server.cli(&zero).trim(), "0");

    // A user whose password changes: the next connection is refused as an auth error, not a
    // transient one, and the message carries no password.
    let mut change: Vec<&str> = admin.to_vec();
    change.extend(["acl", "setuser", "gw", "resetpass", ">other"]);
    server.cli(&change);
    let mut kill: Vec<&str> = admin.to_vec();
    kill.extend(["client", "kill", "user", "gw"]);
    server.cli(&kill);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = store
        .check(&[Check::new(client(8), &r, 1)], 0)
        .await
        .expect_err("the old password is refused");
    assert!(!err.is_transient(), "{err}");
    assert!(!format!("{err:?}").contains("pw-9x"), "{err:?}");
}

/// A least-privilege ACL user may not run CLIENT: the own connection then stays unnamed and
/// serves as well (naming it is for operators, not a condition of use).
#[tokio::test]
async fn a_user_refused_client_commands_still_gets_the_own_connection() {
    let server = RedisServer::start_with_args(&["--requirepass", "adm1n"]);
    let admin = ["-a", "adm1n", "--no-auth-warning"];
    let mut acl: Vec<&str> = admin.to_vec();
    acl.extend([
        "acl", "setuser", "lean", "on", ">pw-3k", "~*", "+@all", "-client",
    ]);
    server.cli(&acl);
    let url = format!("redis://lean:pw-3k@127.0.0.1:{}", server.port());
    let store = RedisStore::connect(RedisConfig::standalone(url))
        .await
        .expect("connect");
    let r = rule("lean", Algorithm::TokenBucket, 3, HOUR);
    for left in [2, 1, 0] {
        assert_eq!(remaining(&store, &r, 5).await, left);
    }
    let clients = store_clients(&server, &admin);
    assert!(
        any_with(&clients, &[" name= ", " user=lean ", "cmd=evalsha"]),
        "the plans ran on the own connection, unnamed: {clients:?}"
    );
    assert!(!any_with(&clients, &["tollgate-batch"]), "{clients:?}");
}

/// The commands the store runs, and the keys it touches, are all an ACL user needs (the list
/// docs/operations.md gives): no EVAL, which the store never sends. Such a user is served at
/// `max_batch` 1 (redis-rs's connection) and 64 (the own connection, one round of calls written
/// together and plans alone), on a fresh server and after the server lost its scripts (`SCRIPT
/// FLUSH`, as after a restart or a failover), and an operator's reset deletes a client's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_user_without_eval_is_served_through_a_flush() {
    let server = RedisServer::start_with_args(&["--requirepass", "adm1n"]);
    let admin = ["-a", "adm1n", "--no-auth-warning"];
    let mut acl: Vec<&str> = admin.to_vec();
    acl.extend([
        "acl",
        "setuser",
        "gw",
        "on",
        ">pw-7q",
        "~tg:*",
        "resetchannels",
        "-@all",
    ]);
    acl.extend(LEAST_PRIVILEGE);
    assert_eq!(server.cli(&acl).trim(), "OK");
    let mut flush: Vec<&str> = admin.to_vec();
    flush.extend(["script", "flush"]);
    let url = format!("redis://gw:pw-7q@127.0.0.1:{}", server.port());
    let tb = Arc::new(rule("acl-tb", Algorithm::TokenBucket, 100, HOUR));
    let gcra = Arc::new(rule("acl-gcra", Algorithm::Gcra, 100, HOUR));
    for max_batch in [1, 64] {
        let config = RedisConfig::standalone(url.clone())
            .with_max_batch(max_batch)
            .with_key_prefix("tg");
        let store = RedisStore::connect(config).await.expect("connect");
        store.ping().await.expect("ping");
        let who = 1_000 * max_batch as u128;
        // 20 plans of each of two forms at once, then, after a flush, 20 more of each.
        for round in 0..2 {
            if round == 1 {
                server.cli(&flush);
            }
            let tasks: Vec<_> = (0..40)
                .map(|i| {
                    let (store, tb, gcra) = (store.clone(), tb.clone(), gcra.clone());
                    tokio::spawn(async move {
                        let checks = if i % 2 == 0 {
                            vec![Check::new(client(who), &tb, 1)]
                        } else {
                            vec![
                                Check::new(client(who), &tb, 1),
                                Check::new(client(who), &gcra, 1),
                            ]
                        };
                        store.check(&checks, 0).await.map(|v| v.allowed)
                    })
                })
                .collect();
            for t in tasks {
                let allowed = tokio::time::timeout(Duration::from_secs(10), t)
                    .await
                    .expect("no hang")
                    .expect("task");
                assert!(allowed.expect("decided"), "max_batch {max_batch}");
            }
        }
        // 80 of the token bucket's 100 taken, 40 of GCRA's; one more of each.
        assert_eq!(
            remaining(&store, &tb, who).await,
            100 - 81,
            "max_batch {max_batch}"
        );
        assert_eq!(
            remaining(&store, &gcra, who).await,
            100 - 41,
            "max_batch {max_batch}"
        );
        assert!(store.reset(&client(who), "acl-tb").await.expect("reset"));
        assert_eq!(
            remaining(&store, &tb, who).await,
            99,
            "max_batch {max_batch}"
        );
    }
}

/// Behind Sentinel, the URL's user also authenticates to the sentinels (it asks them where the
/// master is) and asks the master its role: with what docs/operations.md lists for Sentinel
/// ([`LEAST_PRIVILEGE`] and `ROLE` on the data nodes, `SENTINEL` on the sentinels) it is served,
/// again after the master lost its scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_the_least_privilege_user_is_served_through_a_flush() {
    let set = tokio::task::spawn_blocking(tollgate_testkit::RedisSentinels::start)
        .await
        .expect("sentinels");
    // redis-cli on any port of the set (a sentinel, or the master, which `set` lends mutably).
    let cli_at =
        |port: u16, args: &[&str]| tollgate_testkit::redis_cli(port, args).trim().to_string();
    let user = [
        "acl",
        "setuser",
        "gw",
        "on",
        ">pw-s4",
        "~tg:*",
        "resetchannels",
        "-@all",
    ];
    let master = set.master_port().expect("a master");
    for port in [master, set.replica().port()] {
        let mut acl = user.to_vec();
        acl.push("+role");
        acl.extend(LEAST_PRIVILEGE);
        assert_eq!(cli_at(port, &acl), "OK");
    }
    let mut urls = Vec::new();
    for url in set.sentinel_urls() {
        let port: u16 = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        let mut acl = user.to_vec();
        acl.extend(["+sentinel", "+role"]);
        assert_eq!(cli_at(port, &acl), "OK");
        urls.push(url.replace("redis://", "redis://gw:pw-s4@"));
    }
    let r = rule("acl-s", Algorithm::TokenBucket, 10, HOUR);
    for max_batch in [1, 64] {
        let config = RedisConfig::sentinel(urls.clone(), set.master_name())
            .with_max_batch(max_batch)
            .with_key_prefix("tg");
        let store = RedisStore::connect(config).await.expect("connect");
        let who = max_batch as u128;
        assert_eq!(remaining(&store, &r, who).await, 9, "max_batch {max_batch}");
        assert_eq!(cli_at(master, &["script", "flush"]), "OK");
        assert_eq!(remaining(&store, &r, who).await, 8, "max_batch {max_batch}");
    }
}

/// What docs/operations.md tells operators a gateway's Redis ACL user needs (besides its keys,
/// `~<key_prefix>:*`), on a standalone server.
const LEAST_PRIVILEGE: [&str; 12] = [
    "+evalsha",
    "+script|load",
    "+script|exists",
    "+ping",
    "+info",
    "+del",
    "+client|setname",
    "+get",
    "+set",
    "+mget",
    "+time",
    "+exists",
];

/// On a Cluster, each node's coalesced calls go on the store's own connection to that node
/// (named, as on a standalone server), at the address the node table gives; with
/// `max_batch = 1` there is none. Every plan is decided exactly the same either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_each_node_gets_the_stores_own_connection() {
    let cluster = RedisCluster::start(3, 0);
    let r = rule("nodes", Algorithm::TokenBucket, 4, HOUR);
    // Clients on every master, each asked five times: four admitted, the fifth refused.
    let masters = cluster.master_indices();
    let mut who: Vec<u128> = Vec::new();
    for &m in &masters {
        who.extend(common::clients_of(&cluster, m, 1_000).take(3));
    }
    let store = RedisStore::connect(RedisConfig::cluster(cluster.seed_urls()))
        .await
        .expect("connect");
    for &w in &who {
        for left in [3, 2, 1, 0, 0] {
            assert_eq!(remaining(&store, &r, w).await, left, "client {w}");
        }
    }
    for &m in &masters {
        let clients = store_clients(&cluster.nodes()[m], &[]);
        assert!(
            any_with(&clients, &[" name=tollgate-batch ", "cmd=evalsha"]),
            "master {m}: its plans ran on the store's own, named connection: {clients:?}"
        );
    }
    drop(store);

    let one = RedisStore::connect(RedisConfig::cluster(cluster.seed_urls()).with_max_batch(1))
        .await
        .expect("connect");
    let fresh = rule("nodes-1", Algorithm::TokenBucket, 4, HOUR);
    for &w in &who {
        assert_eq!(remaining(&one, &fresh, w).await, 3, "client {w}");
    }
    // The first store's connections close as it drops (bounded wait: 50 x 40 ms).
    let named = |m: usize| {
        any_with(
            &store_clients(&cluster.nodes()[m], &[]),
            &["tollgate-batch"],
        )
    };
    for _ in 0..50 {
        if !masters.iter().any(|&m| named(m)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for &m in &masters {
        assert!(
            !named(m),
            "master {m}: max_batch = 1 opens no connection of its own"
        );
    }
}

/// A Cluster node's own connection authenticates as the URL's user, on every master: the
/// first URL's credentials go with the address the node table gives. The user has only what
/// docs/operations.md lists for a Cluster ([`LEAST_PRIVILEGE`], `CLUSTER SLOTS` and `ASKING`),
/// and is served again after every master lost its scripts, and in a slot being resharded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_nodes_own_connection_authenticates_as_the_urls_user() {
    let cluster = RedisCluster::start(3, 0);
    // A user of its own on every node (ACLs are per node); the default user stays open for
    // the test's own redis-cli.
    for n in cluster.nodes() {
        let mut acl = vec![
            "acl",
            "setuser",
            "gw",
            "on",
            ">pw-c1",
            "~tg:*",
            "resetchannels",
        ];
        acl.extend(["-@all", "+cluster|slots", "+asking"]);
        acl.extend(LEAST_PRIVILEGE);
        assert_eq!(n.cli(&acl).trim(), "OK");
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://gw:pw-c1@127.0.0.1:{}", n.port()))
        .collect();
    let store = RedisStore::connect(RedisConfig::cluster(urls).with_key_prefix("tg"))
        .await
        .expect("connect");
    let r = rule("acl-c", Algorithm::TokenBucket, 3, HOUR);
    let masters = cluster.master_indices();
    for &m in &masters {
        let who = common::clients_of(&cluster, m, 1)
            .next()
            .expect("a client of this master");
        assert_eq!(remaining(&store, &r, who).await, 2, "client {who}");
    }
    for &m in &masters {
        let clients = store_clients(&cluster.nodes()[m], &[]);
        assert!(
            any_with(
                &clients,
                &[" name=tollgate-batch ", " user=gw ", "cmd=eval"]
            ),
            "master {m}: the plan ran on the own connection as gw: {clients:?}"
        );
        assert!(
            !any_with(&clients, &[" name=tollgate-batch ", " user=default "]),
            "master {m}: {clients:?}"
        );
    }
    for &m in &masters {
        cluster.nodes()[m].cli(&["script", "flush"]);
    }
    for &m in &masters {
        let who = common::clients_of(&cluster, m, 1)
            .next()
            .expect("a client of this master");
        assert_eq!(remaining(&store, &r, who).await, 1, "client {who}");
    }
    // A slot in the middle of a resharding: its owner answers ASK for a key it does not
    // hold, and the call goes to the importing node after ASKING, which the user may send.
    let who = 88_888u128;
    let slot = u32::from(client(who).cluster_slot());
    let (_, to) = cluster.owner_and_other(slot);
    assert!(cluster.begin_migration(slot, to), "the migration began");
    // Without `+asking`, the failure says so (not the MOVED the call would then get).
    for n in cluster.nodes() {
        assert_eq!(n.cli(&["acl", "setuser", "gw", "-asking"]).trim(), "OK");
    }
    let refused = store
        .check(&[Check::new(client(who), &r, 1)], 0)
        .await
        .expect_err("ASKING refused");
    assert!(refused.to_string().contains("asking"), "{refused}");
    for n in cluster.nodes() {
        assert_eq!(n.cli(&["acl", "setuser", "gw", "+asking"]).trim(), "OK");
    }
    assert_eq!(
        remaining(&store, &r, who).await,
        2,
        "served by the importing node"
    );
    assert_eq!(remaining(&store, &r, who).await, 1);
    let keys_there = cluster.nodes()[to].cli(&["cluster", "countkeysinslot", &slot.to_string()]);
    assert_eq!(keys_there.trim(), "1");
}

#[cfg(unix)]
#[tokio::test]
async fn a_unix_socket_url_serves_the_coalesced_calls() {
    let dir = std::env::temp_dir().join(format!("tollgate-direct-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("redis.sock");
    let path_s = path.to_string_lossy().into_owned();
    let server =
        RedisServer::start_with_args(&["--unixsocket", &path_s, "--unixsocketperm", "700"]);
    let store = RedisStore::connect(RedisConfig::standalone(format!("unix://{path_s}")))
        .await
        .expect("connect over the socket");
    let r = rule("unix", Algorithm::SlidingWindowCounter, 3, HOUR);
    assert_eq!(remaining(&store, &r, 1).await, 2);
    assert_eq!(remaining(&store, &r, 1).await, 1);
    let clients = store_clients(&server, &[]);
    assert!(
        any_with(&clients, &["cmd=evalsha", "laddr=/"]),
        "{clients:?}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A caller that gives up while the server is frozen leaves its reply owed on the socket:
/// the next call skips it and gets its own, on the same connection.
#[tokio::test]
async fn a_reply_owed_to_a_caller_that_gave_up_goes_to_no_one_else() {
    let server = RedisServer::start();
    let config = RedisConfig::standalone(server.url()).with_call_timeout(Duration::from_secs(10));
    let store = RedisStore::connect(config).await.expect("connect");
    let small = Arc::new(rule("small", Algorithm::TokenBucket, 10, HOUR));
    let large = rule("large", Algorithm::TokenBucket, 1000, HOUR);
    assert_eq!(remaining(&store, &small, 1).await, 9);
    let before = store_clients(&server, &[]);

    server.pause();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        store.check(&[Check::new(client(1), &small, 1)], 0),
    )
    .await;
    assert!(gave_up.is_err(), "the frozen server cannot have answered");
    server.resume();

    // The owed reply (small's: 8 left) is read and dropped; this call gets large's.
    assert_eq!(remaining(&store, &large, 2).await, 999);
    assert_eq!(remaining(&store, &large, 2).await, 998);
    // The abandoned call reached the server before it froze, so it ran when it thawed.
    assert_eq!(remaining(&store, &small, 1).await, 7);
    let after = store_clients(&server, &[]);
    assert_eq!(
        before.len(),
        after.len(),
        "no new connection: {before:?} {after:?}"
    );
}

/// Redis's idle-client `timeout` (or a restart, or `CLIENT KILL`) closes the connections: the
/// next call notices the closed socket before using it and does not fail.
#[tokio::test]
async fn connections_the_server_closed_are_replaced_without_failing_a_call() {
    // A fixed window of an hour on Redis's clock, counted down over three seconds.
    tollgate_testkit::clear_of_window_end(HOUR);
    let server = RedisServer::start();
    let store = RedisStore::connect(RedisConfig::standalone(server.url()))
        .await
        .expect("connect");
    let r = rule("closed", Algorithm::FixedWindow, 100, HOUR);
    assert_eq!(remaining(&store, &r, 1).await, 99);
    for round in 0..3u64 {
        server.cli(&["client", "kill", "type", "normal", "skipme", "yes"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(remaining(&store, &r, 1).await, 98 - round);
    }
    server.cli(&["config", "set", "timeout", "1"]);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(remaining(&store, &r, 1).await, 95);
}

/// Many concurrent plans on one store (most of them in batches on the own connection) decide
/// exactly: a hot client gets exactly its limit, every other client its first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_plans_on_the_own_connection_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let store = RedisStore::connect(RedisConfig::standalone(server.url()))
        .await
        .expect("connect");
    let r = Arc::new(rule("hot", Algorithm::Gcra, 50, HOUR));
    let mut tasks = Vec::new();
    for i in 0..400u128 {
        let (store, r) = (store.clone(), Arc::clone(&r));
        tasks.push(tokio::spawn(async move {
            let who = if i % 2 == 0 { 1 } else { 1000 + i };
            let v = store.check(&[Check::new(client(who), &r, 1)], 0).await;
            (who, v.map(|v| v.allowed))
        }));
    }
    let (mut hot, mut others) = (0, 0);
    for t in tasks {
        let (who, allowed) = tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("no hang")
            .expect("task");
        let allowed = allowed.expect("check");
        match (who, allowed) {
            (1, true) => hot += 1,
            (1, false) => {}
            (_, true) => others += 1,
            (_, false) => panic!("a fresh client was denied"),
        }
    }
    assert_eq!(hot, 50);
    assert_eq!(others, 200);
    let info = server.cli(&["info", "commandstats"]);
    let calls: u64 = info
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(calls < 400, "the plans coalesced: {calls} script calls");
}
