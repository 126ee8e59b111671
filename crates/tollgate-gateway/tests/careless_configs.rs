//! A hurried operator's configs, run through the real binary: what `check-config` and
//! `serve` refuse (exit 2, one `error: FILE:LINE:COL: KEY: ...` line each), what they only
//! warn about, and that secrets in store URLs never reach the output.

mod support;

use std::time::{Duration, Instant};
use support::{scratch, tollgate, Gateway};

const POLICY: &str =
    "[[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1m\"\n";

/// Runs `tollgate <command> [--config] FILE` on `text`: exit code, stdout, stderr (the file's
/// path shown as FILE).
fn run(command: &str, text: &str) -> (i32, String, String) {
    let path = scratch("careless.toml");
    std::fs::write(&path, text).expect("write config");
    let mut cmd = tollgate();
    cmd.arg(command);
    if command == "serve" {
        cmd.arg("--config");
    }
    let out = cmd.arg(&path).output().expect("run tollgate");
    let shown = |b: &[u8]| String::from_utf8_lossy(b).replace(&path.display().to_string(), "FILE");
    (
        out.status.code().unwrap_or(-1),
        shown(&out.stdout),
        shown(&out.stderr),
    )
}

fn refused(text: &str, expected: &str) -> String {
    let (code, _, err) = run("check-config", text);
    assert_eq!(code, 2, "check-config accepted:\n{text}\n{err}");
    assert!(err.contains(expected), "expected {expected:?} in:\n{err}");
    for line in err.lines() {
        assert!(line.starts_with("error: FILE:"), "{line}");
    }
    err
}

#[test]
fn unusable_store_urls_are_refused_with_line_and_key() {
    for (url, why) in [
        ("redis://%%%", "neither a DNS name nor an IP address"),
        ("redis://host:notaport", "not a number from 1 to 65535"),
        ("redis://host:99999", "not a number from 1 to 65535"),
        ("redis://host:6379/db", "Invalid database number"),
        ("http://host:6379", "expected redis://"),
    ] {
        let text = format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\n{POLICY}");
        let err = refused(&text, why);
        assert!(err.starts_with("error: FILE:3:7: store.url: "), "{err}");
    }
    let text = format!(
        "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://a:7000\",\n  \"redis://b:70000\"]\n{POLICY}"
    );
    let err = refused(&text, "is not a number from 1 to 65535");
    assert!(err.starts_with("error: FILE:4:3: store.urls: "), "{err}");
    // No part of the URL is repeated, least of all its user and password.
    let text = format!("[store]\nbackend = \"redis\"\nurl = \"redis://app:hunter2@host:notaport/0?password=s3cret\"\n{POLICY}");
    let err = refused(&text, "store.url: is not a usable Redis URL");
    for part in ["app", "hunter2", "s3cret", "notaport"] {
        assert!(!err.contains(part), "{part}: {err}");
    }
}

#[test]
fn a_zero_cost_is_refused() {
    let err = refused(
        &format!("{POLICY}cost = 0\n"),
        "policy[0].cost: must be a positive integer",
    );
    assert!(err.starts_with("error: FILE:6:8: "), "{err}");
}

#[test]
fn a_catch_all_trusted_proxy_list_needs_allow_any_proxy() {
    for list in [
        "[\"0.0.0.0/0\"]",
        "[\"10.0.0.1\", \"::/0\"]",
        "[\"0.0.0.0/1\", \"128.0.0.0/1\"]",
    ] {
        let text = format!("[identity]\ntrusted_proxies = {list}\n{POLICY}");
        let err = refused(&text, "identity.trusted_proxies: covers every");
        assert!(err.contains("allow_any_proxy = true"), "{err}");
        let text =
            format!("[identity]\ntrusted_proxies = {list}\nallow_any_proxy = true\n{POLICY}");
        let (code, out, err) = run("check-config", &text);
        assert_eq!(code, 0, "{out}{err}");
    }
    // A broad but partial list is the operator's call.
    let (code, _, err) = run(
        "check-config",
        &format!("[identity]\ntrusted_proxies = [\"10.0.0.0/8\", \"0.0.0.0/1\"]\n{POLICY}"),
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_config_without_policies_is_valid_with_a_warning() {
    let (code, out, err) = run("check-config", "[store]\nbackend = \"memory\"\n");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (memory store, 0 policies"), "{out}");
    assert!(err.starts_with("warning: FILE: no [[policy]]"), "{err}");
    let (code, _, err) = run("check-config", POLICY);
    assert_eq!(code, 0);
    assert!(err.is_empty(), "{err}");
}

#[test]
fn a_huge_value_is_not_echoed_at_all() {
    let huge = "x".repeat(5_000_000);
    let err = refused(
        &format!("[server]\nlisten = \"{huge}\"\n{POLICY}"),
        "server.listen",
    );
    assert!(err.len() < 1_000, "{} bytes of error", err.len());
    assert!(
        err.starts_with("error: FILE:2:10: server.listen: is not an address"),
        "{err}"
    );
    assert!(!err.contains("xxx"), "{err}");
    assert!(err.contains("expected IP:PORT"), "{err}");
    // The same through serve, before it binds anything.
    let (code, _, err) = run(
        "serve",
        &format!("[store]\nkey_prefix = \"{huge} \"\n{POLICY}"),
    );
    assert_eq!(code, 2);
    assert!(
        err.len() < 1_000 && err.contains("store.key_prefix"),
        "{err}"
    );
}

#[test]
fn serve_refuses_what_check_config_refuses() {
    let (code, _, err) = run("serve", &format!("{POLICY}cost = 0\n"));
    assert_eq!(code, 2);
    assert!(err.starts_with("error: FILE:6:8: policy[0].cost"), "{err}");
}

/// Sends one request and returns the status line (the store is down: the policy fails open).
fn status_line(port: u16) -> String {
    support::blocking_status_line(
        port,
        b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
}

#[test]
fn store_secrets_never_reach_the_log() {
    let dead = support::free_port();
    for store in [
        format!("backend = \"redis\"\nurl = \"redis://app:hunter2@127.0.0.1:{dead}/0?password=s3cret\""),
        format!("backend = \"redis-cluster\"\nurls = [\"redis://:hunter2@127.0.0.1:{dead}?PASSWORD=s3cret\"]"),
        format!("backend = \"redis-sentinel\"\nmaster_name = \"m\"\nurls = [\"redis://:hunter2@127.0.0.1:{dead}\", \"redis://127.0.0.1:{dead}?password=s3cret\"]"),
    ] {
        let g = Gateway::start(
            "",
            &format!("[store]\n{store}\ntimeout = \"50ms\"\non_failure = \"open\"\n[identity]\nsecret = \"id-secret\"\n{POLICY}"),
        );
        // A few requests so that store failures are logged too.
        for _ in 0..3 {
            assert!(status_line(g.port).starts_with("HTTP/1.1 200"));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !g.log_text().contains("tollgate started") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = g.log_text();
        assert!(log.contains("tollgate started"), "{log}");
        assert!(log.contains(":***@127.0.0.1"), "{log}");
        for secret in ["hunter2", "s3cret", "id-secret"] {
            assert!(!log.contains(secret), "{secret} in the log:\n{log}");
        }
    }
}
