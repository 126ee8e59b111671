//! Store errors, by kind. Being limited is never an error (it is a `Verdict`); these are the
//! failures the caller's failure policy handles.

use redis::{RedisError, ServerErrorKind};
use std::fmt;

/// The class of a store error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The server cannot be reached (refused, reset, dropped).
    Connection,
    /// The server did not answer in time.
    Timeout,
    /// The cluster is moving slots, failing over or down.
    Cluster,
    /// The server is loading or runs another client's long script.
    Busy,
    /// The server refused the script's call.
    Script,
    /// A reply this store does not understand.
    Protocol,
    /// A bad configuration (URL, client settings, an ACL that refuses a command), or a server
    /// whose own settings refuse writes now: MISCONF (it cannot save its data and
    /// `stop-writes-on-bgsave-error` is on), NOREPLICAS (fewer replicas than
    /// `min-replicas-to-write`); a call refused so wrote nothing.
    Config,
    /// The server refused our credentials (NOAUTH, WRONGPASS; a refused command, NOPERM, is
    /// [`ErrorKind::Config`]).
    Auth,
    /// A call this store refuses (a rule checked twice for one client, say).
    Invalid,
    /// The server is past its `maxmemory` and refuses writes (`maxmemory-policy noeviction`,
    /// or keys it may not evict): `OOM`. Nothing of the call was written.
    Oom,
}

impl ErrorKind {
    /// The name used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connection => "connection",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Cluster => "cluster",
            ErrorKind::Busy => "busy",
            ErrorKind::Script => "script",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Config => "config",
            ErrorKind::Auth => "auth",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Oom => "oom",
        }
    }
}

use ErrorKind as Kind;

/// Why a store call failed. `kind()` names the class for metrics
/// (`tollgate_store_errors_total{kind}`); `is_transient()` says whether retrying later may
/// succeed without anyone changing anything.
#[derive(Debug)]
pub struct RedisStoreError {
    kind: Kind,
    message: String,
    source: Option<RedisError>,
}

impl RedisStoreError {
    /// One of `connection`, `timeout`, `cluster`, `busy`, `script`, `protocol`, `config`,
    /// `auth` (the server refused the credentials, or wants some), `invalid`, `oom` (the
    /// server is full).
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// True for failures that go away by themselves: the server is unreachable, slow,
    /// loading, failing over. False for a bad configuration, a rejected argument or a reply
    /// the store does not understand.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            Kind::Connection | Kind::Timeout | Kind::Cluster | Kind::Busy
        )
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Config,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Invalid,
            message: message.into(),
            source: None,
        }
    }

    /// A coalesced call that outlived its bound: every plan it carried fails with this.
    pub(crate) fn timed_out(after: std::time::Duration) -> Self {
        Self {
            kind: Kind::Timeout,
            message: format!("no answer within {after:?}"),
            source: None,
        }
    }

    /// The task that was to send a queued plan is gone (the runtime is shutting down).
    pub(crate) fn dropped() -> Self {
        Self {
            kind: Kind::Connection,
            message: "the plan's batch was dropped before it was sent".to_string(),
            source: None,
        }
    }

    /// The same failure for another plan of a batch (the kind and message; the client's
    /// error itself stays with the first).
    pub(crate) fn duplicate(&self) -> Self {
        Self {
            kind: self.kind,
            message: self.message.clone(),
            source: None,
        }
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Protocol,
            message: message.into(),
            source: None,
        }
    }
}

/// Whether a Cluster node's answer of this kind says it did not run the call: another node
/// serves the slot (MOVED, ASK), the Cluster cannot serve it now (TRYAGAIN, CLUSTERDOWN,
/// MASTERDOWN), or the node is a replica (READONLY).
pub(crate) fn not_run_by_node(kind: redis::ErrorKind) -> bool {
    matches!(
        kind,
        redis::ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    )
}

/// Whether the server answered that it has no script of that SHA.
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Whether a Cluster node's answer `e` says it did not run the call ([`not_run_by_node`]), or
/// the node could not be reached at all. An I/O error after the call was written is neither:
/// the call may have run.
pub(crate) fn not_run_here(e: &RedisError) -> bool {
    not_run_by_node(e.kind()) || e.is_connection_refusal()
}

impl From<RedisError> for RedisStoreError {
    fn from(e: RedisError) -> Self {
        let kind = if e.is_timeout() {
            Kind::Timeout
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            Kind::Connection
        } else {
            match e.kind() {
                // No master to talk to yet: the sentinels report it down (a failover is
                // under way) or do not know it.
                redis::ErrorKind::ClusterConnectionNotFound
                | redis::ErrorKind::MasterNameNotFoundBySentinel
                | redis::ErrorKind::NoValidReplicasFoundBySentinel => Kind::Connection,
                redis::ErrorKind::EmptySentinelList => Kind::Config,
                k if not_run_by_node(k)
                    || k == redis::ErrorKind::Server(ServerErrorKind::CrossSlot) =>
                {
                    Kind::Cluster
                }
                redis::ErrorKind::Server(ServerErrorKind::BusyLoading) => Kind::Busy,
                redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => Kind::Protocol,
                // A refused AUTH (wrong password, unknown user) or a server that wants one.
                redis::ErrorKind::AuthenticationFailed => Kind::Auth,
                _ if wants_auth(&e) => Kind::Auth,
                redis::ErrorKind::InvalidClientConfig
                | redis::ErrorKind::Server(ServerErrorKind::NoPerm) => Kind::Config,
                _ => match e.code() {
                    // A script still running (BUSY) is another client's long script.
                    Some("BUSY") => Kind::Busy,
                    // Writes refused: past `maxmemory` with nothing the server may evict (OOM),
                    // or by its settings (MISCONF, NOREPLICAS). Redis checks these only before
                    // a script's first write (`scriptVerifyOOM`, `scriptVerifyWriteCommandAllow`
                    // in 7.0's script.c), so nothing of the call was written.
                    Some("OOM") => Kind::Oom,
                    Some("MISCONF" | "NOREPLICAS") => Kind::Config,
                    _ => Kind::Script,
                },
            }
        };
        Self {
            kind,
            message: e.to_string(),
            source: Some(e),
        }
    }
}

/// NOAUTH / WRONGPASS replies, and the protocol error Redis 7 answers an unauthenticated
/// client sending a large argument (a script) before closing its connection.
fn wants_auth(e: &RedisError) -> bool {
    matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || e.detail()
            .is_some_and(|d| d.contains("unauthenticated") || d.starts_with("NOAUTH"))
}

impl fmt::Display for RedisStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redis store {} error: {}",
            self.kind.as_str(),
            self.message
        )
    }
}

impl std::error::Error for RedisStoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
