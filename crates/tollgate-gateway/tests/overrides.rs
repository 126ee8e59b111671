//! `[overrides] file` through the real `tollgate serve` binary: a named API key gets its own
//! quota, every other client keeps the policy's; the raw key is hashed at load and appears in
//! no log line and no error. Mistakes in the overrides file are reported with its own lines.

mod support;

use http::StatusCode;
use support::*;

const VIP: &str = "sk_live_vip_4b7e20d9";

async fn admitted(g: &Gateway, key: &str, n: usize) -> usize {
    let c = client();
    let mut ok = 0;
    for _ in 0..n {
        let headers: &[(&str, &[u8])] = if key.is_empty() {
            &[]
        } else {
            &[("x-api-key", key.as_bytes())]
        };
        let a = get(&c, &g.url("/"), headers).await;
        match a.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}: {}", a.text()),
        }
    }
    ok
}

fn config(overrides: &std::path::Path) -> String {
    format!(
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\nsecret = \"overrides-test-secret\"\n\
         [overrides]\nfile = {:?}\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\n",
        overrides.display().to_string()
    )
}

#[tokio::test]
async fn a_named_api_key_gets_its_own_quota_and_others_keep_the_default() {
    let file = scratch("overrides.toml");
    std::fs::write(
        &file,
        format!(
            "[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key={VIP}\"\nlimit = 6\n\n\
             [[override]]\npolicy = \"api\"\nidentity = \"ip=127.0.0.1\"\nlimit = 9\nperiod = \"2h\"\n"
        ),
    )
    .expect("write overrides");
    let g = Gateway::start("", &config(&file));
    assert_eq!(admitted(&g, VIP, 10).await, 6);
    assert_eq!(admitted(&g, "someone-else", 10).await, 2);
    assert_eq!(admitted(&g, "sk_live_vip_4b7e20d", 10).await, 2);
    // Without a key the client is its address, which has an override of its own.
    assert_eq!(admitted(&g, "", 12).await, 9);
    assert!(!g.log_text().contains(VIP), "the raw key was logged");
}

#[test]
fn check_config_reports_override_mistakes_with_the_overrides_files_lines() {
    let cases = [
        ("[[override]]\npolicy = \"nope\"\nidentity = \"header:x-api-key=k\"\nlimit = 3\n", "override[0].policy", 2),
        ("[[override]]\npolicy = \"api\"\nidentity = \"header:x-user=secret-value\"\nlimit = 3\n", "override[0].identity", 3),
        ("[[override]]\npolicy = \"api\"\nidentity = \"no-equals-sign\"\nlimit = 3\n", "override[0].identity", 3),
        ("[[override]]\npolicy = \"api\"\nidentity = \"ip=not-an-ip\"\nlimit = 3\n", "override[0].identity", 3),
        ("[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=k\"\n", "override[0].limit", 1),
        ("[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=k\"\nlimit = 0\n", "override[0].limit", 4),
        ("[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=k\"\nlimit = 3\nperiod = \"x\"\n", "override[0].period", 5),
        ("[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=k\"\nlimit = 3\ncolour = 1\n", "colour", 5),
        ("[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=k\"\nlimit = 3\n[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=k\"\nlimit = 4\n", "override[1].identity", 5),
        // A type error names its own entry (the deserializer's, not override[0]).
        ("[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=a\"\nlimit = 3\n[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=b\"\nlimit = 3\n[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=c\"\nlimit = \"lots\"\n", "override[2].limit", 12),
    ];
    for (text, key, line) in cases {
        let file = scratch("bad-overrides.toml");
        std::fs::write(&file, text).expect("write overrides");
        let cfg = scratch("gateway.toml");
        std::fs::write(&cfg, config(&file)).expect("write config");
        let (accepted, err) = run_check_config(&cfg);
        assert!(!accepted, "{text:?} was accepted");
        assert!(err.contains(key), "{text:?}: {key} not in {err}");
        let at = format!("{}:{line}:", file.display());
        assert!(err.contains(&at), "{text:?}: {at} not in {err}");
        assert!(
            !err.contains("secret-value"),
            "an identity value was echoed: {err}"
        );
    }
    let cfg = scratch("gateway.toml");
    std::fs::write(
        &cfg,
        config(std::path::Path::new("/nonexistent/overrides.toml")),
    )
    .expect("write config");
    let out = tollgate()
        .arg("check-config")
        .arg(&cfg)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(err.contains("overrides.file"), "{err}");
    assert!(err.contains(&format!("{}:5:", cfg.display())), "{err}");
}

#[tokio::test]
async fn an_edited_overrides_file_applies_without_a_restart() {
    let file = scratch("overrides.toml");
    std::fs::write(&file, "").expect("write overrides");
    let g = Gateway::start("", &config(&file));
    assert_eq!(admitted(&g, "early-customer", 4).await, 2);
    // The customer gets a quota of its own by editing the overrides file alone.
    std::fs::write(
        &file,
        "[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=new-customer\"\nlimit = 5\n",
    )
    .expect("write overrides");
    let started = std::time::Instant::now();
    loop {
        // Under the default rule (2 an hour) until the override applies; a 429 there still
        // names the rule.
        let a = get(&client(), &g.url("/"), &[("x-api-key", b"new-customer")]).await;
        if a.header("ratelimit-policy").starts_with("\"api.override-") {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "not applied: {} {}",
            a.header("ratelimit-policy"),
            g.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The override is its own rule (its own state, whatever the default rule counted): 5 from
    // a fresh state, one already used by the probe that saw it.
    assert_eq!(admitted(&g, "new-customer", 8).await, 4);
    assert_eq!(admitted(&g, "someone-else", 4).await, 2);
}

#[tokio::test]
async fn reloads_of_changing_overrides_drop_the_series_of_the_removed_ones() {
    let file = scratch("overrides.toml");
    let write = |round: usize| {
        let mut text = String::new();
        for i in 0..200 {
            text.push_str(&format!(
                "[[override]]\npolicy = \"api\"\nidentity = \"header:x-api-key=round-{round}-key-{i}\"\nlimit = 5\n"
            ));
        }
        std::fs::write(&file, text).expect("write overrides");
    };
    write(0);
    let g = Gateway::start(
        "admin_token = \"overrides-test-admin-token\"",
        &config(&file),
    );
    let series = |m: &str| {
        m.lines()
            .filter(|l| l.starts_with("tollgate_decisions_total{policy=\"api.override-"))
            .count()
    };
    let metrics = || async { get(&client(), &g.admin_url("/metrics"), &[]).await.text() };
    let first = series(&metrics().await);
    assert_eq!(first, 200 * tollgate::Outcome::ALL.len());
    for round in 1..=5 {
        write(round);
        let a = send(
            &client(),
            http::Method::POST,
            &g.admin_url("/v1/reload"),
            &[(
                "authorization",
                b"Bearer overrides-test-admin-token".as_slice(),
            )],
            "",
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        assert_eq!(admitted(&g, &format!("round-{round}-key-7"), 6).await, 5);
    }
    let m = metrics().await;
    assert_eq!(
        series(&m),
        first,
        "the series of removed overrides stay: {} lines",
        m.lines().count()
    );
    // The status page shows the overrides as one row of their policy, whatever their number
    // (it samples once a second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let status = loop {
        let status = get(&client(), &g.admin_url("/status.json"), &[])
            .await
            .text();
        if status.contains("api.overrides") || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let v: serde_json::Value = serde_json::from_str(&status).expect("status json");
    let rows: Vec<&str> = v["policies"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(rows, ["api", "api.overrides"], "{status}");
    assert!(!status.contains("round-0"), "raw keys never appear");
}
