//! `tollgate serve` with `backend = "redis-sentinel"` against real sentinels: the gateway finds
//! the master through them and limits there (the state is in the master, shared).

mod support;

use support::Gateway;
use tollgate_testkit::RedisSentinels;

fn status(port: u16, key: &str) -> String {
    let req =
        format!("GET /api HTTP/1.1\r\nhost: t\r\nx-api-key: {key}\r\nconnection: close\r\n\r\n");
    support::blocking_status_line(port, req.as_bytes())
}

#[test]
fn the_gateway_limits_on_the_master_the_sentinels_name() {
    let set = RedisSentinels::start();
    let urls: Vec<String> = set
        .sentinel_urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    let g = Gateway::start(
        "",
        &format!(
            "[store]\nbackend = \"redis-sentinel\"\nurls = [{}]\nmaster_name = \"{}\"\ntimeout = \"500ms\"\non_failure = \"closed\"\n[identity]\nsources = [\"header:x-api-key\"]\nsecret = \"s\"\n[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\n",
            urls.join(", "),
            set.master_name()
        ),
    );
    let answers: Vec<String> = (0..4).map(|_| status(g.port, "k1")).collect();
    assert_eq!(
        answers,
        [
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 429 Too Many Requests"
        ],
        "{}",
        g.log_text()
    );
    let master_port = set.master_port().expect("the sentinels name a master");
    let keys = tollgate_testkit::redis_cli(master_port, &["DBSIZE"]);
    assert_eq!(keys.trim(), "1", "the client's state lives in the master");
    assert!(g.log_text().contains("redis-sentinel("), "{}", g.log_text());
}
