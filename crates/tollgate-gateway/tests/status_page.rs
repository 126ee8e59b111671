//! The status page on the admin port, in a real browser: a `tollgate serve` on a Redis store
//! under load from the test, the page loaded in Debian's headless `chromium` and its rendered
//! DOM read back. The counts it shows are the ones `/metrics` shows, the abusive client is at
//! the top of the limited list by its keyed hash (never its API key), and the breaker shows
//! open while the test's redis-server is down. A screenshot is written where the log says.
//!
//! `scripts/test` installs chromium (as root, with apt). Without chromium the browser test
//! fails, unless `TOLLGATE_SKIP_MISSING=chromium` says to skip it (the testkit's one skip
//! rule, for a machine where it cannot be installed). `TOLLGATE_CHROMIUM` names another binary.

mod support;

use http::StatusCode;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;
use tollgate::IdentityHasher;
use tollgate_testkit::RedisServer;

const SECRET: &str = "status-page-test-secret-0f3c";
const ABUSER_KEY: &str = "sk_live_abuser_7d1e9c2b";

fn policy_body(store: &str) -> String {
    format!(
        "{store}\
         [identity]\nsources = [\"header:x-api-key\", \"ip\"]\nsecret = \"{SECRET}\"\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 20\nperiod = \"1h\"\n"
    )
}

/// The hash the gateway shows for an API key: the same keyed hash it limits by, SipHash on
/// the memory store (`local`), keyed BLAKE3 on Redis.
fn hash_of_api_key(local: bool, key: &str) -> String {
    let hasher = if local {
        IdentityHasher::process_local(SECRET.as_bytes())
    } else {
        IdentityHasher::new(SECRET.as_bytes())
    };
    hasher
        .client_key("header:x-api-key", key.as_bytes())
        .to_string()
}

/// One sample of `tollgate_decisions_total{policy="api",outcome=...}` from `/metrics`.
fn decisions(metrics: &str, outcome: &str) -> u64 {
    let prefix = format!("tollgate_decisions_total{{policy=\"api\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in /metrics"))
}

/// Sends `n` requests as `key`, four at a time; returns the count of 200s and 429s.
async fn load(g: &Gateway, key: &str, n: usize) -> (u64, u64) {
    let c = client();
    let mut ok = 0;
    let mut limited = 0;
    for _ in 0..n.div_ceil(4) {
        let mut batch = Vec::new();
        for _ in 0..4 {
            let c = c.clone();
            let url = g.url("/");
            let key = key.to_string();
            batch.push(tokio::spawn(async move {
                get(&c, &url, &[("x-api-key", key.as_bytes())]).await.status
            }));
        }
        for h in batch {
            match h.await.expect("request task") {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => limited += 1,
                other => panic!("unexpected {other}"),
            }
        }
    }
    (ok, limited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_never_shows_identities_or_secrets() {
    let g = Gateway::start("", &policy_body("[store]\nbackend = \"memory\"\n"));
    let (_, limited) = load(&g, ABUSER_KEY, 40).await;
    assert_eq!(limited, 20, "20 allowed, 20 limited");
    load(&g, "sk_live_quiet_client_55aa", 4).await;
    let c = client();
    let a = get(&c, &g.admin_url("/status.json"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("content-type"), "application/json");
    let text = a.text();
    for secret in [ABUSER_KEY, "sk_live_quiet_client_55aa", SECRET, "sk_live"] {
        assert!(!text.contains(secret), "{secret:?} in status.json: {text}");
    }
    let json: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let top = &json["top_limited"]["clients"];
    assert_eq!(
        top[0]["client"],
        hash_of_api_key(true, ABUSER_KEY),
        "{text}"
    );
    assert!(!text.contains(&hash_of_api_key(false, ABUSER_KEY)));
    assert_eq!(top[0]["policy"], "api");
    assert_eq!(top[0]["count"], 20);
    assert_eq!(json["top_limited"]["limited"], 20);
    // The quiet client was never limited: it is nowhere, not even hashed.
    assert!(!text.contains(&hash_of_api_key(true, "sk_live_quiet_client_55aa")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_its_files_come_from_the_admin_server_alone() {
    let g = Gateway::start("", &policy_body("[store]\nbackend = \"memory\"\n"));
    let c = client();
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/status.css", "text/css; charset=utf-8"),
        ("/status.js", "text/javascript; charset=utf-8"),
    ] {
        let a = get(&c, &g.admin_url(path), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        assert_eq!(a.header("content-type"), content_type, "{path}");
        assert!(
            a.header("content-security-policy")
                .starts_with("default-src 'none'; script-src 'self'"),
            "{path}: {:?}",
            a.headers
        );
        let body = a.text();
        for external in ["https://", "src=\"http", "href=\"http", "@import", "url("] {
            assert!(!body.contains(external), "{path} refers to {external}");
        }
    }
    // The other admin endpoints are unchanged.
    let metrics = get(&c, &g.admin_url("/metrics"), &[]).await;
    assert!(metrics.text().contains("tollgate_decisions_total"));
    assert_eq!(
        get(&c, &g.admin_url("/healthz"), &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, &g.admin_url("/nope"), &[]).await.status,
        StatusCode::NOT_FOUND
    );
}

/// Debian's chromium (or `TOLLGATE_CHROMIUM`), under the testkit's one skip rule.
fn chromium() -> Option<PathBuf> {
    tollgate_testkit::require_path(&tollgate_testkit::program::CHROMIUM)
}

/// Runs headless chromium on `url` with `args`, stdout to `out`, killed after 90 s.
fn run_chromium(bin: &Path, url: &str, args: &[String], out: &Path) {
    let profile = scratch("chromium-profile");
    let stdout = std::fs::File::create(out).expect("chromium output file");
    let stderr = std::fs::File::create(out.with_extension("stderr")).expect("stderr file");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            // Virtual time runs the page's one-second refreshes without waiting for them.
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            assert!(
                status.success(),
                "chromium exited with {status}: {}",
                std::fs::read_to_string(out.with_extension("stderr")).unwrap_or_default()
            );
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(profile);
}

/// The page's DOM after its scripts ran.
fn rendered_dom(bin: &Path, url: &str) -> String {
    let out = scratch("dom.html");
    run_chromium(bin, url, &["--dump-dom".to_string()], &out);
    let dom = std::fs::read_to_string(&out).expect("dom written");
    assert!(dom.contains("<table id=\"decisions\""), "no page: {dom}");
    dom
}

/// The value of `attr` in the tag of the DOM that contains `marker`.
fn attr_of(dom: &str, marker: &str, attr: &str) -> String {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in the page: {dom}"));
    let start = dom[..at].rfind('<').unwrap_or(0);
    let end = at + dom[at..].find('>').unwrap_or(dom.len() - at);
    let tag = &dom[start..end];
    let key = format!("{attr}=\"");
    let from = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {attr} in {tag}"))
        + key.len();
    tag[from..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_in_a_browser_shows_the_counts_the_top_client_and_an_open_breaker() {
    let Some(browser) = chromium() else {
        return;
    };
    let mut redis = RedisServer::start();
    // A generous timeout: on a loaded machine a slow call must not turn an `allowed` into a
    // `failed_open`. A killed Redis refuses connections at once, so the breaker still opens.
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n\
         breaker = {{ failures = 3, open_for = \"1m\" }}\non_failure = \"open\"\n",
        redis.url()
    );
    let g = Gateway::start("", &policy_body(&store));
    // Quiet clients stay within their 20; the abuser goes far past it.
    let mut allowed = 0;
    let mut limited = 0;
    for i in 0..6 {
        let (a, l) = load(&g, &format!("sk_live_quiet_{i}"), 8).await;
        allowed += a;
        limited += l;
    }
    let (a, l) = load(&g, ABUSER_KEY, 160).await;
    allowed += a;
    limited += l;
    assert_eq!((allowed, limited), (6 * 8 + 20, 140));
    // Two readings of the counters, so the page has rates too.
    tokio::time::sleep(Duration::from_millis(2_200)).await;

    let c = client();
    let metrics = get(&c, &g.admin_url("/metrics"), &[]).await.text();
    assert_eq!(decisions(&metrics, "allowed"), allowed);
    assert_eq!(decisions(&metrics, "limited"), limited);
    let page = g.admin_url("/");
    let dom = tokio::task::spawn_blocking({
        let (browser, page) = (browser.clone(), page.clone());
        move || rendered_dom(&browser, &page)
    })
    .await
    .expect("browser task");
    // The load is over, so the page and /metrics agree exactly (within one refresh).
    let shown = |outcome: &str| -> u64 {
        attr_of(&dom, &format!("id=\"total-api-{outcome}\""), "data-total")
            .parse()
            .expect("a count")
    };
    assert_eq!(shown("allowed"), allowed, "allowed shown");
    assert_eq!(shown("limited"), limited, "limited shown");
    let top = attr_of(&dom, "data-client=", "data-client");
    assert_eq!(
        top,
        hash_of_api_key(false, ABUSER_KEY),
        "most limited client"
    );
    assert_eq!(attr_of(&dom, "data-client=", "data-count"), "140");
    assert!(!dom.contains(ABUSER_KEY), "the raw API key is on the page");
    assert_eq!(attr_of(&dom, "id=\"breaker\"", "data-state"), "closed");

    // Under load, what the page shows lies between /metrics before and after it was read.
    let before = decisions(
        &get(&c, &g.admin_url("/metrics"), &[]).await.text(),
        "allowed",
    );
    let background = tokio::spawn({
        let url = g.url("/");
        async move {
            let c = client();
            // Bounded: 40 clients x 10 requests (half their quota), about 25 ms apart.
            for round in 0..10 {
                for i in 0..40 {
                    let key = format!("sk_live_busy_{i}");
                    let a = get(&c, &url, &[("x-api-key", key.as_bytes())]).await;
                    assert_eq!(a.status, StatusCode::OK, "round {round}");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dom_under_load = tokio::task::spawn_blocking({
        let (browser, page) = (browser.clone(), page.clone());
        move || rendered_dom(&browser, &page)
    })
    .await
    .expect("browser task");
    let after = decisions(
        &get(&c, &g.admin_url("/metrics"), &[]).await.text(),
        "allowed",
    );
    let shown_under_load: u64 = attr_of(&dom_under_load, "id=\"total-api-allowed\"", "data-total")
        .parse()
        .expect("a count");
    assert!(
        (before..=after).contains(&shown_under_load),
        "shown {shown_under_load}, /metrics {before} before and {after} after"
    );
    background.await.expect("background load");

    let shot = scratch("status-page.png");
    tokio::task::spawn_blocking({
        let (browser, page, shot) = (browser.clone(), page.clone(), shot.clone());
        move || {
            let out = scratch("screenshot.out");
            let args = [
                format!("--screenshot={}", shot.display()),
                "--window-size=1280,1700".to_string(),
            ];
            run_chromium(&browser, &page, &args, &out);
        }
    })
    .await
    .expect("screenshot task");
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    println!("status page screenshot: {}", shot.display());

    // Redis goes away: requests fail open, the breaker opens, and the page says so.
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut open = false;
    while !open && Instant::now() < deadline {
        load(&g, "sk_live_after_redis", 4).await;
        let m = get(&c, &g.admin_url("/metrics"), &[]).await.text();
        open = m.lines().any(|l| l == "tollgate_breaker_open 1");
    }
    assert!(
        open,
        "the breaker did not open within 20 s of Redis going away"
    );
    let dom = tokio::task::spawn_blocking(move || rendered_dom(&browser, &page))
        .await
        .expect("browser task");
    assert_eq!(attr_of(&dom, "id=\"breaker\"", "data-state"), "open");
    assert!(
        shown_failed_open(&dom) > 0,
        "failed_open decisions are shown"
    );
}

fn shown_failed_open(dom: &str) -> u64 {
    attr_of(dom, "id=\"total-api-failed_open\"", "data-total")
        .parse()
        .expect("a count")
}
