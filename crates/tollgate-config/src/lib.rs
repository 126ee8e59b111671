//! tollgate's configuration in two stages, as ripgrep does it: `raw` is the file as written (parsed,
//! spanned, unknown keys rejected), and [`Config`] is what it means, built only from values
//! that were checked: a `Quota` that cannot be invalid, socket addresses, CIDRs, durations.
//! Every problem is reported with its file, line and key; validation goes on after the first
//! one so a user fixes a file in one pass.

mod duration;
mod error;
mod fields;
mod header_tiers;
mod jwt;
mod log_cost;
mod overrides;
mod policy;
mod raw;
mod rls;
pub mod schema;
mod show;
mod store;
mod telemetry;
mod validate;

pub use duration::parse_duration;
pub use error::{ConfigError, ConfigErrors};
pub use show::effective;
pub use telemetry::TelemetryConfig;

use http::Method;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tollgate::policy::FailurePolicy;
use tollgate::quota::Limit;
use tollgate::store::BreakerConfig;
use tollgate::{IdentityHasher, PolicySpec};
use tollgate_tower::{ForwardAuth, IdentityConfig, IdentitySource};

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it came from (`<built-in>` for the defaults).
    pub origin: String,
    /// `[server]`.
    pub server: ServerConfig,
    /// `[store]`.
    pub store: StoreConfig,
    /// `[identity]` without the secret.
    pub identity: IdentityConfig,
    /// `identity.secret`, expanded.
    pub secret: Secret,
    /// `identity.proxy_set_headers`: the headers every trusted proxy sets itself (a header
    /// tier not among them draws a warning: clients can reach it).
    pub proxy_set_headers: Vec<http::HeaderName>,
    /// The one identity hasher, keyed with `secret`: every client key (requests, overrides,
    /// the admin API, RLS descriptors) is made with it. Keyed BLAKE3 for a Redis store,
    /// SipHash-2-4 for the memory store ([`Keying`]).
    pub hasher: IdentityHasher,
    /// `[[policy]]`, in file order.
    pub policies: Vec<PolicyConfig>,
    /// Things that are allowed but probably not meant (`warning: FILE: ...` lines).
    pub warnings: Vec<String>,
    /// `[rls]`, when present.
    pub rls: Option<RlsSettings>,
    /// `[overrides] file`, resolved against the TOML file's directory.
    pub overrides_path: Option<std::path::PathBuf>,
    /// The `[[override]]` entries of that file, identities hashed.
    pub overrides: Vec<OverrideConfig>,
    /// `identity.jwt.jwks_file`, resolved against the TOML file's directory.
    pub jwks_path: Option<std::path::PathBuf>,
    /// `[telemetry]`: where decision spans are sent (nowhere by default).
    pub telemetry: TelemetryConfig,
}

/// One `[[override]]`: a named client's own quota under a policy.
#[derive(Debug, Clone)]
pub struct OverrideConfig {
    /// The policy it applies to.
    pub policy: String,
    /// The client, hashed with the identity secret (the raw identity is not kept).
    pub client: tollgate::ClientKey,
    /// The policy's settings with the override's quota, under the rule name
    /// `<policy>.override-<12 hex digits of the hashed client>` (the same on every gateway
    /// sharing the secret); checked by the library's rules.
    pub spec: PolicySpec,
}

impl OverrideConfig {
    /// The rule (store key, metric label, header) name.
    pub fn rule_name(&self) -> &str {
        &self.spec.name
    }

    /// The override's algorithm and quota.
    pub fn limit(&self) -> &Limit {
        &self.spec.limit
    }

    /// The rule name of the override of `client` under `policy`.
    pub(crate) fn rule_name_of(policy: &str, client: &tollgate::ClientKey) -> String {
        let hex = client.to_string();
        format!("{policy}.override-{}", &hex[..12.min(hex.len())])
    }
}

/// `[rls]`: Envoy's rate limit service.
#[derive(Debug, Clone)]
pub struct RlsSettings {
    /// The gRPC listener; `None`: the YAML is checked but nothing listens.
    pub listen: Option<SocketAddr>,
    /// `config`, resolved against the TOML file's directory.
    pub config_path: std::path::PathBuf,
    /// The descriptor rules read from `config_path`.
    pub config: tollgate_rls::RlsConfig,
    /// How the service answers: `store.on_failure`, `store.local_divisor`, and
    /// `response_headers = "draft"` (true) or `"off"`, and the global quota, shadow and
    /// dynamic metadata modes.
    pub options: tollgate_rls::RlsOptions,
    /// How the YAML files combine (`merge_domains`).
    pub load: tollgate_rls::config::LoadOptions,
}

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The gateway's address.
    pub listen: SocketAddr,
    /// The admin server's address.
    pub admin_listen: SocketAddr,
    /// Reverse proxy target; `None` is decision mode.
    pub upstream: Option<Upstream>,
    /// How long to wait for the upstream's response headers.
    pub upstream_timeout: Duration,
    /// Forward-auth headers (decision mode); `require_uri` when written in the file.
    pub forward_auth: ForwardAuth,
    /// `ambiguous_paths = "allow"`: match them normalised instead of answering 400.
    pub allow_ambiguous_paths: bool,
    /// Most open client connections.
    pub max_connections: usize,
    /// Most open connections from one address (trusted proxies exempt).
    pub max_connections_per_ip: usize,
    /// Most open connections to the admin port.
    pub admin_max_connections: usize,
    /// Most open connections to the admin port from one address.
    pub admin_max_connections_per_ip: usize,
    /// The most time a request body may take to arrive in full.
    pub body_timeout: Duration,
    /// `admin_token`, expanded: the bearer token of the admin API under `/v1/` (none: `/v1/`
    /// answers 403).
    pub admin_token: Option<Secret>,
}

/// An `http://host:port[/base]` upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `host:port`.
    pub authority: http::uri::Authority,
    /// A base path without a trailing slash (empty for none).
    pub base_path: String,
}

/// `[store]`.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Which store.
    pub backend: StoreBackend,
    /// Timeout of each store call.
    pub timeout: Duration,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Whose clock decides: Redis `TIME` (`store`) or the gateway's (`local`).
    pub clock_local: bool,
    /// Default failure policy of every policy.
    pub on_failure: FailurePolicy,
    /// Default divisor of the local fallback.
    pub local_divisor: u64,
    /// The most plans one Redis script call carries (`store.max_batch`; 1: one plan per
    /// call).
    pub max_batch: usize,
    /// Circuit breaker.
    pub breaker: BreakerConfig,
}

/// Which keyed hash makes a configuration's client keys (`tollgate::IdentityHasher`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keying {
    /// Keyed BLAKE3, the same in every process and version: a store other processes share
    /// (Redis in every form) holds these keys.
    Shared,
    /// SipHash-2-4, cheaper: the memory store, which no other process reads.
    ProcessLocal,
}

impl Keying {
    /// The keying a store backend's keys need.
    pub fn of(backend: &StoreBackend) -> Self {
        match backend {
            StoreBackend::Memory { .. } => Keying::ProcessLocal,
            _ => Keying::Shared,
        }
    }

    /// The keying `hasher` makes keys with.
    pub fn of_hasher(hasher: &IdentityHasher) -> Self {
        if hasher.is_process_local() {
            Keying::ProcessLocal
        } else {
            Keying::Shared
        }
    }

    /// The hasher of this keying under `secret`.
    pub fn hasher(self, secret: &[u8]) -> IdentityHasher {
        match self {
            Keying::Shared => IdentityHasher::new(secret),
            Keying::ProcessLocal => IdentityHasher::process_local(secret),
        }
    }
}

/// The store backend with its own settings.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreBackend {
    /// In-process.
    Memory {
        /// Hard bound on tracked keys.
        max_keys: usize,
    },
    /// One Redis server.
    Redis {
        /// `redis://` or `rediss://`.
        url: String,
    },
    /// A Redis Cluster.
    RedisCluster {
        /// Seed nodes.
        urls: Vec<String>,
    },
    /// The master that Redis Sentinel names, followed across failovers.
    RedisSentinel {
        /// The sentinels.
        urls: Vec<String>,
        /// The name the sentinels monitor the master under.
        master_name: String,
    },
}

impl StoreBackend {
    /// The config name.
    pub fn name(&self) -> &'static str {
        match self {
            StoreBackend::Memory { .. } => "memory",
            StoreBackend::Redis { .. } => "redis",
            StoreBackend::RedisCluster { .. } => "redis-cluster",
            StoreBackend::RedisSentinel { .. } => "redis-sentinel",
        }
    }
}

impl fmt::Debug for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreBackend::Memory { max_keys } => write!(f, "memory(max_keys={max_keys})"),
            StoreBackend::Redis { url } => write!(f, "redis({})", redact_url(url)),
            StoreBackend::RedisCluster { urls } => {
                let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                write!(f, "redis-cluster({})", urls.join(","))
            }
            StoreBackend::RedisSentinel { urls, master_name } => {
                let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                write!(f, "redis-sentinel({master_name}@{})", urls.join(","))
            }
        }
    }
}

/// A URL with its secrets (the user info's password, `?password=`) replaced by `***`.
pub use tollgate_redis::redact_url;

/// The identity secret; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One validated `[[policy]]`.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// What the limiter enforces: name (unique, `[A-Za-z0-9_-]+`), algorithm and quota, cost,
    /// failure policy, local divisor, shadow, sync; accepted by [`PolicySpec::validate`], so
    /// registering it cannot fail.
    pub spec: PolicySpec,
    /// Path prefix (starts with `/`).
    pub path_prefix: String,
    /// Methods (empty = all).
    pub methods: Vec<Method>,
    /// Match the path prefix ignoring ASCII case.
    pub case_insensitive: bool,
    /// Identity override.
    pub identity: Option<Vec<IdentitySource>>,
    /// `tier`: where a client's tier name comes from.
    pub tier: Option<tollgate_tower::TierSource>,
    /// `tiers.<name>`: each its own rule, named `<policy>.<tier>`.
    pub tiers: Vec<TierConfig>,
    /// `cost_from_request`, `cost_max`, `cost_from_response`: where the estimate and the
    /// real cost come from (`spec.settle` is set when a real cost does).
    pub costs: tollgate_tower::Costs,
}

/// One `tiers.<name>` of a policy.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// The tier name a client's JWT claim or header must equal.
    pub name: String,
    /// The policy's settings with the tier's quota, named `<policy>.<tier>`.
    pub spec: PolicySpec,
}

impl PolicyConfig {
    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The policy's algorithm and quota.
    pub fn limit(&self) -> &Limit {
        &self.spec.limit
    }
}

/// The secret used when none is configured. Fine for one process with the memory store;
/// gateways sharing Redis should set their own (a warning is logged otherwise).
pub const DEFAULT_SECRET: &str = "change-me";

/// The origin of [`Config::builtin`].
pub const BUILTIN_ORIGIN: &str = "<built-in>";

impl Config {
    /// The built-in defaults of `tollgate serve` without `--config`: memory store, decision
    /// mode, token_bucket 100/min per client IP, 127.0.0.1:8080, admin 127.0.0.1:9090.
    pub fn builtin() -> Result<Config, ConfigErrors> {
        Self::parse(BUILTIN_ORIGIN, BUILTIN)
    }

    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Self::load_keyed(path, None)
    }

    /// [`Config::load`] with the client keys made by `keying`'s hasher whatever the file's
    /// store (`None`: the file's store's, [`Keying::of`]). A reload gives the running store's:
    /// `store.backend` changes only with a restart, and until then every client key, the
    /// overrides' among them, must stay the one the running store holds.
    pub fn load_keyed(path: &Path, keying: Option<Keying>) -> Result<Config, ConfigErrors> {
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse_keyed(&file, &text, keying),
            Err(e) => Err(ConfigErrors(vec![ConfigError {
                file,
                line: 1,
                col: 1,
                key: "(file)".to_string(),
                message: format!("cannot read the file: {e}; expected a readable TOML file"),
            }])),
        }
    }

    /// Validates `text`, naming `file` in errors.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigErrors> {
        Self::parse_keyed(file, text, None)
    }

    /// [`Config::parse`], keyed as [`Config::load_keyed`] says.
    fn parse_keyed(file: &str, text: &str, keying: Option<Keying>) -> Result<Config, ConfigErrors> {
        validate::validate_keyed(file, text, |name| std::env::var(name).ok(), keying)
    }

    /// Validates `text` with `${NAME}` expanded by `env` (tests, and callers with their own
    /// environment).
    pub fn parse_with_env(
        file: &str,
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        validate::validate(file, text, env)
    }

    /// The files this configuration was read from, for a reload to watch: the TOML file (none
    /// for the built-in defaults), the overrides file, the JWKS file, the RLS YAML (its
    /// directory too, where a new file may appear).
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        if self.origin != BUILTIN_ORIGIN {
            files.push(std::path::PathBuf::from(&self.origin));
        }
        files.extend(self.overrides_path.iter().cloned());
        files.extend(self.jwks_path.iter().cloned());
        if let Some(rls) = &self.rls {
            files.push(rls.config_path.clone());
            for f in rls.config.files() {
                let f = std::path::PathBuf::from(f);
                if !files.contains(&f) {
                    files.push(f);
                }
            }
        }
        files
    }

    /// The hashed client of `SOURCE=VALUE` (e.g. `header:x-api-key=KEY`) under policy
    /// `policy`, as a request identified by that source gets it; an error says what is wrong.
    pub fn client_key(
        &self,
        policy: &PolicyConfig,
        spec: &[u8],
    ) -> Result<tollgate::ClientKey, String> {
        overrides::client_key(spec, Some(policy), &self.identity, &self.hasher)
    }

    /// Whether the gateway answers itself (no upstream).
    pub fn decision_mode(&self) -> bool {
        self.server.upstream.is_none()
    }
}

const BUILTIN: &str = r#"
[server]
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:9090"

[store]
backend = "memory"

[identity]
sources = ["ip"]

[[policy]]
name = "default"
algorithm = "token_bucket"
limit = 100
period = "1m"
"#;

#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod tests;
