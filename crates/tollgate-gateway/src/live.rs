//! Live changes: a reload re-reads the config file (and every file it names), validates it
//! whole, and swaps what requests are served by, without a restart and without touching a
//! connection. Requests already in flight finish under the config they started with.
//!
//! What a reload keeps: the limiter and its store (so every client's state), the listeners and
//! their connections. A policy keeps its store key (its name), so an unchanged quota keeps its
//! state and a changed one reads the same state under the new quota from the next request (the
//! algorithms clamp a state to the quota they read it with: never more than the new burst at
//! once). The deny cache keys a denial by the policy's name and quota, so a denial decided
//! under an old quota never answers under a new one (not even one an in-flight request under
//! the old config remembers after the swap).
//!
//! What needs a restart (a reload applies everything else and names these in its answer and
//! its log): the listen addresses, connection bounds and the store settings.
//!
//! A reload is asked for by SIGHUP, `POST /v1/reload`, or a change to a watched file (polled:
//! a change is applied once the files have stopped changing for [`SETTLE`]).
//!
//! Whatever asks, a reload never replaces a working config by one that limits nothing or
//! locks the operator out: an empty file, no policy (or RLS rule) where there were some, the
//! admin token removed, or `identity.secret` changed is refused with the reason
//! ([`ReloadError::Unsafe`]); a restart serves such a config when it is meant.

use crate::assemble::{assemble, Assembled, PolicyRules};
use crate::config::{Config, ConfigErrors, Keying, PolicyConfig, Upstream};
use crate::http::conn_limit::ConnLimits;
use crate::http::metrics::HttpMetrics;
use crate::http::service::{GatewayService, Written};
use crate::http::util::Answer;
use crate::http::util::BoxBody;
use crate::proxy::{Proxy, ProxyLimits, Target};
use arc_swap::ArcSwap;
use http::Request;
use hyper::body::Incoming;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tollgate::Limiter;
use tollgate_rls::LiveRls;
use tollgate_tower::{RateLimit, ResponseFuture, TrustedPeer};
use tower_service::Service;

/// How often watched files are looked at.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);
/// How long watched files must look the same before a change is applied: an editor or a
/// config manager that writes a file in pieces is done by then.
pub const SETTLE: Duration = Duration::from_millis(750);

/// The gateway's service as of the last reload.
type Current = RateLimit<Target>;

/// The rate-limited service every connection calls: the current one, read per request.
pub(crate) struct LiveService {
    current: Arc<ArcSwap<Current>>,
    /// The current service as this handle last read it for a plain head
    /// ([`GatewayService::decide_head`]), read again only once a reload has swapped it: a
    /// look at the swapped pointer, where a load from the `ArcSwap` is two locked
    /// instructions a request (a debt taken and paid). A connection's handle keeps it while
    /// the connection is served without hyper, which closes a connection idle past the
    /// header read timeout: an old service outlives a reload by that much at most. A clone
    /// starts without one (hyper's path clones a handle a request).
    plain: Option<arc_swap::Cache<Arc<ArcSwap<Current>>, Arc<Current>>>,
}

impl Clone for LiveService {
    fn clone(&self) -> Self {
        Self {
            current: Arc::clone(&self.current),
            plain: None,
        }
    }
}

impl Service<Request<Incoming>> for LiveService {
    type Response = Answer;
    type Error = Infallible;
    type Future = LiveFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        self.answer(req, None)
    }
}

impl GatewayService for LiveService {
    fn call_from(&mut self, req: Request<Incoming>, peer: &TrustedPeer) -> Self::Future {
        self.answer(req, Some(peer))
    }

    fn answers_itself(&self) -> bool {
        matches!(self.current.load().get_ref(), Target::Decision)
    }

    type Decision = tollgate_tower::DecideFuture;

    fn decide_head(&mut self, req: &Request<()>, peer: &TrustedPeer) -> Option<Self::Decision> {
        let current = self
            .plain
            .get_or_insert_with(|| arc_swap::Cache::new(Arc::clone(&self.current)))
            .load();
        match current.get_ref() {
            Target::Decision => Some(current.decide_head(req, peer)),
            Target::Proxy(_) => None,
        }
    }

    fn write_answer(decided: tollgate_tower::Decided, out: &mut Vec<u8>, closing: bool) -> Written {
        crate::proxy::write_decision(decided, out, closing)
    }
}

impl LiveService {
    /// The current generation's answer to `req`, from `peer` when the server gives it apart
    /// from the request: decision mode decides without the request held (see
    /// `RateLimit::decide`), the proxy hands the peer on beside the request
    /// (`RateLimit::call_from`); neither puts it in the request's extensions.
    fn answer(&self, req: Request<Incoming>, peer: Option<&TrustedPeer>) -> LiveFuture {
        let current = self.current.load();
        if let Target::Decision = current.get_ref() {
            return LiveFuture::Decision(match peer {
                Some(peer) => current.decide_from(req, peer),
                None => current.decide(req),
            });
        }
        let mut service = Current::clone(&current);
        LiveFuture::Proxy(match peer {
            Some(peer) => service.call_from(req, peer),
            None => service.call(req),
        })
    }
}

/// A [`LiveService`] answer as it is made: decision mode's, written when its decision is
/// ready (at once on the in-process store, with nothing boxed; else when the decision's own
/// boxed future is), or the proxy's.
pub(crate) enum LiveFuture {
    Decision(tollgate_tower::DecideFuture),
    Proxy(ResponseFuture<BoxBody, Infallible>),
}

impl std::future::Future for LiveFuture {
    type Output = Result<Answer, Infallible>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both are `Unpin` (a decision's future is ready or boxed; the proxy's is boxed).
        match self.get_mut() {
            LiveFuture::Decision(decided) => std::pin::Pin::new(decided)
                .poll(cx)
                .map(|d| Ok(crate::proxy::decision_answer(d))),
            LiveFuture::Proxy(answer) => answer.as_mut().poll(cx),
        }
    }
}

/// What one config turned into.
pub(crate) struct Generation {
    /// The config.
    pub(crate) config: Arc<Config>,
    /// The rules of each policy, by policy name (in config order).
    pub(crate) rules: Vec<(String, PolicyRules)>,
    /// The files it was read from, and how they looked right after it was read.
    files: Vec<PathBuf>,
    stamps: Vec<Stamp>,
    /// Keys the files changed that apply only after a restart (`config` shows the running
    /// values).
    pub(crate) pending_restart: Vec<&'static str>,
}

impl Generation {
    /// The rules of the policy named `name`.
    pub(crate) fn policy(&self, name: &str) -> Option<(&PolicyConfig, &PolicyRules)> {
        let config = self.config.policies.iter().find(|p| p.name() == name)?;
        let rules = self.rules.iter().find(|(n, _)| n == name).map(|(_, r)| r)?;
        Some((config, rules))
    }
}

/// What asked for a reload: its value in logs, in `POST /v1/reload`'s answer and on the
/// status page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadTrigger {
    /// The process got SIGHUP (`systemctl reload`).
    Sighup,
    /// `POST /v1/reload` on the admin port.
    Api,
    /// The file watch saw a config file change.
    File,
}

impl ReloadTrigger {
    /// The name written to logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadTrigger::Sighup => "sighup",
            ReloadTrigger::Api => "api",
            ReloadTrigger::File => "file",
        }
    }
}

impl serde::Serialize for ReloadTrigger {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// How a reload ended, as `POST /v1/reload` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reloaded {
    /// What asked for it.
    pub trigger: ReloadTrigger,
    /// Whether anything in the files changed since the config serving now was read.
    pub changed: bool,
    /// Keys that changed but apply only after a restart (the old values keep serving).
    pub restart_required: Vec<&'static str>,
}

/// Why a reload was refused (the old config keeps serving).
#[derive(Debug)]
pub enum ReloadError {
    /// Started without a config file: there is nothing to re-read.
    NoFile,
    /// The new config does not validate (every problem, with file, line and key).
    Invalid(ConfigErrors),
    /// The config validates but could not be built (a policy the limiter refuses).
    Build(String),
    /// The config validates but would leave the gateway limiting nothing or lock the operator
    /// out (an empty or truncated file, every policy gone, the admin token removed, the
    /// identity secret changed); a restart serves it, deliberately.
    Unsafe(String),
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::NoFile => f.write_str(
                "started with the built-in defaults (no --config FILE): there is no file to reload",
            ),
            ReloadError::Invalid(e) => write!(f, "{e}"),
            ReloadError::Build(e) | ReloadError::Unsafe(e) => f.write_str(e),
        }
    }
}

/// What a [`Target`] is built from: equal settings reuse the target (and its upstream
/// connections).
#[derive(PartialEq)]
struct TargetSettings {
    upstream: Option<Upstream>,
    limits: ProxyLimits,
}

impl TargetSettings {
    fn of(c: &Config) -> Self {
        Self {
            upstream: c.server.upstream.clone(),
            limits: ProxyLimits {
                timeout: c.server.upstream_timeout,
                body_timeout: c.server.body_timeout,
                trusted: c.identity.trust.clone(),
            },
        }
    }

    fn target(&self, http: &Arc<HttpMetrics>) -> Target {
        match &self.upstream {
            Some(u) => Target::Proxy(Arc::new(Proxy::new(
                u.clone(),
                self.limits.clone(),
                http.clone(),
            ))),
            None => Target::Decision,
        }
    }
}

/// The serving state and what reloads it.
pub struct Live {
    path: Option<PathBuf>,
    limiter: Limiter,
    http: Arc<HttpMetrics>,
    generation: ArcSwap<Generation>,
    service: Arc<ArcSwap<Current>>,
    rls: Option<LiveRls>,
    /// The target serving now, with its settings.
    target: std::sync::Mutex<(TargetSettings, Target)>,
    /// The connection bounds of the HTTP and gRPC ports (their trusted proxies and IPv6
    /// prefix follow reloads).
    conn_limits: Vec<Arc<ConnLimits>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// The one thread that reads the config files (`None` for the built-in defaults).
    file_thread: Option<FileThread>,
    ok: AtomicU64,
    failed: AtomicU64,
    last: std::sync::Mutex<Option<LastReload>>,
}

/// The last reload, as the status page shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LastReload {
    /// When it ended (milliseconds since the epoch).
    pub at_ms: u64,
    /// What asked for it.
    pub trigger: ReloadTrigger,
    /// Whether the new config serves now.
    pub ok: bool,
    /// Why it was refused: the first problem, cut to 300 characters.
    pub error: Option<String>,
}

/// The config's part of the status page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConfigStatus {
    /// The file it was read from (`<built-in>` for the defaults).
    pub origin: String,
    /// Reloads that were applied.
    pub reloads_ok: u64,
    /// Reloads that were refused.
    pub reloads_error: u64,
    /// The last reload, if any.
    pub last_reload: Option<LastReload>,
    /// Restart-only keys the files changed.
    pub pending_restart: Vec<&'static str>,
}

impl Live {
    /// Builds everything `config` describes over `limiter` (its policies registered there).
    /// `path` is the file a reload reads (`None`: the built-in defaults).
    pub(crate) fn new(
        path: Option<PathBuf>,
        config: Config,
        limiter: Limiter,
        http: Arc<HttpMetrics>,
        conn_limits: Vec<Arc<ConnLimits>>,
    ) -> anyhow::Result<Self> {
        let files = if path.is_some() {
            config.files()
        } else {
            Vec::new()
        };
        let stamps = files.iter().map(|f| stamp(f)).collect();
        let file_thread = match path {
            Some(_) => Some(FileThread::start()?),
            None => None,
        };
        let settings = TargetSettings::of(&config);
        let target = settings.target(&http);
        let Assembled { layer, rules, rls } = assemble(&config, &limiter)?;
        let service = tower_layer::Layer::layer(&layer, target.clone());
        let rls = rls.map(LiveRls::new);
        Ok(Self {
            path,
            limiter,
            http,
            generation: ArcSwap::from_pointee(Generation {
                config: Arc::new(config),
                rules,
                files,
                stamps,
                pending_restart: Vec::new(),
            }),
            service: Arc::new(ArcSwap::from_pointee(service)),
            rls,
            target: std::sync::Mutex::new((settings, target)),
            conn_limits,
            reloading: tokio::sync::Mutex::new(()),
            file_thread,
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last: std::sync::Mutex::new(None),
        })
    }

    /// The service connections call.
    pub(crate) fn service(&self) -> LiveService {
        LiveService {
            current: self.service.clone(),
            plain: None,
        }
    }

    /// The Envoy rate limit service, when `[rls]` is configured.
    pub(crate) fn rls(&self) -> Option<LiveRls> {
        self.rls.clone()
    }

    /// The config serving now, with what it built.
    pub(crate) fn generation(&self) -> Arc<Generation> {
        self.generation.load_full()
    }

    /// The config serving now.
    pub fn config(&self) -> Arc<Config> {
        self.generation.load().config.clone()
    }

    /// The limiter (the same across reloads).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The gateway's HTTP metrics.
    pub fn http(&self) -> &HttpMetrics {
        &self.http
    }

    /// Re-reads the config file and, when it validates, serves it from the next request.
    /// Counted in `tollgate_config_reloads_total{result}` and logged either way.
    pub async fn reload(&self, trigger: ReloadTrigger) -> Result<Reloaded, ReloadError> {
        let _one = self.reloading.lock().await;
        let result = self.try_reload(trigger).await;
        let error = result.as_ref().err().map(|e| {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            first.chars().take(300).collect::<String>()
        });
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(LastReload {
            at_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            trigger,
            ok: error.is_none(),
            error,
        });
        match &result {
            Ok(r) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                if r.restart_required.is_empty() {
                    tracing::info!(
                        trigger = trigger.as_str(),
                        changed = r.changed,
                        "config reloaded"
                    );
                } else {
                    tracing::warn!(trigger = trigger.as_str(), restart_required = ?r.restart_required, "config reloaded; these keys changed but apply only after a restart (their old values keep serving)");
                }
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(trigger = trigger.as_str(), error = %e, "config reload refused; the old config keeps serving");
            }
        }
        result
    }

    async fn try_reload(&self, trigger: ReloadTrigger) -> Result<Reloaded, ReloadError> {
        let Some(path) = self.path.clone() else {
            return Err(ReloadError::NoFile);
        };
        // The files' stamps are taken right after they are read: a later edit is seen as one.
        let Some(file_thread) = &self.file_thread else {
            return Err(ReloadError::NoFile);
        };
        // Keys made as the running store's are: a changed store.backend waits for a restart
        // (keep_running), and so does the hash that keys its clients.
        let keying = Keying::of_hasher(&self.generation().config.hasher);
        let loaded = file_thread
            .run(move || {
                if is_blank(&path) {
                    return Ok(None);
                }
                Config::load_keyed(&path, Some(keying)).map(|c| {
                    let files = c.files();
                    let stamps: Vec<Stamp> = files.iter().map(|f| stamp(f)).collect();
                    Some((c, files, stamps))
                })
            })
            .await
            .ok_or_else(|| {
                ReloadError::Build(
                    "reading the config files failed unexpectedly (see the log)".to_string(),
                )
            })?;
        let Some((mut config, files, stamps)) = loaded.map_err(ReloadError::Invalid)? else {
            return Err(ReloadError::Unsafe(
                "the config file is empty (caught while being written?); a reload never replaces a working config by an empty one".to_string(),
            ));
        };
        let current = self.generation();
        let old = &current.config;
        let changed = files != current.files || stamps != current.stamps;
        unsafe_change(old, &config).map_err(ReloadError::Unsafe)?;
        let restart_required = keep_running(old, &mut config);
        let Assembled { layer, rules, rls } =
            assemble(&config, &self.limiter).map_err(|e| ReloadError::Build(e.to_string()))?;
        // A listener started later has nothing to serve a new RLS config with (a restart key).
        let rls = rls.filter(|_| self.rls.is_some());
        let target = {
            let mut t = self
                .target
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let settings = TargetSettings::of(&config);
            if t.0 != settings {
                let target = settings.target(&self.http);
                *t = (settings, target);
            }
            t.1.clone()
        };
        // Nothing can fail from here: swap everything.
        for w in &config.warnings {
            tracing::warn!("{w}");
        }
        self.service
            .store(Arc::new(tower_layer::Layer::layer(&layer, target)));
        if let (Some(live), Some(new)) = (&self.rls, rls) {
            live.replace(new);
        }
        for limits in &self.conn_limits {
            limits.update(config.identity.trust.clone());
        }
        self.generation.store(Arc::new(Generation {
            config: Arc::new(config),
            rules,
            files,
            stamps,
            pending_restart: restart_required.clone(),
        }));
        Ok(Reloaded {
            trigger,
            changed,
            restart_required,
        })
    }

    /// The config's part of the status page.
    pub fn status(&self) -> ConfigStatus {
        let g = self.generation();
        ConfigStatus {
            origin: g.config.origin.clone(),
            reloads_ok: self.ok.load(Ordering::Relaxed),
            reloads_error: self.failed.load(Ordering::Relaxed),
            last_reload: self
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            pending_restart: g.pending_restart.clone(),
        }
    }

    /// Appends `tollgate_config_reloads_total{result}`.
    pub fn render_metrics(&self, out: &mut String) {
        if let Some(rls) = &self.rls {
            rls.current().render_metrics(out);
        }
        out.push_str("# HELP tollgate_config_reloads_total Config reloads, by result (error: refused, the old config kept serving).\n");
        out.push_str("# TYPE tollgate_config_reloads_total counter\n");
        for (result, n) in [("ok", &self.ok), ("error", &self.failed)] {
            let _ = writeln!(
                out,
                "tollgate_config_reloads_total{{result=\"{result}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
    }

    /// Reloads on every SIGHUP (`hup`, listened to since startup: until a listener exists,
    /// SIGHUP would end the process) until `stop` changes.
    pub(crate) async fn on_sighup(
        self: Arc<Self>,
        hup: Hangup,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        #[cfg(unix)]
        {
            let Some(mut hup) = hup.0 else {
                tracing::warn!("cannot listen for SIGHUP; reload with POST /v1/reload instead");
                return;
            };
            loop {
                tokio::select! {
                    r = hup.recv() => {
                        if r.is_none() {
                            return;
                        }
                        let _ = self.reload(ReloadTrigger::Sighup).await;
                    }
                    _ = stop.changed() => return,
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = hup;
            let _ = stop.changed().await;
        }
    }

    /// Reloads when a watched file (the config's [`Config::files`]) changes, until `stop`
    /// changes. The files are compared with how they looked right after the serving config was
    /// read (whatever reloaded it); a change is applied once they have read the same for
    /// [`SETTLE`], so a file caught half-written is not loaded; a refused version is not tried
    /// again.
    pub(crate) async fn watch_files(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some(file_thread) = &self.file_thread else {
            return;
        };
        // The changed stamps, and since when they have looked like that.
        let mut pending: Option<(Vec<Stamp>, std::time::Instant)> = None;
        let mut refused: Option<(Vec<PathBuf>, Vec<Stamp>)> = None;
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let g = self.generation();
            let files = g.files.clone();
            let Some(now) = file_thread
                .run(move || files.iter().map(|f| stamp(f)).collect::<Vec<_>>())
                .await
            else {
                return;
            };
            if now == g.stamps {
                pending = None;
                continue;
            }
            if refused
                .as_ref()
                .is_some_and(|(files, stamps)| *files == g.files && *stamps == now)
            {
                continue;
            }
            match &pending {
                Some((stamps, since)) if *stamps == now => {
                    if since.elapsed() < SETTLE {
                        continue;
                    }
                }
                _ => {
                    // Changed since the last poll: wait for it to settle.
                    pending = Some((now, std::time::Instant::now()));
                    continue;
                }
            }
            pending = None;
            if self.reload(ReloadTrigger::File).await.is_err() {
                refused = Some((g.files.clone(), now));
            }
        }
    }
}

/// Whether the file at `path` holds nothing but blanks and comments (an empty or truncated
/// write). An unreadable file is left to the loader, which says why.
fn is_blank(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.lines()
            .map(str::trim)
            .all(|l| l.is_empty() || l.starts_with('#'))
    })
}

/// Why `new` must not replace `old` on a reload, though it validates: it would limit nothing
/// where `old` limited something, lock the operator out of the admin API, or re-key every
/// client. A file caught half-written, or cut short, reads like that; a restart serves such a
/// config when it is meant. The reason names keys, never their values.
fn unsafe_change(old: &Config, new: &Config) -> Result<(), String> {
    let restart = "the old config keeps serving; restart tollgate to serve this one on purpose";
    if !old.policies.is_empty() && new.policies.is_empty() {
        return Err(format!(
            "the new config has no [[policy]] where the running one has {} (a truncated file?); {restart}",
            old.policies.len()
        ));
    }
    // An [rls] table removed whole needs a restart (its listener stays, see keep_running); one
    // left with no rule at all is the RLS form of an empty file.
    let rls_rules = |c: &Config| c.rls.as_ref().map(|r| !r.config.rules().is_empty());
    if rls_rules(old) == Some(true) && rls_rules(new) == Some(false) {
        return Err(format!(
            "the new config has no [rls] descriptors where the running one has some; {restart}"
        ));
    }
    if old.server.admin_token.is_some() && new.server.admin_token.is_none() {
        return Err(format!(
            "server.admin_token is gone: the admin API would answer 403 and POST /v1/reload could not repair it; {restart}"
        ));
    }
    if old.secret != new.secret {
        return Err(format!(
            "identity.secret changed (absent means the built-in default): every client would be keyed anew and its counts start over; {restart} (gateways sharing a store should change it together)"
        ));
    }
    Ok(())
}

/// SIGHUP, listened to from startup on.
pub(crate) struct Hangup(#[cfg(unix)] Option<tokio::signal::unix::Signal>);

impl Hangup {
    /// Starts listening (call it first thing in the runtime).
    pub(crate) fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self(signal(SignalKind::hangup()).ok())
        }
        #[cfg(not(unix))]
        Self()
    }
}

/// What a watched file looks like to a poll: absent, or its length, modification time and
/// inode (a file replaced by a rename has a new inode even when the rest matches).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Option<(u64, Option<SystemTime>, u64)>);

/// The one thread that stats and reads the config files, started with the gateway and
/// stopped with it. Not tokio's blocking pool: a poll every [`WATCH_EVERY`] that overlapped a
/// reload's parse once left two pool threads that the polls then kept alive in turn, so the
/// thread count grew by one at a random hour (the soak saw it); one thread of our own makes
/// it a constant. A file on a slow disk or mount stalls this thread, never a worker.
struct FileThread {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl FileThread {
    fn start() -> anyhow::Result<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("tollgate-files".to_string())
            .spawn(move || {
                // Ends when the `Live` that owns the sender is dropped. A job that panics
                // answers nothing (its caller sees `None`) and the thread goes on.
                while let Ok(job) = queue.recv() {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start the config file thread: {e}"))?;
        Ok(Self { jobs })
    }

    /// Runs `job` on the thread; `None` if it panicked.
    async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(job());
            }))
            .ok()?;
        rx.await.ok()
    }
}

fn stamp(path: &Path) -> Stamp {
    Stamp(std::fs::metadata(path).ok().map(|m| {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&m);
        #[cfg(not(unix))]
        let inode = 0;
        (m.len(), m.modified().ok(), inode)
    }))
}

/// Puts the running values of the restart-only keys into `new` (so the served config says
/// what is in effect), and names the keys whose value the files changed. The keys are the
/// schema's restart-only ones; a key inside another (a store URL inside `store.backend`, the
/// breaker's fields inside `store.breaker`) is reported as the one that holds it.
fn keep_running(old: &Config, new: &mut Config) -> Vec<&'static str> {
    use crate::config::schema as key;
    /// Gives `new` the running value; whether it differed.
    fn keep<T: PartialEq + Clone>(new: &mut T, old: &T) -> bool {
        let differs = new != old;
        if differs {
            *new = old.clone();
        }
        differs
    }
    let mut changed = Vec::new();
    for k in key::restart_only() {
        let differs = match k {
            key::SERVER_LISTEN => keep(&mut new.server.listen, &old.server.listen),
            key::SERVER_ADMIN_LISTEN => {
                keep(&mut new.server.admin_listen, &old.server.admin_listen)
            }
            key::SERVER_MAX_CONNECTIONS => {
                keep(&mut new.server.max_connections, &old.server.max_connections)
            }
            key::SERVER_MAX_CONNECTIONS_PER_IP => keep(
                &mut new.server.max_connections_per_ip,
                &old.server.max_connections_per_ip,
            ),
            key::SERVER_ADMIN_MAX_CONNECTIONS => keep(
                &mut new.server.admin_max_connections,
                &old.server.admin_max_connections,
            ),
            key::SERVER_ADMIN_MAX_CONNECTIONS_PER_IP => keep(
                &mut new.server.admin_max_connections_per_ip,
                &old.server.admin_max_connections_per_ip,
            ),
            key::STORE_BACKEND => keep(&mut new.store.backend, &old.store.backend),
            key::STORE_TIMEOUT => keep(&mut new.store.timeout, &old.store.timeout),
            key::STORE_KEY_PREFIX => keep(&mut new.store.key_prefix, &old.store.key_prefix),
            key::STORE_CLOCK => keep(&mut new.store.clock_local, &old.store.clock_local),
            key::STORE_MAX_BATCH => keep(&mut new.store.max_batch, &old.store.max_batch),
            key::STORE_BREAKER => keep(&mut new.store.breaker, &old.store.breaker),
            // The span exporter is installed with the process's subscriber, once.
            key::TELEMETRY => keep(&mut new.telemetry, &old.telemetry),
            // Held by store.backend and store.breaker, reported as those.
            key::STORE_URL
            | key::STORE_URLS
            | key::STORE_MASTER_NAME
            | key::STORE_MAX_KEYS
            | key::STORE_BREAKER_FAILURES
            | key::STORE_BREAKER_OPEN_FOR
            | key::TELEMETRY_OTLP_ENDPOINT
            | key::TELEMETRY_SAMPLE_RATIO
            | key::TELEMETRY_SERVICE_NAME => false,
            key::RLS_LISTEN => {
                let listen = |c: &Config| c.rls.as_ref().map(|r| r.listen);
                let differs = listen(old) != listen(new);
                match (&old.rls, &mut new.rls) {
                    (Some(o), Some(n)) => n.listen = o.listen,
                    (None, Some(n)) => n.listen = None,
                    // No listener to stop: the old rules keep serving until a restart.
                    (Some(o), None) => new.rls = Some(o.clone()),
                    (None, None) => {}
                }
                differs
            }
            other => {
                debug_assert!(false, "restart-only key {other} is not kept on reload");
                false
            }
        };
        if differs {
            changed.push(k);
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trigger_reads_as_its_name_in_json() {
        let names = [
            ReloadTrigger::Sighup,
            ReloadTrigger::Api,
            ReloadTrigger::File,
        ]
        .map(|t| serde_json::to_string(&t).unwrap_or_default());
        assert_eq!(names, ["\"sighup\"", "\"api\"", "\"file\""]);
        let r = Reloaded {
            trigger: ReloadTrigger::Api,
            changed: false,
            restart_required: Vec::new(),
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap_or_default(),
            r#"{"trigger":"api","changed":false,"restart_required":[]}"#
        );
    }

    fn parse(text: &str) -> Config {
        Config::parse("t.toml", text).expect("valid")
    }

    #[test]
    fn restart_only_keys_are_named_and_nothing_else() {
        let a = parse("[server]\nlisten = \"127.0.0.1:1\"\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n[[policy]]\nname = \"p\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n");
        let same_keys = parse("[server]\nlisten = \"127.0.0.1:1\"\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n[[policy]]\nname = \"p\"\nalgorithm = \"gcra\"\nlimit = 9\nperiod = \"1m\"\n");
        let mut kept = same_keys.clone();
        assert!(keep_running(&a, &mut kept).is_empty());
        assert_eq!(
            kept.policies[0].limit(),
            same_keys.policies[0].limit(),
            "applies"
        );
        let moved = parse("[server]\nlisten = \"127.0.0.1:2\"\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:2\"\ntimeout = \"1s\"\n");
        let mut kept = moved.clone();
        assert_eq!(
            keep_running(&a, &mut kept),
            vec!["server.listen", "store.backend", "store.timeout"]
        );
        // The running values stay: what /v1/config shows is what serves.
        assert_eq!(kept.server.listen, a.server.listen);
        assert_eq!(kept.store.backend, a.store.backend);
        assert_eq!(kept.store.timeout, a.store.timeout);
    }

    #[test]
    fn a_new_max_batch_waits_for_a_restart() {
        let store = "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n";
        let running = parse(store);
        let mut next = parse(&format!("{store}max_batch = 1\n"));
        assert_eq!(keep_running(&running, &mut next), vec!["store.max_batch"]);
        assert_eq!(next.store.max_batch, 64);
    }

    #[test]
    fn a_config_that_limits_nothing_or_locks_the_operator_out_is_unsafe_and_says_why() {
        let policy = "[[policy]]\nname = \"p\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n";
        let token = "[server]\nadmin_token = \"0123456789abcdef\"\n";
        let secret = "[identity]\nsecret = \"s-one\"\n";
        let running = parse(&format!("{token}{secret}{policy}"));
        let why = |text: String| {
            unsafe_change(&running, &parse(&text))
                .err()
                .unwrap_or_default()
        };
        assert!(why(format!("{token}{secret}")).contains("no [[policy]]"));
        assert!(why(format!("{secret}{policy}")).contains("server.admin_token"));
        assert!(why(format!("{token}{policy}")).contains("identity.secret"));
        let other = why(format!("{token}[identity]\nsecret = \"s-two\"\n{policy}"));
        assert!(
            other.contains("identity.secret") && !other.contains("s-two"),
            "{other}"
        );
        // A new limit or a new token is an ordinary change.
        let changed = format!(
            "[server]\nadmin_token = \"fedcba9876543210\"\n{secret}{}",
            policy.replace("limit = 1", "limit = 9")
        );
        assert_eq!(unsafe_change(&running, &parse(&changed)), Ok(()));
    }

    #[tokio::test]
    async fn the_built_in_defaults_have_no_file_to_reload() {
        let config = Config::builtin().expect("builtin");
        let limiter = crate::assemble::limiter(&config);
        let limits = ConnLimits::new(10, 10, tollgate_tower::Trust::default());
        let live = Live::new(
            None,
            config,
            limiter,
            Arc::new(HttpMetrics::default()),
            vec![limits],
        )
        .expect("live");
        assert!(matches!(
            live.reload(ReloadTrigger::Api).await,
            Err(ReloadError::NoFile)
        ));
        let mut out = String::new();
        live.render_metrics(&mut out);
        assert!(
            out.contains("tollgate_config_reloads_total{result=\"error\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("tollgate_config_reloads_total{result=\"ok\"} 0"),
            "{out}"
        );
    }

    /// The threads of this process whose name starts with `prefix` (Linux's names are cut to
    /// 15 bytes).
    #[cfg(target_os = "linux")]
    fn threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .filter(|name| name.starts_with(prefix))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Polls and reloads run on the gateway's one file thread, never on tokio's blocking pool,
    /// whose threads come and go (and once two were up, alternating polls kept both alive:
    /// the soak's thread count rose by one at a random minute).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn file_polls_and_reloads_start_no_pool_thread() {
        let dir = std::env::temp_dir().join(format!("tollgate-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("tollgate.toml");
        let text =
            "[[policy]]\nname = \"p\"\nalgorithm = \"token_bucket\"\nlimit = 5\nperiod = \"1m\"\n";
        std::fs::write(&path, text).expect("write");
        let config = Config::load(&path).expect("config");
        let limiter = crate::assemble::limiter(&config);
        let limits = ConnLimits::new(10, 10, tollgate_tower::Trust::default());
        let live = Arc::new(
            Live::new(
                Some(path.clone()),
                config,
                limiter,
                Arc::new(HttpMetrics::default()),
                vec![limits],
            )
            .expect("live"),
        );
        // The test's own runtime is a current-thread one: any pool thread would be tokio's
        // blocking pool ("tokio-runtime-worker", cut to "tokio-runtime-w").
        let pool_before = threads_named("tokio-runtime-w");
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let watcher = tokio::spawn(live.clone().watch_files(stop));
        for i in 0..5 {
            std::fs::write(
                &path,
                text.replace("limit = 5", &format!("limit = {}", 6 + i)),
            )
            .expect("write");
            let reloaded = live.reload(ReloadTrigger::Api).await.expect("reload");
            assert!(reloaded.changed);
            tokio::time::sleep(WATCH_EVERY).await;
        }
        // The watcher's polls went on meanwhile (the file is the one just reloaded, so none
        // of them reloads again).
        tokio::time::sleep(WATCH_EVERY * 4).await;
        assert_eq!(live.ok.load(Ordering::Relaxed), 5);
        assert_eq!(threads_named("tokio-runtime-w"), pool_before);
        // (The file thread names itself once it runs: by now it has run every job.)
        assert_eq!(threads_named("tollgate-files"), 1);
        let _ = stop_tx.send(true);
        let _ = watcher.await;
        drop(live);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
