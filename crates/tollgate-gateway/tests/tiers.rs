//! Tiers through the real `tollgate serve` binary: a client's tier comes from a verified JWT
//! claim or from a header that only a trusted proxy is believed on; a client in no tier, or in
//! a tier the config does not name, gets the policy's own quota. Twenty gateways on one Redis
//! keep every tier exact.

mod support;

use http::StatusCode;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::*;
use tollgate_testkit::RedisServer;

const HS_SECRET: &str = "tiers-test-secret-2c7d91e0ab4f";

fn token(sub: &str, plan: Option<&str>) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        + 3600;
    let mut claims = serde_json::json!({ "sub": sub, "exp": exp });
    if let Some(p) = plan {
        claims["plan"] = p.into();
    }
    let key = EncodingKey::from_secret(HS_SECRET.as_bytes()).expect("secret");
    encode(&Header::new(Algorithm::HS256), &claims, &key).expect("sign")
}

/// How many of `n` requests with `headers` pass before the first 429 (and none after it).
async fn admitted(g: &Gateway, headers: &[(&str, &[u8])], n: usize) -> usize {
    let c = client();
    let mut ok = 0;
    for i in 0..n {
        let a = get(&c, &g.url("/"), headers).await;
        match a.status {
            StatusCode::OK => {
                assert_eq!(ok, i, "a request passed after a 429");
                ok += 1;
            }
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}: {}", a.text()),
        }
    }
    ok
}

#[tokio::test]
async fn a_jwt_claim_picks_the_tier_and_others_get_the_policy_quota() {
    let body = format!(
        "[identity]\nsources = [\"jwt:sub\", \"ip\"]\n\
         [identity.jwt]\nhs256_secret = \"{HS_SECRET}\"\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod = \"1h\"\n\
         tier = \"jwt:plan\"\ntiers.pro = {{ limit = 5 }}\ntiers.enterprise = {{ limit = 8, period = \"2h\" }}\n"
    );
    let g = Gateway::start("", &body);
    let bearer = |t: String| format!("Bearer {t}");
    let free = bearer(token("alice", None));
    let pro = bearer(token("bob", Some("pro")));
    let ent = bearer(token("erin", Some("enterprise")));
    let unknown = bearer(token("carol", Some("gold")));
    assert_eq!(
        admitted(&g, &[("authorization", free.as_bytes())], 8).await,
        2
    );
    assert_eq!(
        admitted(&g, &[("authorization", pro.as_bytes())], 8).await,
        5
    );
    assert_eq!(
        admitted(&g, &[("authorization", ent.as_bytes())], 10).await,
        8
    );
    assert_eq!(
        admitted(&g, &[("authorization", unknown.as_bytes())], 8).await,
        2
    );
    // A tier is its own rule: it is advertised and counted under <policy>.<tier>.
    let a = get(&client(), &g.url("/"), &[("authorization", pro.as_bytes())]).await;
    assert!(
        a.header("ratelimit-policy").contains("\"api.pro\""),
        "{:?}",
        a.headers
    );
    let m = get(&client(), &g.admin_url("/metrics"), &[]).await.text();
    assert!(
        m.contains("tollgate_decisions_total{policy=\"api.pro\",outcome=\"allowed\"} 5"),
        "{m}"
    );
}

/// One GET from `source` (a loopback address of this machine) to the gateway; the status.
async fn get_from(source: &str, port: u16, key: &str, plan: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind(format!("{source}:0").parse().expect("addr"))
        .expect("bind source address");
    let mut s = tokio::time::timeout(
        Duration::from_secs(10),
        sock.connect(([127, 0, 0, 1], port).into()),
    )
    .await
    .expect("connect in time")
    .expect("connect");
    let req = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-api-key: {key}\r\nx-plan: {plan}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&out);
    text.get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"))
}

#[tokio::test]
async fn a_header_tier_is_believed_only_from_a_trusted_proxy() {
    let body = "[identity]\nsources = [\"header:x-api-key\"]\ntrusted_proxies = [\"127.0.0.2\"]\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\n\
         tier = \"header:x-plan\"\ntiers.pro = { limit = 5 }\n";
    let g = Gateway::start("", body);
    let count = |source: &'static str, key: &'static str| {
        let port = g.port;
        async move {
            let mut ok = 0;
            for _ in 0..8 {
                match get_from(source, port, key, "pro").await {
                    200 => ok += 1,
                    429 => {}
                    other => panic!("unexpected {other}"),
                }
            }
            ok
        }
    };
    assert_eq!(count("127.0.0.2", "via-proxy").await, 5, "trusted proxy");
    assert_eq!(count("127.0.0.1", "direct").await, 2, "untrusted peer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_gateways_on_one_redis_keep_every_tier_exact() {
    let redis = RedisServer::start();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_failure = \"closed\"\n\
         [identity]\nsources = [\"header:x-api-key\"]\nsecret = \"fleet-tiers-secret\"\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_log\"\nlimit = 20\nperiod = \"1h\"\n\
         tier = \"header:x-plan\"\ntiers.pro = {{ limit = 60 }}\ntiers.team = {{ limit = 35 }}\n",
        redis.url()
    );
    let gateways: Vec<Gateway> = (0..20).map(|_| Gateway::start("", &body)).collect();
    let c = client();
    let clients: [(&'static str, &'static str, usize); 4] = [
        ("free-client", "", 20),
        ("pro-client", "pro", 60),
        ("team-client", "team", 35),
        ("unknown-tier-client", "platinum", 20),
    ];
    let mut tasks = Vec::new();
    for i in 0..120 {
        for (ci, &(key, plan, _)) in clients.iter().enumerate() {
            let c = c.clone();
            let url = gateways[(i + ci) % 20].url("/");
            tasks.push(tokio::spawn(async move {
                let mut h: Vec<(&str, &[u8])> = vec![("x-api-key", key.as_bytes())];
                if !plan.is_empty() {
                    h.push(("x-plan", plan.as_bytes()));
                }
                (ci, get(&c, &url, &h).await.status)
            }));
        }
    }
    let mut allowed = [0usize; 4];
    for t in tasks {
        match t.await.expect("task") {
            (ci, StatusCode::OK) => allowed[ci] += 1,
            (_, StatusCode::TOO_MANY_REQUESTS) => {}
            (_, other) => panic!("unexpected status {other}"),
        }
    }
    for (ci, (key, _, want)) in clients.iter().enumerate() {
        assert_eq!(allowed[ci], *want, "{key}");
    }
}

#[test]
fn check_config_reports_tier_mistakes_with_lines() {
    let policy =
        "[[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod = \"1m\"\n";
    let cases = [
        (format!("{policy}tier = \"header:x-plan\"\n"), "policy[0].tier", 6),
        (format!("{policy}tiers.pro = {{ limit = 5 }}\n"), "policy[0].tiers", 6),
        (format!("{policy}tier = \"ip\"\ntiers.pro = {{ limit = 5 }}\n"), "policy[0].tier", 6),
        (format!("{policy}tier = \"jwt:plan\"\ntiers.pro = {{ limit = 5 }}\n"), "jwt", 1),
        (format!("{policy}tier = \"header:x-plan\"\ntiers.pro = {{ limit = 0 }}\n"), "policy[0].tiers.pro.limit", 7),
        (format!("{policy}tier = \"header:x-plan\"\ntiers.pro = {{ period = \"1m\" }}\n"), "policy[0].tiers.pro.limit", 7),
        (format!("{policy}tier = \"header:x-plan\"\ntiers.pro = {{ limit = 5, period = \"soon\" }}\n"), "policy[0].tiers.pro.period", 7),
        (format!("{policy}tier = \"header:x-plan\"\ntiers.pro = {{ limit = 5, color = \"red\" }}\n"), "color", 7),
        (format!("{policy}tier = \"header:x-plan\"\ntiers.\"p r o\" = {{ limit = 5 }}\n"), "policy[0].tiers", 7),
    ];
    for (text, key, line) in cases {
        let path = scratch("tiers.toml");
        std::fs::write(&path, &text).expect("write");
        let (accepted, err) = run_check_config(&path);
        assert!(!accepted, "{text:?} was accepted");
        assert!(err.contains(key), "{text:?}: {key} not in {err}");
        let at = format!("{}:{line}:", path.display());
        assert!(err.contains(&at), "{text:?}: {at} not in {err}");
    }
    let good = format!("{policy}tier = \"header:x-plan\"\ntiers.pro = {{ limit = 5 }}\n");
    let path = scratch("tiers-ok.toml");
    std::fs::write(&path, good).expect("write");
    let (accepted, printed) = run_check_config(&path);
    assert!(accepted, "{}", printed);
}
