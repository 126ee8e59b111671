//! Live reload through the real `tollgate serve` binary in proxy mode: a new limit applied by a
//! file change, by SIGHUP and by `POST /v1/reload`, each within 2 s, while proxied requests are
//! in flight and traffic keeps coming (none fails); an unchanged policy's client keeps its
//! remaining count, a lowered quota is never exceeded, and a broken config is refused whole
//! while the old limits keep working.

mod support;

use http::{Method, StatusCode};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tollgate_testkit::RedisServer;

const TOKEN: &str = "reload-test-admin-token-8f3a";

fn server_extra() -> String {
    format!("admin_token = \"{TOKEN}\"\n")
}

/// Two policies by API key: `changing` (limit `n` an hour on /change) and `steady` (10 an hour
/// on /steady). Requests to /slow match neither and take 3 s upstream.
fn body(n: u64) -> String {
    format!(
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\n\
         [[policy]]\nname = \"changing\"\nmatch = {{ path_prefix = \"/change\" }}\nalgorithm = \"token_bucket\"\nlimit = {n}\nperiod = \"1h\"\n\
         [[policy]]\nname = \"steady\"\nmatch = {{ path_prefix = \"/steady\" }}\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1h\"\n"
    )
}

async fn hit(g: &Gateway, path: &str, key: &str) -> Answer {
    get(&client(), &g.url(path), &[("x-api-key", key.as_bytes())]).await
}

/// Polls with fresh clients until `changing` announces quota `n` (within `within`); returns
/// how long it took.
async fn wait_for_quota(g: &Gateway, n: u64, within: Duration) -> Duration {
    let started = Instant::now();
    let want = format!("\"changing\";q={n};w=3600");
    let mut i = 0;
    loop {
        i += 1;
        let a = hit(g, "/change", &format!("probe-{n}-{i}")).await;
        if a.header("ratelimit-policy") == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "quota {n} not applied within {within:?}: last answer {} {:?}\n{}",
            a.status,
            a.header("ratelimit-policy"),
            g.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn admin(g: &Gateway, method: Method, path: &str, token: Option<&str>) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &[u8])> = auth
        .as_deref()
        .map(|a| vec![("authorization", a.as_bytes())])
        .unwrap_or_default();
    send(&client(), method, &g.admin_url(path), &headers, "").await
}

fn reloads(metrics: &str, result: &str) -> u64 {
    let prefix = format!("tollgate_config_reloads_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{metrics}"))
}

/// `steady`'s `r` for `key` after one more request (`"steady";r=6;t=...` gives 6).
async fn steady_remaining(g: &Gateway, key: &str) -> u64 {
    let a = hit(g, "/steady", key).await;
    assert_eq!(a.status, StatusCode::OK);
    let h = a.header("ratelimit");
    h.strip_prefix("\"steady\";r=")
        .and_then(|rest| rest.split(';').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no steady remaining in {h:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_by_file_sighup_and_api_apply_within_two_seconds_and_fail_no_request() {
    let up = Upstream::start().await;
    let g = Gateway::proxy(&up, &server_extra(), &body(3));
    wait_for_quota(&g, 3, Duration::from_secs(2)).await;

    // A steady client spends 4 of 10.
    for _ in 0..3 {
        hit(&g, "/steady", "steady-client").await;
    }
    assert_eq!(steady_remaining(&g, "steady-client").await, 6);

    // Traffic through every reload: slow proxied requests in flight, and a steady stream.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (stop, failures, served) = (stop.clone(), failures.clone(), served.clone());
        let url = g.url(&format!("/slow/{t}"));
        let change = g.url("/change");
        tasks.push(tokio::spawn(async move {
            let c = client();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                n += 1;
                let (url, key) = if n % 2 == 0 {
                    (url.as_str(), format!("slow-{t}"))
                } else {
                    (change.as_str(), format!("stream-{t}-{n}"))
                };
                let a = get(&c, url, &[("x-api-key", key.as_bytes())]).await;
                match a.status {
                    StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
                        served.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // 1. A file change.
    g.rewrite(&body(5));
    let took = wait_for_quota(&g, 5, Duration::from_secs(2)).await;
    eprintln!("file change applied after {took:?}");

    // 2. SIGHUP (sent at once after the write, before the watcher would see a settled file).
    g.rewrite(&body(6));
    g.hangup();
    wait_for_quota(&g, 6, Duration::from_secs(2)).await;

    // 3. POST /v1/reload: applied when it answers.
    g.rewrite(&body(7));
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
    assert_eq!(v["result"], "ok");
    assert_eq!(v["changed"], true, "{v}");
    assert_eq!(v["restart_required"], serde_json::json!([]));
    // The same files again: applied, and said to be unchanged.
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
    assert_eq!(
        (v["result"].as_str(), v["changed"].as_bool()),
        (Some("ok"), Some(false)),
        "{v}"
    );
    wait_for_quota(&g, 7, Duration::from_millis(200)).await;

    // The unchanged policy's client kept its count through three reloads.
    assert_eq!(steady_remaining(&g, "steady-client").await, 5);

    // A broken config is refused whole; the old limits keep working.
    g.rewrite(&body(7).replace("limit = 10", "limit = -10"));
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.text());
    assert_eq!(
        a.problem_type(),
        tollgate_tower::ProblemKind::ConfigRefused.type_uri()
    );
    let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
    assert_eq!(v["result"], "error", "{v}");
    let detail = v["detail"].as_str().unwrap_or_default();
    let file = g.config.display().to_string();
    assert!(
        detail.contains(&format!("{file}:")),
        "names the file: {detail}"
    );
    assert!(
        detail.contains("policy[1].limit"),
        "names the key: {detail}"
    );
    // The watcher sees the broken file too, and refuses it as well.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    wait_for_quota(&g, 7, Duration::from_millis(200)).await;
    assert_eq!(steady_remaining(&g, "steady-client").await, 4);
    let metrics = get(&client(), &g.admin_url("/metrics"), &[]).await.text();
    // Refused twice: by the API, then by the watcher, which saw the same broken file.
    assert!(reloads(&metrics, "error") >= 2, "{metrics}");
    assert!(reloads(&metrics, "ok") >= 3, "{metrics}");
    // The status page says so too, with the first problem.
    let status: serde_json::Value =
        serde_json::from_slice(&get(&client(), &g.admin_url("/status.json"), &[]).await.body)
            .expect("status json");
    let c = &status["config"];
    assert_eq!(c["origin"], g.config.display().to_string());
    assert_eq!(c["last_reload"]["ok"], false, "{c}");
    assert!(
        c["last_reload"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("policy[1].limit"),
        "{c}"
    );
    assert!(c["reloads_ok"].as_u64().unwrap_or(0) >= 3, "{c}");
    assert!(g.log_text().contains("sighup"), "{}", g.log_text());
    assert!(g.log_text().contains("config reload refused"));

    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("traffic task");
    }
    assert_eq!(failures.load(Ordering::SeqCst), 0, "requests failed");
    assert!(served.load(Ordering::SeqCst) >= 8, "traffic ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_quota_keeps_the_state_and_never_allows_more_than_the_new_burst() {
    let up = Upstream::start().await;
    let g = Gateway::proxy(&up, &server_extra(), &body(8));
    // Spends 2 of 8: 6 left under the old quota.
    for _ in 0..2 {
        assert_eq!(hit(&g, "/change", "lowered").await.status, StatusCode::OK);
    }
    // A client that spent everything stays limited when the quota rises (its state is kept).
    for _ in 0..8 {
        hit(&g, "/change", "spent").await;
    }
    assert_eq!(
        hit(&g, "/change", "spent").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    g.rewrite(&body(3));
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    // Under the new burst of 3: at most 3 more, although 6 were left.
    let mut ok = 0;
    for _ in 0..6 {
        if hit(&g, "/change", "lowered").await.status == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 3, "the new burst bounds what a kept state allows");
    g.rewrite(&body(20));
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(
        hit(&g, "/change", "spent").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a raised quota does not refill a spent state at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_raised_quota_applies_to_a_client_the_deny_cache_remembers() {
    let redis = RedisServer::start();
    let body = |n: u64| {
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"500ms\"\n\
             [identity]\nsources = [\"header:x-api-key\"]\n\
             [[policy]]\nname = \"changing\"\nalgorithm = \"fixed_window\"\nlimit = {n}\nperiod = \"1h\"\n",
            redis.url()
        )
    };
    let g = Gateway::start(&server_extra(), &body(2));
    let status = |key: &'static str| {
        let url = g.url("/x");
        async move {
            get(&client(), &url, &[("x-api-key", key.as_bytes())])
                .await
                .status
        }
    };
    assert_eq!(status("k").await, StatusCode::OK);
    assert_eq!(status("k").await, StatusCode::OK);
    // Denied by Redis until the window ends, then remembered by this gateway's deny cache.
    assert_eq!(status("k").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("k").await, StatusCode::TOO_MANY_REQUESTS);
    g.rewrite(&body(5));
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    // The window's count (2) is kept and read under the new limit: 3 more, then limited.
    for _ in 0..3 {
        assert_eq!(status("k").await, StatusCode::OK, "{}", g.log_text());
    }
    assert_eq!(status("k").await, StatusCode::TOO_MANY_REQUESTS);
    // And a lowered quota applies to it at once as well.
    g.rewrite(&body(1));
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(status("k").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("fresh").await, StatusCode::OK);
    assert_eq!(status("fresh").await, StatusCode::TOO_MANY_REQUESTS);
}

/// What the operator's reload of `g` answered: the status and the problem's detail.
async fn refused_reload(g: &Gateway) -> String {
    let a = admin(g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.text());
    let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
    v["detail"].as_str().unwrap_or_default().to_string()
}

/// [`body`] with `identity.secret` set (`None`: left out, the built-in default).
fn keyed_body(secret: Option<&str>, n: u64) -> String {
    let line = secret.map_or(String::new(), |s| format!("secret = \"{s}\"\n"));
    body(n).replacen("[identity]\n", &format!("[identity]\n{line}"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_never_replaces_a_working_config_by_one_that_limits_nothing_or_locks_the_operator_out(
) {
    let up = Upstream::start().await;
    let g = Gateway::proxy(&up, &server_extra(), &keyed_body(Some("first-secret"), 1));
    assert_eq!(hit(&g, "/change", "k").await.status, StatusCode::OK);
    let limited = || async { hit(&g, "/change", "k").await.status };
    assert_eq!(limited().await, StatusCode::TOO_MANY_REQUESTS);

    // An empty file (`: > tollgate.toml; kill -HUP`): refused, the limits and the token stay.
    std::fs::write(&g.config, "").expect("truncate");
    g.hangup();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = get(&client(), &g.admin_url("/metrics"), &[]).await.text();
        if reloads(&m, "error") >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP not refused: {}",
            g.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limited().await, StatusCode::TOO_MANY_REQUESTS);
    let detail = refused_reload(&g).await;
    assert!(detail.contains("empty"), "{detail}");
    // The watcher saw it too, waited for it to settle, and refused it as well.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(limited().await, StatusCode::TOO_MANY_REQUESTS);

    // Cut before its [[policy]]: the server table alone.
    std::fs::write(&g.config, &g.head).expect("write");
    let detail = refused_reload(&g).await;
    assert!(detail.contains("no [[policy]]"), "{detail}");
    // The admin token removed: the operator could not reload again.
    let without_token = g.head.replace(&server_extra(), "");
    std::fs::write(
        &g.config,
        format!("{without_token}{}", keyed_body(Some("first-secret"), 1)),
    )
    .expect("write");
    let detail = refused_reload(&g).await;
    assert!(detail.contains("server.admin_token"), "{detail}");
    // The identity secret left out (the built-in default) or changed: every client re-keyed.
    for other in [None, Some("second-secret")] {
        std::fs::write(&g.config, format!("{}{}", g.head, keyed_body(other, 1))).expect("write");
        let detail = refused_reload(&g).await;
        assert!(detail.contains("identity.secret"), "{detail}");
        assert!(!detail.contains("-secret"), "{detail}");
    }
    assert_eq!(limited().await, StatusCode::TOO_MANY_REQUESTS);

    // The same config with a new limit still reloads.
    std::fs::write(
        &g.config,
        format!("{}{}", g.head, keyed_body(Some("first-secret"), 5)),
    )
    .expect("write");
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_names_the_key_and_never_echoes_its_value() {
    let up = Upstream::start().await;
    let g = Gateway::proxy(&up, &server_extra(), &body(3));
    let digits = "98765432109876543";
    let head = g
        .head
        .replace(&server_extra(), &format!("admin_token = {digits}\n"));
    std::fs::write(&g.config, format!("{head}{}", body(3))).expect("write");
    let detail = refused_reload(&g).await;
    assert!(detail.contains("server.admin_token"), "{detail}");
    assert!(detail.contains("integer"), "{detail}");
    let status = get(&client(), &g.admin_url("/status.json"), &[])
        .await
        .text();
    for (what, text) in [
        ("detail", detail),
        ("status.json", status),
        ("log", g.log_text()),
    ] {
        assert!(!text.contains(digits), "{what} echoes the value: {text}");
    }
}

/// A keep-alive connection never keeps a trust the operator took away: on one connection
/// from 127.0.0.1, the proxy extends the client's `X-Forwarded-For` while 127.0.0.1 is a
/// trusted proxy, and replaces it once a reload has removed it from `trusted_proxies`; the
/// identity by IP follows the same way (the forwarded address counted, then the peer's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_trusted_proxy_applies_to_its_open_connection() {
    use http_body_util::{BodyExt, Empty};
    let config = |trusted: &str| {
        format!(
            "[identity]\nsources = [\"ip\"]\ntrusted_proxies = [{trusted}]\n\
             [[policy]]\nname = \"per-ip\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod = \"1h\"\n"
        )
    };
    let up = Upstream::start().await;
    let g = Gateway::proxy(&up, &server_extra(), &config("\"127.0.0.1\""));
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", g.port))
        .await
        .expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    let driver = tokio::spawn(conn);
    // Sends one request on the connection: what the upstream saw as X-Forwarded-For, and the
    // remaining count the gateway announced.
    let mut send = async |xff: &str| {
        let req = http::Request::get("/")
            .header("host", "example.test")
            .header("x-forwarded-for", xff)
            .body(Empty::<bytes::Bytes>::new())
            .expect("request");
        // The last answer's end leaves the connection ready again after a poll of its own.
        sender
            .ready()
            .await
            .expect("the open connection takes another request");
        let resp = sender
            .send_request(req)
            .await
            .expect("answer on the open connection");
        assert_eq!(resp.status(), StatusCode::OK);
        let seen = resp.headers()["x-echo-xff"]
            .to_str()
            .expect("text")
            .to_string();
        let remaining = resp.headers()["ratelimit"]
            .to_str()
            .expect("text")
            .to_string();
        let _ = resp.into_body().collect().await;
        (seen, remaining)
    };
    let (seen, remaining) = send("203.0.113.7").await;
    assert_eq!(
        seen, "203.0.113.7, 127.0.0.1",
        "a trusted proxy's header is extended"
    );
    assert!(remaining.contains("r=99"), "{remaining}");
    let (_, remaining) = send("203.0.113.8").await;
    assert!(
        remaining.contains("r=99"),
        "another forwarded client: {remaining}"
    );
    g.rewrite(&config(""));
    g.hangup();
    // Reloaded once the peer's own address is what is counted and forwarded.
    let started = Instant::now();
    loop {
        let (seen, remaining) = send("203.0.113.9").await;
        if seen == "127.0.0.1" {
            // The peer itself, a client of its own: one request so far, this one.
            assert!(remaining.contains("r=99"), "{remaining}");
            let (seen, remaining) = send("203.0.113.10").await;
            assert_eq!(seen, "127.0.0.1", "an untrusted peer's header is replaced");
            assert!(
                remaining.contains("r=98"),
                "the same client, by its address: {remaining}"
            );
            break;
        }
        assert_eq!(seen, "203.0.113.9, 127.0.0.1");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the reload never applied to the open connection\n{}",
            g.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver.abort();
}

/// The memory store keys its clients with SipHash, a Redis store with keyed BLAKE3. A reload
/// that names another backend keeps the running store (a restart key), and so must keep its
/// keys: a client's spent count and an override (hashed when the file is read) still find
/// their state, where keys made for the new file's backend would give every client a fresh
/// bucket and lose the override until the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_naming_another_store_keeps_the_running_stores_client_keys() {
    const VIP: &str = "sk_live_vip_reload_93c1";
    let overrides = scratch("overrides.toml");
    std::fs::write(
        &overrides,
        format!(
            "[[override]]\npolicy = \"changing\"\nidentity = \"header:x-api-key={VIP}\"\nlimit = 1\n"
        ),
    )
    .expect("write overrides");
    let file = |store: &str| {
        format!(
            "{store}[overrides]\nfile = {:?}\n{}",
            overrides.display().to_string(),
            body(3)
        )
    };
    let g = Gateway::start(&server_extra(), &file(""));
    assert_eq!(hit(&g, "/change", "spent").await.status, StatusCode::OK);
    assert_eq!(hit(&g, "/change", "spent").await.status, StatusCode::OK);
    // Nothing listens at this address: the running memory store is what serves.
    g.rewrite(&file(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n",
    ));
    let a = admin(&g, Method::POST, "/v1/reload", Some(TOKEN)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let v: serde_json::Value = serde_json::from_str(&a.text()).expect("json");
    assert_eq!(v["restart_required"], serde_json::json!(["store.backend"]));
    assert_eq!(
        hit(&g, "/change", "spent").await.status,
        StatusCode::OK,
        "its third of 3"
    );
    assert_eq!(
        hit(&g, "/change", "spent").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the count spent before the reload is still spent"
    );
    assert_eq!(hit(&g, "/change", VIP).await.status, StatusCode::OK);
    assert_eq!(
        hit(&g, "/change", VIP).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the override's limit of 1 still finds its client"
    );
    assert_eq!(hit(&g, "/change", "fresh").await.status, StatusCode::OK);
}
