//! Decision mode behind a real nginx `auth_request`, configured as docs/forward-auth.md says:
//! a client's own `X-Forwarded-Uri` and `X-Forwarded-For` no longer choose its policy or its
//! identity. Needs the `nginx` binary (with the auth_request module, as Debian builds it):
//! scripts/test installs it, and a machine without it fails this test unless
//! `TOLLGATE_SKIP_MISSING` names nginx (the testkit's one skip rule).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// A foreground nginx on a free port, killed on drop.
struct Nginx {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tier lines of docs/forward-auth.md: the plan comes from a `map` on the API key (where a
/// real deployment has its own source), and the client's own `X-Plan` is overwritten.
const TIER_MAP: &str = "map $http_x_api_key $plan {\n default \"\";\n \"key-of-an-enterprise-customer\" enterprise;\n}\n";
const TIER_HEADER: &str = "   proxy_set_header X-Plan $plan;\n";

/// The location blocks of docs/forward-auth.md, in front of `upstream`, asking `gateway`.
fn start_nginx(bin: &std::path::Path, gateway: u16, upstream: &str) -> Nginx {
    start_nginx_with(bin, gateway, upstream, "", "")
}

/// [`start_nginx`] with `http_extra` in the `http` block and `auth_extra` in `location = /auth`.
fn start_nginx_with(
    bin: &std::path::Path,
    gateway: u16,
    upstream: &str,
    http_extra: &str,
    auth_extra: &str,
) -> Nginx {
    let dir = scratch("nginx");
    std::fs::create_dir_all(&dir).expect("nginx dir");
    let port = free_port();
    let d = dir.display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log;\nevents {{ worker_connections 64; }}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n\
         {http_extra}server {{\n listen 127.0.0.1:{port};\n\
          location / {{ auth_request /auth; proxy_pass {upstream}; }}\n\
          location = /auth {{\n   internal;\n   proxy_pass http://127.0.0.1:{gateway};\n\
           proxy_pass_request_body off;\n   proxy_set_header Content-Length \"\";\n\
           proxy_set_header X-Original-URI $request_uri;\n\
           proxy_set_header X-Forwarded-Method $request_method;\n\
           proxy_set_header X-Forwarded-For $remote_addr;\n\
           proxy_set_header X-Forwarded-Uri \"\";\n{auth_extra}  }}\n }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).expect("write nginx.conf");
    let child = Command::new(bin)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nginx");
    let nginx = Nginx { child, port, dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nginx did not start: {}",
            std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nginx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_a_client_cannot_pick_its_path_or_its_address() {
    let Some(bin) = tollgate_testkit::require_path(&tollgate_testkit::program::NGINX) else {
        return;
    };
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "forward_auth = { uri_header = \"x-original-uri\" }",
        "[identity]\nsources = [\"ip\"]\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [[policy]]\nname = \"api\"\nmatch = { path_prefix = \"/api\" }\n\
         algorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\n",
    );
    let nginx = start_nginx(&bin, gw.port, &up.url());
    let mut statuses = Vec::new();
    for i in 0..6 {
        let spoof = format!(
            "x-forwarded-uri: /public\r\nx-original-uri: /public\r\nx-forwarded-for: 10.9.8.{i}\r\n"
        );
        let req = format!("GET /api/n HTTP/1.1\r\nhost: x\r\n{spoof}connection: close\r\n\r\n");
        let answer = exchange(nginx.port, req.as_bytes(), Duration::from_secs(5)).await;
        statuses.push(status_line(&answer).to_string());
    }
    // nginx turns the 429 of an auth sub-request into a 500 (docs/forward-auth.md).
    let allowed = statuses.iter().filter(|s| s.contains(" 200 ")).count();
    let refused = statuses.iter().filter(|s| s.contains(" 500 ")).count();
    assert_eq!(
        (allowed, refused),
        (2, 4),
        "{statuses:?}\n{}",
        gw.log_text()
    );
    assert_eq!(
        up.hits(),
        2,
        "only the allowed requests reached the upstream"
    );
    let m = get(&client(), &gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        m.contains("tollgate_decisions_total{policy=\"api\",outcome=\"limited\"} 4"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_a_client_cannot_pick_its_own_tier() {
    let Some(bin) = tollgate_testkit::require_path(&tollgate_testkit::program::NGINX) else {
        return;
    };
    let up = Upstream::start().await;
    let identity =
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\ntrusted_proxies = [\"127.0.0.1\"]\n";
    let policy = "[[policy]]\nname = \"api\"\nmatch = { path_prefix = \"/api\" }\n\
         algorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\ntier = \"header:x-plan\"\n\
         tiers.enterprise = { limit = 1000 }\n";
    let gw = Gateway::start(
        "forward_auth = { uri_header = \"x-original-uri\" }",
        &format!("{identity}proxy_set_headers = [\"x-plan\"]\n{policy}"),
    );
    let nginx = start_nginx_with(&bin, gw.port, &up.url(), TIER_MAP, TIER_HEADER);
    let ask = |headers: &'static str| {
        let req = format!("GET /api/n HTTP/1.1\r\nhost: x\r\n{headers}connection: close\r\n\r\n");
        let port = nginx.port;
        async move {
            let answer = exchange(port, req.as_bytes(), Duration::from_secs(5)).await;
            status_line(&answer).contains(" 200 ")
        }
    };
    // A client claiming the enterprise tier gets the base quota: 3 of 20.
    let mut admitted = 0;
    for _ in 0..20 {
        if ask("x-plan: enterprise\r\nx-api-key: mine\r\n").await {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3, "{}", gw.log_text());
    // The customer nginx maps to the enterprise tier gets it.
    for i in 0..10 {
        assert!(
            ask("x-api-key: key-of-an-enterprise-customer\r\n").await,
            "enterprise request {i}: {}",
            gw.log_text()
        );
    }
    // check-config says nothing about this config, and warns about it without the list.
    let path = scratch("tiers.toml");
    std::fs::write(
        &path,
        format!("{identity}proxy_set_headers = [\"x-plan\"]\n{policy}"),
    )
    .expect("write");
    let (ok, out) = run_check_config(&path);
    assert!(ok && !out.contains("warning"), "{out}");
    std::fs::write(&path, format!("{identity}{policy}")).expect("write");
    let (ok, out) = run_check_config(&path);
    assert!(ok, "{out}");
    assert!(
        out.contains("policy[0].tier: clients can choose their tier")
            && out.contains("identity.proxy_set_headers"),
        "{out}"
    );
}
