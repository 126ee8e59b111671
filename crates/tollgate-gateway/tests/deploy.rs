//! The deployment files work as shipped: the container image (built by `scripts/image`, run
//! with podman) limits requests as a non-root user on a read-only root; the Kubernetes
//! manifests render with kustomize and validate against the Kubernetes schemas; the systemd
//! unit verifies and its exposure score stays under 2.0. Each test needs an outside program
//! and skips only through the testkit's rule (TOLLGATE_SKIP_MISSING=podman,kubectl,...).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::*;
use tollgate_testkit::{require_path, Program};

const PODMAN: Program = Program {
    name: "podman",
    executables: &["podman"],
    paths: &[],
    env: None,
    package: "podman runc",
};
const KUBECTL: Program = Program {
    name: "kubectl",
    executables: &["kubectl"],
    paths: &[],
    env: None,
    package: "kubectl",
};
const KUBERNETES_VALIDATE: Program = Program {
    name: "kubernetes-validate",
    executables: &["kubernetes-validate"],
    paths: &[],
    env: None,
    package: "kubernetes-validate (pip install kubernetes-validate)",
};
const SYSTEMD_ANALYZE: Program = Program {
    name: "systemd-analyze",
    executables: &["systemd-analyze"],
    paths: &[],
    env: None,
    package: "systemd",
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// podman with the settings a container-in-a-sandbox machine needs (runc, cgroupfs, no
/// default ulimits), which also work on an ordinary host.
fn podman(bin: &Path, conf: &Path) -> Command {
    let mut c = Command::new(bin);
    c.env("CONTAINERS_CONF", conf)
        .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    c
}

/// The binary to package: `TOLLGATE_IMAGE_BINARY`, else target/release/tollgate (scripts/test
/// builds it), else the test suite's own.
fn image_binary() -> PathBuf {
    if let Some(b) = std::env::var_os("TOLLGATE_IMAGE_BINARY") {
        return PathBuf::from(b);
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo().join("target"), PathBuf::from);
    let release = target.join("release/tollgate");
    if release.is_file() {
        return release;
    }
    eprintln!("no target/release/tollgate: packaging the test build's binary");
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate"))
}

/// Removes the container when the test ends, however it ends.
struct Container<'a> {
    name: String,
    podman: &'a Path,
    conf: &'a Path,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = podman(self.podman, self.conf)
            .args(["rm", "--force", "--time", "2", &self.name])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_limits_requests_as_a_non_root_user_on_a_read_only_root() {
    let Some(bin) = require_path(&PODMAN) else {
        return;
    };
    let conf = scratch("containers.conf");
    std::fs::write(&conf, "[containers]\ndefault_ulimits = []\n").expect("write conf");
    let version = env!("CARGO_PKG_VERSION");
    let image = format!("tollgate:{version}");

    // scripts/image packages the release binary scripts/test built before the suite (a cargo
    // build inside a test would run past nextest's timeout on a small machine); without one,
    // the binary this test suite built goes through the same steps.
    let mut build = Command::new(repo().join("scripts/image"));
    build
        .env("CONTAINERS_CONF", &conf)
        .arg("--binary")
        .arg(image_binary());
    let built = stdout(&run(&mut build));
    eprintln!("{built}");
    assert!(
        built.contains(&format!("built {image} and tollgate:latest")),
        "{built}"
    );

    let inspect = stdout(&run(podman(&bin, &conf).args([
        "image",
        "inspect",
        &image,
        "--format",
        "{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Cmd}}|{{json .Config.Env}}",
    ])));
    let fields: Vec<&str> = inspect.trim().split('|').collect();
    assert_eq!(fields[0], "65532:65532", "{inspect}");
    assert_eq!(fields[1], "[\"/usr/local/bin/tollgate\"]");
    assert_eq!(fields[2], "[\"serve\"]");
    assert!(fields[3].contains("TOLLGATE_CONFIG=/etc/tollgate/tollgate.toml"));

    // Only the binary, its libraries and its files: no shell, no package manager.
    let created = stdout(&run(podman(&bin, &conf).args(["create", &image])));
    let id = created.trim().to_string();
    let _created = Container {
        name: id.clone(),
        podman: &bin,
        conf: &conf,
    };
    let tar = scratch("image.tar");
    run(podman(&bin, &conf)
        .args(["export", "--output"])
        .arg(&tar)
        .arg(&id));
    let listing = stdout(&run(Command::new("tar").arg("-tf").arg(&tar)));
    let files: Vec<&str> = listing.lines().filter(|l| !l.ends_with('/')).collect();
    for needed in [
        "usr/local/bin/tollgate",
        "etc/tollgate/tollgate.toml",
        "etc/passwd",
    ] {
        assert!(files.contains(&needed), "{needed} missing: {files:?}");
    }
    for f in &files {
        let allowed = f.starts_with("usr/local/bin/tollgate")
            || f.starts_with("etc/")
            || f.starts_with("lib/")
            || f.starts_with("lib64/")
            || f.starts_with("usr/lib/");
        assert!(allowed, "unexpected file in the image: {f}");
        assert!(
            !f.ends_with("/sh") && !f.contains("apt") && !f.contains("dpkg"),
            "{f}"
        );
    }

    // The default config is valid.
    let checked = stdout(&run(podman(&bin, &conf).args([
        "run",
        "--rm",
        "--network",
        "host",
        "--read-only",
        &image,
        "check-config",
        "/etc/tollgate/tollgate.toml",
    ])));
    assert!(checked.contains(": ok"), "{checked}");

    // Serving: our config mounted over the default one, on free ports of the host network,
    // counting in an hour window (so clear of the hour's edge).
    tollgate_testkit::start_clear_of_the_hour();
    let (port, admin_port) = (free_port(), free_port());
    let config = scratch("image.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n\
             [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\n"
        ),
    )
    .expect("write config");
    let name = format!("tollgate-test-{}-{port}", std::process::id());
    let container = Container {
        name: name.clone(),
        podman: &bin,
        conf: &conf,
    };
    run(podman(&bin, &conf)
        .args([
            "run",
            "--detach",
            "--name",
            &name,
            "--network",
            "host",
            "--read-only",
        ])
        .arg("--volume")
        .arg(format!(
            "{}:/etc/tollgate/tollgate.toml:ro",
            config.display()
        ))
        .arg(&image));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut health = String::new();
    while Instant::now() < deadline {
        health = blocking_status_line(
            admin_port,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        );
        if health.starts_with("HTTP/1.1 200") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs = || {
        let out = podman(&bin, &conf).args(["logs", &name]).output();
        out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .unwrap_or_default()
    };
    assert!(
        health.starts_with("HTTP/1.1 200"),
        "not healthy: {}",
        logs()
    );

    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            get(&c, &format!("http://127.0.0.1:{port}/"), &[])
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{}", logs());

    // The process runs as the image's user, not root.
    let pid = stdout(&run(podman(&bin, &conf).args([
        "inspect",
        "--format",
        "{{.State.Pid}}",
        &name,
    ])));
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).expect("status");
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default()
        .to_string();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65532"),
        "{uid}"
    );

    // SIGTERM stops it cleanly.
    run(podman(&bin, &conf).args(["stop", "--time", "20", &name]));
    let code = stdout(&run(podman(&bin, &conf).args([
        "inspect",
        "--format",
        "{{.State.ExitCode}}",
        &name,
    ])));
    assert_eq!(code.trim(), "0", "{}", logs());
    drop(container);
}

/// The profile-guided build's scripts refuse bad arguments before building anything (a real
/// build takes two release builds and a training load: it is run by hand, see
/// scripts/build-pgo), and say what is wrong.
#[test]
fn the_pgo_build_scripts_refuse_bad_arguments_before_building() {
    let refused = |cmd: &mut Command, says: &str| {
        let shown = format!("{cmd:?}");
        let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
        assert_eq!(out.status.code(), Some(2), "{shown}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{shown}: {stderr}");
    };
    let script = |name: &str| Command::new(repo().join("scripts").join(name));
    refused(
        script("image").args(["--pgo", "--binary", "/bin/true"]),
        "--pgo builds the binary",
    );
    refused(script("build-pgo").arg("--fast"), "unknown argument --fast");
    for seconds in ["0", "601", "x", "1.5", "-3"] {
        refused(
            script("build-pgo").env("PGO_SECONDS", seconds),
            "PGO_SECONDS is a whole number",
        );
    }
    let help = stdout(&run(script("build-pgo").arg("--help")));
    assert!(help.contains("target/pgo/release/tollgate"), "{help}");
    assert!(help.contains("-Cprofile-use"), "{help}");
    // deploy/Containerfile's build step, run by `sh` as a container build runs it (its base
    // image cannot be pulled here): a PGO build-arg other than 0 or 1 is refused before any
    // package is installed or anything is built.
    let build_step = containerfile_build_step();
    for pgo in ["2", "yes", ""] {
        refused(
            Command::new("sh")
                .args(["-c", &build_step])
                .env("PGO", pgo)
                .current_dir(std::env::temp_dir()),
            "PGO is 0 or 1",
        );
    }
}

/// The shell of deploy/Containerfile's `RUN` after `ARG PGO=0` (the build), its continued
/// lines joined.
fn containerfile_build_step() -> String {
    let file = std::fs::read_to_string(repo().join("deploy/Containerfile"))
        .expect("read deploy/Containerfile");
    let after_arg = file
        .split_once("ARG PGO=0\n")
        .map(|(_, rest)| rest)
        .expect("deploy/Containerfile declares ARG PGO=0");
    let mut step = String::new();
    for line in after_arg.lines() {
        let (text, continued) = match line.strip_suffix('\\') {
            Some(text) => (text, true),
            None => (line, false),
        };
        step.push_str(text);
        step.push(' ');
        if !continued {
            break;
        }
    }
    step.strip_prefix("RUN ")
        .map(str::to_owned)
        .expect("a RUN follows ARG PGO=0")
}

/// `kubectl kustomize DIR`, validated by kubernetes-validate against the Kubernetes schemas;
/// returns the rendered YAML.
fn render_and_validate(kubectl: &Path, validate: &Path, dir: &str) -> String {
    let yaml = stdout(&run(Command::new(kubectl)
        .arg("kustomize")
        .arg(repo().join(dir))));
    let file = scratch("rendered.yaml");
    std::fs::write(&file, &yaml).expect("write rendered");
    let out = run(Command::new(validate).arg("--strict").arg(&file));
    let report = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        // The ServiceMonitor is the Prometheus Operator's CRD: not in the Kubernetes schemas.
        let crd = line.contains("Couldn't find schema for kind ServiceMonitor");
        assert!(line.contains(" passed ") || crd, "{dir}: {line}");
    }
    yaml
}

#[test]
fn the_kubernetes_manifests_render_and_validate() {
    let Some(kubectl) = require_path(&KUBECTL) else {
        return;
    };
    let Some(validate) = require_path(&KUBERNETES_VALIDATE) else {
        return;
    };
    let base = render_and_validate(&kubectl, &validate, "deploy/kubernetes/base");
    for kind in [
        "Deployment",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
    ] {
        assert!(base.contains(&format!("kind: {kind}\n")), "no {kind}");
    }
    for setting in [
        "runAsNonRoot: true",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "path: /healthz",
        "path: /readyz",
        "name: tollgate-secrets",
        "image: tollgate:0.1.0",
        "requests:",
        // A pod the autoscaler keeps below a core runs the one-thread scheduler.
        "- name: TOKIO_WORKER_THREADS\n          value: \"1\"\n",
    ] {
        assert!(base.contains(setting), "no {setting:?} in\n{base}");
    }
    // The ServiceMonitor scrapes the Service port that carries /metrics.
    assert!(
        base.contains("    path: /metrics\n    port: admin\n"),
        "{base}"
    );
    assert!(base.contains("  - name: admin\n    port: 9090"), "{base}");

    let tried = render_and_validate(&kubectl, &validate, "deploy/kubernetes/overlays/try-redis");
    assert!(tried.contains("name: tollgate-redis"));
    assert!(tried.contains("kind: Secret\n"));
    assert!(tried.contains("redis-url:"));
    // Redis's expiry in short slices (docs/operations.md, "Redis: `hz 100`").
    assert!(tried.contains("- --hz\n        - \"100\"\n"), "{tried}");
    // Full, it evicts the keys nearest to fresh, below the container's memory limit
    // (docs/operations.md, "Redis: memory").
    assert!(
        tried.contains("- --maxmemory\n        - 192mb\n        - --maxmemory-policy\n        - volatile-ttl\n"),
        "{tried}"
    );
    assert!(tried.contains("memory: 256Mi"), "{tried}");

    // The ConfigMap's file is a config `serve` accepts, with the Secret's variables set.
    let out = tollgate()
        .arg("check-config")
        .arg(repo().join("deploy/kubernetes/base/tollgate.toml"))
        .env("TOLLGATE_ADMIN_TOKEN", "0123456789abcdef0123")
        .env("TOLLGATE_IDENTITY_SECRET", "s")
        .env("TOLLGATE_REDIS_URL", "redis://tollgate-redis:6379")
        .output()
        .expect("check-config");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_systemd_unit_verifies_and_its_exposure_is_below_two() {
    let Some(analyze) = require_path(&SYSTEMD_ANALYZE) else {
        return;
    };
    let unit =
        std::fs::read_to_string(repo().join("deploy/systemd/tollgate.service")).expect("unit file");
    for line in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "ExecReload=kill -HUP $MAINPID",
        "Environment=TOLLGATE_CONFIG=/etc/tollgate/tollgate.toml",
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line}");
    }
    // verify checks that ExecStart's binary exists: point it at the one this test built.
    let dir = scratch("unit");
    std::fs::create_dir_all(&dir).expect("unit dir");
    let file = dir.join("tollgate.service");
    std::fs::write(
        &file,
        unit.replace("/usr/local/bin/tollgate", env!("CARGO_BIN_EXE_tollgate")),
    )
    .expect("write unit");
    let out = run(Command::new(&analyze)
        .args(["verify", "--man=no"])
        .arg(&file));
    let said = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(said.trim().is_empty(), "{said}");

    let out = run(Command::new(&analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&file));
    let report = stdout(&out);
    let score: f64 = report
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for tollgate.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in\n{report}"));
    assert!(score < 2.0, "exposure {score}\n{report}");
}

/// Every series the dashboard queries is one the gateway's /metrics serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_metrics_the_gateway_serves() {
    let text =
        std::fs::read_to_string(repo().join("deploy/grafana/tollgate.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let gw = Gateway::start(
        "",
        "[[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 5\nperiod = \"1s\"\n",
    );
    let metrics = get(&client(), &gw.admin_url("/metrics"), &[]).await.text();
    let families: Vec<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    let mut queried = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for name in metric_names(expr) {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(f)))
                    .unwrap_or(&name);
                assert!(
                    families.contains(&family),
                    "{:?} queries {name}, which /metrics does not serve ({families:?})",
                    panel["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= 10);
    assert!(metric_names(&text).contains(&"tollgate_limit".to_string()));
}

/// The `tollgate_*` names in a PromQL expression (or any text).
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("tollgate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}
