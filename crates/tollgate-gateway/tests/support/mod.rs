//! Real processes on real sockets: the `tollgate` binary, an upstream the test starts, and an
//! HTTP client. Loopback only; every wait is bounded.
#![allow(dead_code)]

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A scratch file path unique to this process and call.
pub fn scratch(name: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("tollgate-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(format!("{n}-{name}"))
}

/// The `tollgate` binary.
/// The JSON report a `tollgate bench --json PATH` run wrote, after checking that it
/// succeeded (its output is shown otherwise).
pub fn bench_report(output: &Output, json: &Path) -> serde_json::Value {
    assert!(
        output.status.success(),
        "bench failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(json).expect("json written");
    serde_json::from_str(&text).expect("valid json")
}

/// Every test that starts the binary starts clear of the hour's edge (see
/// `tollgate_testkit::edge`): the gateways of these tests count in hour windows.
pub fn tollgate() -> Command {
    tollgate_testkit::start_clear_of_the_hour();
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// A running `tollgate serve`, killed on drop.
pub struct Gateway {
    pub child: Child,
    pub port: u16,
    pub admin_port: u16,
    pub log: PathBuf,
    /// The config file it was started with.
    pub config: PathBuf,
    /// The `[server]` table written at the top of that file.
    pub head: String,
}

impl Gateway {
    /// Starts `tollgate serve` with `[server] listen/admin_listen` filled in and `body`
    /// appended (which must not contain a `[server]` table; use `server_extra` for keys).
    /// Ports are picked free and, should another process take one first, picked again.
    pub fn start(server_extra: &str, body: &str) -> Gateway {
        Gateway::start_env(server_extra, body, &[])
    }

    /// [`Gateway::start`] with these environment variables set for the process.
    pub fn start_env(server_extra: &str, body: &str, env: &[(&str, &str)]) -> Gateway {
        let mut last_log = String::new();
        for _ in 0..3 {
            let port = free_port();
            let admin_port = free_port();
            let head = format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n{server_extra}\n"
            );
            let text = format!("{head}{body}");
            let config = scratch("gateway.toml");
            std::fs::write(&config, text).expect("write config");
            let log = scratch("gateway.log");
            let stderr = std::fs::File::create(&log).expect("log file");
            let child = tollgate()
                .arg("serve")
                .arg("--config")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(stderr)
                .envs(env.iter().copied())
                .spawn()
                .expect("spawn tollgate serve");
            let mut g = Gateway {
                child,
                port,
                admin_port,
                log,
                config,
                head,
            };
            match g.wait_healthy() {
                Ok(()) => return g,
                // Two free ports picked apart can come out equal: pick again.
                Err(log) if log.contains("cannot listen") || log.contains("must differ") => {
                    last_log = log
                }
                Err(log) => panic!("tollgate serve did not start: {log}"),
            }
        }
        panic!("tollgate serve could not bind free ports: {last_log}");
    }

    /// Starts `tollgate serve` in proxy mode in front of `up` (`server_extra`: more keys of
    /// `[server]`).
    pub fn proxy(up: &Upstream, server_extra: &str, body: &str) -> Gateway {
        Gateway::start(
            &format!("upstream = \"{}\"\n{server_extra}", up.url()),
            body,
        )
    }

    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}: {}", self.log_text()));
            }
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.admin_port)) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                if s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                    .is_ok()
                {
                    let mut buf = String::new();
                    let _ = s.read_to_string(&mut buf);
                    if buf.starts_with("HTTP/1.1 200") {
                        return Ok(());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("not healthy within 20 s: {}", self.log_text()))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Replaces the config file with the same `[server]` table and `body` (written to a
    /// temporary file and renamed over it, as editors and config managers do).
    pub fn rewrite(&self, body: &str) {
        let tmp = self.config.with_extension("toml.new");
        std::fs::write(&tmp, format!("{}{body}", self.head)).expect("write config");
        std::fs::rename(&tmp, &self.config).expect("replace config");
    }

    /// Sends SIGHUP.
    pub fn hangup(&self) {
        let _ = Command::new("kill")
            .arg("-HUP")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Sends SIGTERM and requires a clean exit within `limit` (the test fails otherwise, with
    /// the gateway's log).
    #[allow(dead_code)]
    pub fn terminate_and_exit_within(&mut self, limit: Duration) {
        let started = Instant::now();
        self.terminate();
        let status = self.wait_exit(limit).unwrap_or_else(|| {
            panic!("still running {limit:?} after SIGTERM: {}", self.log_text())
        });
        assert!(status.success(), "{status}");
        assert!(started.elapsed() < limit);
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An echo upstream: answers 200 with the request body and `x-echo-*` headers describing
/// what it received; `/slow...` waits 3 s first. Counts the requests it saw.
pub struct Upstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let counter = counter.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let counter = counter.clone();
                        async move { Ok::<_, std::convert::Infallible>(echo(req, &counter).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Upstream { addr, hits, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn echo(req: Request<Incoming>, counter: &AtomicUsize) -> Response<Full<Bytes>> {
    counter.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    if parts.uri.path().starts_with("/slow") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let join = |name: &str| {
        parts
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let mut resp = Response::new(Full::new(body));
    let h = resp.headers_mut();
    let mut set = |k: &'static str, v: String| {
        if let Ok(v) = http::HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    set("x-echo-method", parts.method.to_string());
    set("x-echo-uri", parts.uri.to_string());
    set("x-echo-xff", join("x-forwarded-for"));
    set("x-echo-forwarded", join("forwarded"));
    set("x-echo-hop", join("x-hop"));
    set("x-echo-custom", join("x-custom"));
    set("x-echo-host", join("host"));
    set("x-echo-xfp", join("x-forwarded-proto"));
    set("x-echo-xfh", join("x-forwarded-host"));
    set("x-echo-real-ip", join("x-real-ip"));
    resp
}

/// An HTTP/1 client.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// One answer, fully read.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `type` of an error answer's problem, after checking that it is
    /// `application/problem+json` and that its `status` member is the answer's status.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            "application/problem+json",
            "{}",
            self.text()
        );
        problem_type_of(&self.text(), self.status.as_u16())
    }
}

/// The `type` of a raw answer's problem (head and body as read from the socket), after the
/// same checks as [`Answer::problem_type`].
pub fn raw_problem_type(answer: &str) -> String {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {answer:?}"));
    let code: u16 = status_line(head)
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("content-type: application/problem+json")),
        "{answer}"
    );
    problem_type_of(body, code)
}

fn problem_type_of(body: &str, code: u16) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: not JSON: {body:?}"));
    assert_eq!(v["status"], code, "{body}");
    assert!(v["title"].is_string(), "{body}");
    v["type"]
        .as_str()
        .unwrap_or_else(|| panic!("no type in {body}"))
        .to_owned()
}

/// Sends one request (bounded by 20 s).
pub async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: Method,
    url: &str,
    headers: &[(&str, &[u8])],
    body: impl Into<Bytes>,
) -> Answer {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body.into())).expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .expect("no answer within 20 s")
        .expect("request failed");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// GET with headers.
pub async fn get(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    headers: &[(&str, &[u8])],
) -> Answer {
    send(client, Method::GET, url, headers, Bytes::new()).await
}

/// Writes raw bytes to the gateway and returns the status line of its answer ("" if none).
pub async fn raw(port: u16, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let _ = s.write_all(bytes).await;
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(2).any(|w| w == b"\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Writes `bytes` while reading the answer (so a server that answers and closes before
/// reading everything cannot reset the answer away), for up to `wait`; returns all it read.
pub async fn exchange(port: u16, bytes: &[u8], wait: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let (mut rd, mut wr) = s.into_split();
    let bytes = bytes.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&bytes).await;
        wr
    });
    let mut got = Vec::new();
    let _ = tokio::time::timeout(wait, rd.read_to_end(&mut got)).await;
    writer.abort();
    String::from_utf8_lossy(&got).into_owned()
}

/// Sends `request` over a blocking loopback connection and returns the answer's status line
/// ("" when the connection or the answer fails; reads wait at most 5 s).
pub fn blocking_status_line(port: u16, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(request);
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    status_line(&buf).to_string()
}

/// The first line of `text`.
pub fn status_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// The value of `tollgate_http_responses_total{code="CODE"}` in a metrics text (0 if absent).
pub fn responses(metrics: &str, code: u16) -> u64 {
    let key = format!("tollgate_http_responses_total{{code=\"{code}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `tollgate check-config PATH`: whether it accepted the file, and what it printed (stderr,
/// then stdout).
#[allow(dead_code)]
pub fn run_check_config(path: &std::path::Path) -> (bool, String) {
    let out = tollgate()
        .arg("check-config")
        .arg(path)
        .output()
        .expect("run check-config");
    let printed =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), printed)
}

/// How many cases a proptest through the binary runs: `PROPTEST_CASES`, else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One of `choices`, each as likely as the others.
pub fn any_of(
    choices: &'static [&'static [u8]],
) -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::strategy::Strategy;
    proptest::sample::select(choices).prop_map(<[u8]>::to_vec)
}
