//! The admin API under `/v1/` through the real `tollgate serve` binary: 403 without a
//! configured token, 401 without or with a wrong bearer token, 200 with the right one; reading
//! and resetting a client (memory store and a real `redis-server`); the effective config with
//! every secret redacted; an `admin_listen` off loopback without a token refused at startup.

mod support;

use http::{Method, StatusCode};
use serde_json::Value;
use support::*;
use tollgate_testkit::RedisServer;
use tollgate_tower::ProblemKind;

const TOKEN: &str = "admin-api-test-token-51c9e0";

fn with_token() -> String {
    format!("admin_token = \"{TOKEN}\"\n")
}

const LIMITED: &str = "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\n\
    [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod = \"1h\"\n";

async fn admin(g: &Gateway, method: Method, path: &str, auth: Option<&str>) -> Answer {
    let headers: Vec<(&str, &[u8])> = auth
        .map(|a| vec![("authorization", a.as_bytes())])
        .unwrap_or_default();
    send(&client(), method, &g.admin_url(path), &headers, "").await
}

async fn admin_json(g: &Gateway, method: Method, path: &str) -> Value {
    let a = admin(g, method, path, Some(&format!("Bearer {TOKEN}"))).await;
    assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.text());
    serde_json::from_slice(&a.body).expect("json")
}

async fn call(g: &Gateway, key: &str) -> StatusCode {
    get(&client(), &g.url("/"), &[("x-api-key", key.as_bytes())])
        .await
        .status
}

#[tokio::test]
async fn without_a_configured_token_v1_is_forbidden_and_the_rest_stays_open() {
    let g = Gateway::start("", LIMITED);
    for (method, path) in [
        (Method::GET, "/v1/config"),
        (Method::POST, "/v1/reload"),
        (Method::GET, "/v1/clients/api?identity=ip=127.0.0.1"),
    ] {
        let a = admin(&g, method, path, Some(&format!("Bearer {TOKEN}"))).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{path}");
        assert!(a.text().contains("admin_token"), "{}", a.text());
        assert_eq!(a.problem_type(), ProblemKind::AdminDisabled.type_uri());
    }
    for path in ["/metrics", "/healthz", "/readyz", "/"] {
        let a = admin(&g, Method::GET, path, None).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn the_token_is_required_and_compared_exactly() {
    let g = Gateway::start(&with_token(), LIMITED);
    let wrong = format!("Bearer {TOKEN}x");
    let short = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let basic = format!("Basic {TOKEN}");
    for auth in [
        None,
        Some(wrong.as_str()),
        Some(short.as_str()),
        Some(basic.as_str()),
        Some("Bearer "),
    ] {
        let a = admin(&g, Method::GET, "/v1/config", auth).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert!(
            a.header("www-authenticate").starts_with("Bearer"),
            "{auth:?}"
        );
        assert_eq!(a.problem_type(), ProblemKind::AdminTokenRequired.type_uri());
    }
    // Two Authorization headers: refused, even if one is right.
    let right = format!("Bearer {TOKEN}");
    let a = send(
        &client(),
        Method::GET,
        &g.admin_url("/v1/config"),
        &[
            ("authorization", right.as_bytes()),
            ("authorization", wrong.as_bytes()),
        ],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    // The scheme is case-insensitive.
    let lower = format!("bearer {TOKEN}");
    assert_eq!(
        admin(&g, Method::GET, "/v1/config", Some(&lower))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        admin(&g, Method::GET, "/v1/config", Some(&right))
            .await
            .status,
        StatusCode::OK
    );
    // Wrong methods and unknown calls, once authorized.
    let a = admin(&g, Method::GET, "/v1/reload", Some(&right)).await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(a.header("allow"), "POST");
    assert_eq!(a.problem_type(), "about:blank");
    let a = admin(
        &g,
        Method::PUT,
        "/v1/clients/api?identity=ip=127.0.0.1",
        Some(&right),
    )
    .await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    let a = admin(&g, Method::GET, "/v1/nothing", Some(&right)).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.problem_type(), ProblemKind::NotFound.type_uri());
    // Outside /v1/ too: the admin server's own refusals are problems.
    let a = admin(&g, Method::GET, "/nothing", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.problem_type(), "about:blank");
    let a = admin(&g, Method::POST, "/metrics", None).await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(a.header("allow"), "GET, HEAD");
    assert_eq!(a.problem_type(), "about:blank");
}

/// Limits client `k`, reads it, resets it, and checks it passes again while a bystander
/// stays limited.
async fn reset_round(g: &Gateway) {
    for key in ["k-reset", "k-bystander"] {
        assert_eq!(call(g, key).await, StatusCode::OK);
        assert_eq!(call(g, key).await, StatusCode::OK);
        assert_eq!(call(g, key).await, StatusCode::TOO_MANY_REQUESTS);
    }
    let path = "/v1/clients/api?identity=header%3Ax-api-key%3Dk-reset";
    let v = admin_json(g, Method::GET, path).await;
    assert_eq!(v["policy"], "api");
    assert_eq!(v["identity_source"], "header:x-api-key");
    assert_eq!(v["rules"][0]["rule"], "api");
    assert_eq!(v["rules"][0]["remaining"], 0);
    assert_eq!(v["rules"][0]["limited"], true);
    assert!(v["rules"][0]["reset_seconds"].as_f64().unwrap_or(0.0) > 0.0);
    // The raw identity is not echoed back; its keyed hash is.
    assert!(!v.to_string().contains("k-reset"), "{v}");
    let fresh = admin_json(
        g,
        Method::GET,
        "/v1/clients/api?identity=header:x-api-key=never-seen",
    )
    .await;
    assert_eq!(fresh["rules"][0]["remaining"], 2);
    assert_eq!(fresh["rules"][0]["limited"], false);

    let v = admin_json(g, Method::DELETE, path).await;
    assert_eq!(v["reset"][0]["rule"], "api");
    assert_eq!(v["reset"][0]["had_state"], true);
    assert_eq!(
        call(g, "k-reset").await,
        StatusCode::OK,
        "passes again after the reset"
    );
    assert_eq!(call(g, "k-reset").await, StatusCode::OK);
    assert_eq!(call(g, "k-reset").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call(g, "k-bystander").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_reset_makes_a_limited_client_pass_again_on_the_memory_store() {
    let g = Gateway::start(&with_token(), LIMITED);
    reset_round(&g).await;
    // Mistakes are 4xx with a reason.
    let auth = format!("Bearer {TOKEN}");
    for (path, status) in [
        (
            "/v1/clients/nope?identity=ip=127.0.0.1",
            StatusCode::NOT_FOUND,
        ),
        ("/v1/clients/api", StatusCode::BAD_REQUEST),
        (
            "/v1/clients/api?identity=ip=127.0.0.1&identity=ip=127.0.0.2",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/clients/api?identity=cookie:x=1",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/clients/api?identity=header:x-user-id=1",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/clients/api?identity=ip=not-an-ip",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let a = admin(&g, Method::GET, path, Some(&auth)).await;
        assert_eq!(a.status, status, "{path}: {}", a.text());
        let kind = if status == StatusCode::NOT_FOUND {
            ProblemKind::NotFound
        } else {
            ProblemKind::BadRequest
        };
        assert_eq!(a.problem_type(), kind.type_uri(), "{path}");
        let v: Value = serde_json::from_slice(&a.body).expect("json");
        assert!(
            v["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{path}: a reason"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_makes_a_limited_client_pass_again_on_redis() {
    let redis = RedisServer::start();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"500ms\"\n{LIMITED}",
        redis.url()
    );
    let g = Gateway::start(&with_token(), &body);
    // The third call of each client is limited, and the next one answered by the deny cache:
    // the reset must clear both the Redis key and that cache entry.
    reset_round(&g).await;
}

#[tokio::test]
async fn tiers_and_overrides_show_each_rule_that_can_apply() {
    let dir = scratch("admin-overrides");
    std::fs::create_dir_all(&dir).expect("dir");
    let overrides = dir.join("overrides.toml");
    std::fs::write(
        &overrides,
        "[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=vip\"\nlimit = 50\nperiod = \"1h\"\n",
    )
    .expect("write");
    let body = format!(
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [overrides]\nfile = {:?}\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod = \"1h\"\n\
         tier = \"header:x-plan\"\ntiers.pro = {{ limit = 20 }}\n",
        overrides.display().to_string()
    );
    let g = Gateway::start(&with_token(), &body);
    let v = admin_json(
        &g,
        Method::GET,
        "/v1/clients/api?identity=header:x-api-key=someone",
    )
    .await;
    let rules = v["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 2, "{v}");
    assert_eq!(rules[0]["tier"], Value::Null);
    assert_eq!(rules[0]["limit"], 2);
    assert_eq!(rules[1]["rule"], "api.pro");
    assert_eq!(rules[1]["tier"], "pro");
    assert_eq!(rules[1]["limit"], 20);
    let v = admin_json(
        &g,
        Method::GET,
        "/v1/clients/api?identity=header:x-api-key=vip",
    )
    .await;
    let rules = v["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 1, "{v}");
    assert_eq!(rules[0]["override"], true);
    assert_eq!(rules[0]["limit"], 50);
    assert!(rules[0]["rule"]
        .as_str()
        .unwrap_or("")
        .starts_with("api.override-"));
}

#[tokio::test]
async fn the_effective_config_never_shows_a_secret() {
    let store_password = "store-pw-Zq81";
    let identity_secret = "identity-secret-Hx72";
    let jwt_secret = "jwt-secret-0123456789-Kp3";
    // A Redis that is not there: the gateway serves anyway (requests fail open).
    let port = free_port();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://:{store_password}@127.0.0.1:{port}/0\"\n\
         [identity]\nsources = [\"jwt:sub\", \"ip\"]\nsecret = \"{identity_secret}\"\n\
         [identity.jwt]\nhs256_secret = \"{jwt_secret}\"\nissuer = \"https://auth.example\"\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1m\"\nburst = 4\n"
    );
    let g = Gateway::start(&with_token(), &body);
    let a = admin(
        &g,
        Method::GET,
        "/v1/config",
        Some(&format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let text = a.text();
    for secret in [store_password, identity_secret, jwt_secret, TOKEN] {
        assert!(!text.contains(secret), "{secret} shown in {text}");
    }
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["identity"]["secret"], "<redacted>");
    assert_eq!(v["identity"]["jwt"]["hs256_secret"], "<redacted>");
    assert_eq!(v["identity"]["jwt"]["issuer"], "https://auth.example");
    assert_eq!(v["server"]["admin_token"], "<redacted>");
    assert!(
        v["store"]["url"].as_str().unwrap_or("").contains("***"),
        "{v}"
    );
    assert_eq!(v["policy"][0]["algorithm"], "gcra");
    assert_eq!(v["policy"][0]["burst"], 4);
    assert_eq!(v["policy"][0]["period_seconds"], 60.0);
    // Nor does the log.
    let log = g.log_text();
    for secret in [store_password, identity_secret, jwt_secret, TOKEN] {
        assert!(!log.contains(secret), "{secret} logged");
    }
}

#[test]
fn an_admin_listen_off_loopback_without_a_token_is_refused() {
    let config = scratch("open-admin.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"0.0.0.0:9\"\n",
    )
    .expect("write");
    for cmd in ["check-config", "serve"] {
        let mut c = tollgate();
        c.arg(cmd);
        if cmd == "serve" {
            c.arg("--config");
        }
        let out = c.arg(&config).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}:3:", config.display()))
                && err.contains("server.admin_listen"),
            "{cmd}: {err}"
        );
    }
    // With a token it validates.
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"0.0.0.0:9\"\nadmin_token = \"${TOLLGATE_TEST_ADMIN_TOKEN}\"\n",
    )
    .expect("write");
    let out = tollgate()
        .arg("check-config")
        .arg(&config)
        .env("TOLLGATE_TEST_ADMIN_TOKEN", TOKEN)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A short token is refused with its key.
    let out = tollgate()
        .arg("check-config")
        .arg(&config)
        .env("TOLLGATE_TEST_ADMIN_TOKEN", "short")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.admin_token"));
}

#[tokio::test]
async fn an_api_key_that_is_not_utf8_is_addressed_by_its_own_bytes() {
    let g = Gateway::start(&with_token(), LIMITED);
    let raw_key: &[u8] = b"\xff\xfe";
    let call_raw = || async {
        get(&client(), &g.url("/"), &[("x-api-key", raw_key)])
            .await
            .status
    };
    assert_eq!(call_raw().await, StatusCode::OK);
    assert_eq!(call_raw().await, StatusCode::OK);
    assert_eq!(call_raw().await, StatusCode::TOO_MANY_REQUESTS);
    // What a lossy reading of %FF%FE would name: another client, who spent one.
    assert_eq!(call(&g, "\u{FFFD}\u{FFFD}").await, StatusCode::OK);
    let path = "/v1/clients/api?identity=header:x-api-key=%FF%FE";
    let v = admin_json(&g, Method::GET, path).await;
    assert_eq!(v["rules"][0]["remaining"], 0, "{v}");
    assert_eq!(v["rules"][0]["limited"], true, "{v}");
    let v = admin_json(&g, Method::DELETE, path).await;
    assert_eq!(v["reset"][0]["had_state"], true, "{v}");
    assert_eq!(
        call_raw().await,
        StatusCode::OK,
        "passes again after the reset"
    );
    // The other client was not touched: one of its two left.
    assert_eq!(call(&g, "\u{FFFD}\u{FFFD}").await, StatusCode::OK);
    assert_eq!(
        call(&g, "\u{FFFD}\u{FFFD}").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
