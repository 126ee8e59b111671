//! Twenty `tollgate serve` processes sharing one real redis-server: one client's requests,
//! spread over all of them, are limited exactly once in total.

mod support;

use http::StatusCode;
use support::*;
use tollgate_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_gateways_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_failure = \"closed\"\n\
         [identity]\nsources = [\"header:x-api-key\"]\nsecret = \"fleet-secret\"\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_log\"\nlimit = 100\nperiod = \"1h\"\n",
        redis.url()
    );
    let gateways: Vec<Gateway> = (0..20).map(|_| Gateway::start("", &body)).collect();
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..300 {
        let c = c.clone();
        let url = gateways[i % 20].url("/");
        tasks.push(tokio::spawn(async move {
            get(&c, &url, &[("x-api-key", b"client-a")]).await.status
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        match t.await.expect("task") {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(allowed, 100);
    // Another client is unaffected, on any gateway.
    for g in gateways.iter().take(5) {
        let a = get(&c, &g.url("/"), &[("x-api-key", b"client-b")]).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    // Raw API keys never reach Redis.
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(!keys.contains("client-a"), "{keys}");
    assert!(keys.contains("tollgate:{"), "{keys}");
}
