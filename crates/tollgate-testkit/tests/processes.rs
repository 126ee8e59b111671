//! The testkit's own promises: servers start on distinct free ports, restart on the same
//! port, and a cluster reaches `cluster_state:ok`.

use tollgate_testkit::{RedisCluster, RedisServer};

#[test]
fn servers_start_on_distinct_ports_and_restart_on_the_same_one() {
    let a = RedisServer::start();
    let mut b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    // No `{tls}` in the arguments: no TLS port.
    assert_eq!(a.tls_port(), None);
    assert_eq!(a.tls_url(), None);
    assert!(a.cli(&["ping"]).contains("PONG"));
    b.cli(&["set", "k", "v"]);
    let port = b.port();
    b.kill();
    assert!(!b.is_up());
    b.restart();
    assert_eq!(b.port(), port);
    assert!(b.is_up());
    // A restarted server is empty: nothing was persisted.
    assert!(!b.cli(&["get", "k"]).contains('v'));
}

#[test]
fn a_paused_server_stops_answering_until_resumed() {
    let s = RedisServer::start();
    s.pause();
    assert!(!s.is_up());
    s.resume();
    assert!(s.is_up());
}

/// A redis-cli that does not return (here: its server stopped) is killed at its bound, and the
/// failure names the command, where a test once hung until nextest killed it at 300 s.
#[test]
fn a_redis_cli_that_does_not_return_is_killed_at_its_bound() {
    let s = RedisServer::start();
    s.pause();
    let r = tollgate_testkit::redis_cli_within(
        s.port(),
        &["cluster", "info"],
        std::time::Duration::from_millis(300),
    );
    s.resume();
    let e = r.expect_err("a stopped server never answers");
    assert!(
        e.contains("[\"cluster\", \"info\"]") && e.contains("did not return"),
        "{e}"
    );
    let answered =
        tollgate_testkit::redis_cli_within(s.port(), &["ping"], std::time::Duration::from_secs(30));
    assert_eq!(answered.as_deref().map(str::trim), Ok("PONG"));
}

#[test]
fn a_cluster_of_three_masters_serves_every_slot() {
    let c = RedisCluster::start(3, 0);
    assert_eq!(c.seed_urls().len(), 3);
    assert_eq!(c.master_indices().len(), 3);
    for key in ["a", "b", "{client}:x"] {
        assert!(c.master_of_key(key).is_some(), "{key} has a master");
    }
}
