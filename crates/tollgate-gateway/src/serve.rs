//! `tollgate serve`: the gateway and the admin server, from a validated [`Config`].
//!
//! Every request goes through one `tollgate_tower::RateLimit` service wrapped around either
//! the reverse proxy or, in decision mode, a service that answers 200 (forward-auth). The
//! HTTP/1 server bounds what a client can send (header count and size) and shuts down
//! gracefully: on SIGTERM or SIGINT it stops accepting, lets in-flight requests finish for
//! up to [`GRACE`], then exits.

use crate::admin::status::{run_sampler, History};
use crate::admin::Admin;
use crate::config::{Config, StoreBackend};
use crate::http::conn_limit::ConnLimits;
use crate::http::metrics::HttpMetrics;
use crate::http::server::{serve_admin, serve_gateway, ShutdownSignals, GRACE};
use crate::live::{Hangup, Live};
use crate::telemetry::LogFormat;
use anyhow::Context as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_rls::LiveRls;

/// Binds `[rls] listen` and serves the rate limit service there until `stop` changes.
async fn spawn_rls(
    config: &Config,
    service: Option<LiveRls>,
    limits: Arc<ConnLimits>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let (Some(service), Some(addr)) = (service, config.rls.as_ref().and_then(|r| r.listen)) else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (rls.listen)"))?;
    let shown = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let domains: Vec<&str> = config.rls.iter().flat_map(|r| r.config.domains()).collect();
    tracing::info!(
        rls_listen = shown,
        ?domains,
        "envoy rate limit service listening"
    );
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let admit: tollgate_rls::Admit = Arc::new(move |ip| {
        let slot = limits.admit(ip);
        if slot.is_none() {
            tracing::debug!("rls connection limit reached; closing");
        }
        slot.map(|s| Box::new(s) as tollgate_rls::Admitted)
    });
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = tollgate_rls::serve_bounded(listener, service, Some(admit), shutdown).await
        {
            tracing::error!(error = %e, "rls listener failed");
        }
    })))
}

/// How long startup waits for a shared store to connect before serving anyway.
const STARTUP_CONNECT: Duration = Duration::from_secs(2);

/// Runs the gateway until SIGTERM or SIGINT; `path` is the file `config` was read from
/// (`None`: the built-in defaults), which a reload reads again.
pub async fn run(path: Option<std::path::PathBuf>, config: Config) -> anyhow::Result<()> {
    let hangup = Hangup::listen();
    let limiter = crate::assemble::limiter(&config);
    let http_metrics = Arc::new(HttpMetrics::default());
    let limits = ConnLimits::new(
        config.server.max_connections,
        config.server.max_connections_per_ip,
        config.identity.trust.clone(),
    );
    // The gRPC port's own connection bounds, with the HTTP port's numbers
    // (`server.max_connections`, `server.max_connections_per_ip`; trusted proxies exempt from
    // the per-address one): a host that opens connections until the process runs out of file
    // descriptors would otherwise starve every port. Both follow a reload's trust list.
    let rls_limits = ConnLimits::new(
        config.server.max_connections,
        config.server.max_connections_per_ip,
        config.identity.trust.clone(),
    );
    let live = Arc::new(Live::new(
        path,
        config.clone(),
        limiter.clone(),
        http_metrics.clone(),
        vec![limits.clone(), rls_limits.clone()],
    )?);
    let rls = live.rls();
    // Connect to a shared store before taking traffic, so a cold start does not spend the
    // first requests' timeouts on a connection and a script load (and trip the breaker).
    // A store that is down does not stop the gateway: requests follow their failure policy.
    limiter.connect(STARTUP_CONNECT).await;
    let service = live.service();
    let listener = TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {} (server.listen)", config.server.listen))?;
    let admin_listener = TcpListener::bind(config.server.admin_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (server.admin_listen)",
                config.server.admin_listen
            )
        })?;
    log_start(&config, &listener, &admin_listener);
    let mut signals = ShutdownSignals::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (force_tx, force_rx) = tokio::sync::oneshot::channel::<()>();
    let history = Arc::new(History::default());
    let sampler = tokio::spawn(run_sampler(
        history.clone(),
        limiter.clone(),
        stop_rx.clone(),
    ));
    let admin = Admin {
        history,
        live: live.clone(),
    };
    let answer = move |req| {
        let admin = admin.clone();
        async move { admin.handle(req).await }
    };
    let admin_limits = ConnLimits::new(
        config.server.admin_max_connections,
        config.server.admin_max_connections_per_ip,
        tollgate_tower::Trust::default(),
    );
    let admin_task = tokio::spawn(serve_admin(
        admin_listener,
        answer,
        admin_limits,
        stop_rx.clone(),
    ));
    let sighup = tokio::spawn(live.clone().on_sighup(hangup, stop_rx.clone()));
    let watcher = tokio::spawn(live.clone().watch_files(stop_rx.clone()));
    let rls_task = spawn_rls(&config, rls, rls_limits, stop_rx.clone()).await?;
    let force = async {
        let _ = force_rx.await;
    };
    let gateway = serve_gateway(listener, service, http_metrics, limits, stop_rx, force);
    tokio::pin!(gateway);
    tokio::select! {
        r = &mut gateway => r?,
        _ = signals.next() => {
            tracing::info!(grace = ?GRACE, "shutting down: no new connections, finishing in-flight requests (a second signal exits at once)");
            let _ = stop_tx.send(true);
            tokio::select! {
                r = &mut gateway => r?,
                _ = signals.next() => {
                    let _ = force_tx.send(());
                    gateway.await?;
                    tracing::warn!("stopped by a second signal");
                    return Ok(());
                }
            }
        }
    }
    let _ = admin_task.await;
    let _ = sampler.await;
    let _ = sighup.await;
    let _ = watcher.await;
    if let Some(t) = rls_task {
        let _ = t.await;
    }
    limiter.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

fn log_start(config: &Config, listener: &TcpListener, admin: &TcpListener) {
    let listen = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let admin_listen = admin
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mode = match &config.server.upstream {
        Some(u) => format!("proxy to http://{}{}", u.authority, u.base_path),
        None => "decision".to_string(),
    };
    let policies: Vec<String> = config
        .policies
        .iter()
        .map(|p| {
            let q = p.limit().quota();
            format!(
                "{}: {} {}/{:?} burst {} cost {} on {} {:?}{}{}",
                p.name(),
                p.limit().algorithm(),
                q.limit(),
                q.period(),
                q.burst(),
                p.spec.cost,
                p.path_prefix,
                p.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                if p.spec.shadow { " shadow" } else { "" },
                format_args!(
                    " on_failure={} sync={:?}",
                    p.spec.on_failure.as_str(),
                    p.spec.sync
                ),
            )
        })
        .collect();
    tracing::info!(
        config = %config.origin,
        listen,
        admin_listen,
        mode,
        store = ?config.store.backend,
        store_timeout = ?config.store.timeout,
        identity = ?config.identity.sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
        trusted_proxies = ?config.identity.trust.proxies(),
        secret = "<redacted>",
        ?policies,
        otlp_endpoint = config.telemetry.otlp_endpoint.as_deref().unwrap_or("none"),
        "tollgate started"
    );
    let default_secret = config.secret.0 == crate::config::DEFAULT_SECRET.as_bytes();
    if default_secret && !matches!(config.store.backend, StoreBackend::Memory { .. }) {
        tracing::warn!(
            "identity.secret is the default; set a secret of your own when gateways share a store"
        );
    }
}

/// The config file `serve` reads: `--config`, else `$TOLLGATE_CONFIG` (when set and not
/// empty; what a container image or a unit sets), else none (the built-in defaults).
pub fn config_path(flag: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    flag.map(std::path::Path::to_path_buf).or_else(|| {
        std::env::var_os("TOLLGATE_CONFIG")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    })
}

/// The log format: `--log-format`, else `TOLLGATE_LOG_FORMAT=json|text`, else text.
fn log_format(flag: Option<LogFormat>) -> LogFormat {
    flag.unwrap_or_else(|| match std::env::var("TOLLGATE_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    })
}

/// `tollgate serve [--config FILE] [--log-format text|json]`: load (or use the defaults),
/// then run. Exit code 2 on a bad config, 1 on a runtime error.
pub fn main(config_flag: Option<&std::path::Path>, format: Option<LogFormat>) -> i32 {
    let path = config_path(config_flag);
    let config = match &path {
        Some(p) => Config::load(p),
        None => Config::builtin(),
    };
    let config = match config {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return 2;
        }
    };
    for w in &config.warnings {
        eprintln!("{w}");
    }
    let exporter = crate::telemetry::install(log_format(format), &config.telemetry);
    let rt = match crate::runtime::build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return 1;
        }
    };
    let served = rt.block_on(async move {
        let exporter = exporter.map(crate::telemetry::Exporter::spawn);
        let served = run(path, config).await;
        if let Some(e) = exporter {
            e.shutdown().await;
        }
        served
    });
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}
