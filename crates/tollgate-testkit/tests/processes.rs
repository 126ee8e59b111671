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

#[test]
fn a_cluster_of_three_masters_serves_every_slot() {
    let c = RedisCluster::start(3, 0);
    assert_eq!(c.seed_urls().len(), 3);
    assert_eq!(c.master_indices().len(), 3);
    for key in ["a", "b", "{client}:x"] {
        assert!(c.master_of_key(key).is_some(), "{key} has a master");
    }
}
