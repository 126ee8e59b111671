//! `tollgate serve`: the gateway and the admin server, from a validated [`Config`].
//!
//! Every request goes through one `tollgate_tower::RateLimit` service wrapped around either
//! the reverse proxy or, in decision mode, a service that answers 200 (forward-auth). The
//! HTTP/1 server bounds what a client can send (header count and size) and shuts down
//! gracefully: on SIGTERM or SIGINT it stops accepting, lets in-flight requests finish for
//! up to [`GRACE`], then exits.

use crate::admin::Admin;
use crate::config::{Config, StoreBackend};
use crate::conn_limit::ConnLimits;
use crate::http_util::{status_response, BoxBody};
use crate::live::{Hangup, Live, PolicyRules};
use crate::metrics::HttpMetrics;
use crate::proxy::Proxy;
use crate::server::{serve_admin, serve_gateway, ShutdownSignals, GRACE};
use crate::status::{run_sampler, History};
use anyhow::Context as _;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate::store::{MemoryConfig, RedisConfig, StoreClock};
use tollgate::{Backend, IdentityHasher, Limiter, LimiterConfig, PolicySpec};
use tollgate_rls::{LiveRls, RlsOptions, RlsService};
use tollgate_tower::{PeerAddr, RateLimitLayer, RoutedPolicy};
use tower_service::Service;

/// What the rate limiter wraps: the upstream, or the decision-mode 200.
#[derive(Clone)]
pub(crate) enum Target {
    /// Behind an `Arc`: the proxy's HTTP client is large and the target is cloned per
    /// connection.
    Proxy(Arc<Proxy>),
    Decision,
}

impl Service<Request<Incoming>> for Target {
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        match self {
            Target::Proxy(p) => {
                let p = p.clone();
                let peer = req.extensions().get::<PeerAddr>().map(|a| a.0);
                Box::pin(async move {
                    let Some(peer) = peer else {
                        return Ok(status_response(StatusCode::BAD_REQUEST, "no peer\n"));
                    };
                    Ok(p.forward(req, peer).await)
                })
            }
            Target::Decision => Box::pin(async { Ok(status_response(StatusCode::OK, "")) }),
        }
    }
}

/// Builds the limiter described by `config`.
pub fn limiter(config: &Config) -> Limiter {
    let s = &config.store;
    let clock = if s.clock_local {
        StoreClock::Local
    } else {
        StoreClock::Store
    };
    let backend = match &s.backend {
        StoreBackend::Memory { max_keys } => Backend::Memory(MemoryConfig {
            max_keys: *max_keys,
            ..MemoryConfig::default()
        }),
        StoreBackend::Redis { url } => Backend::Redis(
            RedisConfig::standalone(url.clone())
                .with_key_prefix(s.key_prefix.clone())
                .with_clock(clock),
        ),
        StoreBackend::RedisCluster { urls } => Backend::Redis(
            RedisConfig::cluster(urls.clone())
                .with_key_prefix(s.key_prefix.clone())
                .with_clock(clock),
        ),
        StoreBackend::RedisSentinel { urls, master_name } => Backend::Redis(
            RedisConfig::sentinel(urls.clone(), master_name.clone())
                .with_key_prefix(s.key_prefix.clone())
                .with_clock(clock),
        ),
    };
    let mut lc = LimiterConfig::new(backend);
    lc.timeout = s.timeout;
    lc.breaker = s.breaker;
    Limiter::new(lc)
}

/// Builds the rate-limit layer (policies registered with `limiter`), and each policy's rules
/// for the admin API.
pub(crate) fn layer(
    config: &Config,
    limiter: &Limiter,
) -> anyhow::Result<(RateLimitLayer, Vec<(String, PolicyRules)>)> {
    let mut rules = Vec::with_capacity(config.policies.len());
    let mut layer = RateLimitLayer::new(limiter.clone(), IdentityHasher::new(&config.secret.0))
        .identity(config.identity.clone())
        .forward_auth(
            config
                .decision_mode()
                .then(|| config.server.forward_auth.clone()),
        )
        .allow_ambiguous_paths(config.server.allow_ambiguous_paths);
    for p in &config.policies {
        // The policy, and its tiers' and overrides' policies: its settings, with their own
        // name and limit.
        let variant = |name: String, limit| {
            limiter
                .policy(PolicySpec {
                    name: name.clone(),
                    limit,
                    cost: p.cost,
                    on_failure: p.on_failure,
                    local_divisor: p.local_divisor,
                    shadow: p.shadow,
                    sync: p.sync,
                })
                .with_context(|| format!("{}: policy {name:?}", config.origin))
        };
        let own = variant(p.name.clone(), p.limit)?;
        let mut routed = RoutedPolicy::new(own.clone())
            .path_prefix(p.path_prefix.clone())
            .methods(p.methods.clone())
            .case_insensitive(p.case_insensitive);
        if let Some(sources) = &p.identity {
            routed = routed.identity(sources.clone());
        }
        let mut tiers = Vec::new();
        if let Some(source) = &p.tier {
            for t in &p.tiers {
                let policy = variant(p.tier_rule_name(&t.name), t.limit)?;
                tiers.push((t.name.clone(), policy));
            }
            routed = routed.tiers(source.clone(), tiers.clone());
        }
        let mut overrides = Vec::new();
        for o in config.overrides.iter().filter(|o| o.policy == p.name) {
            overrides.push((o.client, variant(o.rule_name(), o.limit)?));
        }
        if !overrides.is_empty() {
            routed = routed.overrides(overrides.clone());
        }
        layer = layer.policy(routed);
        rules.push((
            p.name.clone(),
            PolicyRules {
                policy: own,
                tiers,
                overrides,
            },
        ));
    }
    Ok((layer, rules))
}

/// Builds the Envoy rate limit service of `[rls]` (its rules registered with `limiter`).
pub(crate) fn rls_service(
    config: &Config,
    limiter: &Limiter,
) -> anyhow::Result<Option<RlsService>> {
    let Some(rls) = &config.rls else {
        return Ok(None);
    };
    let options = RlsOptions {
        on_failure: config.store.on_failure,
        local_divisor: config.store.local_divisor,
        response_headers: rls.response_headers,
    };
    let service = RlsService::new(
        limiter.clone(),
        IdentityHasher::new(&config.secret.0),
        rls.config.clone(),
        options,
    )
    .with_context(|| format!("{}: [rls] config", rls.config_path.display()))?;
    Ok(Some(service))
}

/// Binds `[rls] listen` and serves the rate limit service there until `stop` changes.
async fn spawn_rls(
    config: &Config,
    service: Option<LiveRls>,
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
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = tollgate_rls::serve(listener, service, shutdown).await {
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
    let limiter = limiter(&config);
    let http_metrics = Arc::new(HttpMetrics::default());
    let limits = ConnLimits::new(
        config.server.max_connections,
        config.server.max_connections_per_ip,
        config.identity.trusted_proxies.clone(),
        config.identity.ipv6_prefix,
    );
    let live = Arc::new(Live::new(
        path,
        config.clone(),
        limiter.clone(),
        http_metrics.clone(),
        limits.clone(),
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
    let admin_task = tokio::spawn(serve_admin(admin_listener, admin, stop_rx.clone()));
    let sighup = tokio::spawn(live.clone().on_sighup(hangup, stop_rx.clone()));
    let watcher = tokio::spawn(live.clone().watch_files(stop_rx.clone()));
    let rls_task = spawn_rls(&config, rls, stop_rx.clone()).await?;
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
            let q = p.limit.quota();
            format!(
                "{}: {} {}/{:?} burst {} cost {} on {} {:?}{}{}",
                p.name,
                p.limit.algorithm(),
                q.limit(),
                q.period(),
                q.burst(),
                p.cost,
                p.path_prefix,
                p.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                if p.shadow { " shadow" } else { "" },
                format_args!(" on_failure={} sync={:?}", p.on_failure.as_str(), p.sync),
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
        trusted_proxies = ?config.identity.trusted_proxies,
        secret = "<redacted>",
        ?policies,
        "tollgate started"
    );
    let default_secret = config.secret.0 == crate::config::DEFAULT_SECRET.as_bytes();
    if default_secret && !matches!(config.store.backend, StoreBackend::Memory { .. }) {
        tracing::warn!(
            "identity.secret is the default; set a secret of your own when gateways share a store"
        );
    }
}

/// `tollgate serve [--config FILE]`: load (or use the defaults), then run. Exit code 2 on a
/// bad config, 1 on a runtime error.
pub fn main(config_path: Option<&std::path::Path>) -> i32 {
    let config = match config_path {
        Some(p) => Config::load(p),
        None => Config::builtin(),
    };
    let path = config_path.map(std::path::Path::to_path_buf);
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
    init_tracing();
    let rt = match crate::runtime::build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return 1;
        }
    };
    match rt.block_on(run(path, config)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = std::env::var("TOLLGATE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
