//! What a store connects to and how it reads time.

use std::fmt;
use std::time::Duration;

/// Where `now` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreClock {
    /// The script reads Redis `TIME`: every gateway sharing the store agrees on time, however
    /// its own clock drifts. The default.
    #[default]
    Store,
    /// The caller passes `now`: for tests that drive time, and stores without `TIME`.
    Local,
}

/// How to reach Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` or `rediss://...` (TLS). Standalone: exactly
    /// one URL. Cluster: one or more seed nodes.
    pub urls: Vec<String>,
    /// Redis Cluster (`redis-cluster` backend) rather than one standalone server.
    pub cluster: bool,
    /// The first part of every key: `<prefix>:{<client>}:<policy>`.
    pub key_prefix: String,
    /// Where `now` comes from.
    pub clock: StoreClock,
}

impl RedisConfig {
    /// A standalone server at `url`, prefix `tollgate`, store clock.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            cluster: false,
            key_prefix: "tollgate".to_string(),
            clock: StoreClock::Store,
        }
    }

    /// A cluster reached through `seeds`, prefix `tollgate`, store clock.
    pub fn cluster<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> Self {
        Self {
            urls: seeds.into_iter().map(Into::into).collect(),
            cluster: true,
            key_prefix: "tollgate".to_string(),
            clock: StoreClock::Store,
        }
    }

    /// The same configuration with `clock`.
    pub fn with_clock(mut self, clock: StoreClock) -> Self {
        self.clock = clock;
        self
    }

    /// The same configuration with `prefix`.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }
}

/// URLs with the password replaced by `***`.
impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact(u)).collect();
        f.debug_struct("RedisConfig")
            .field("urls", &urls)
            .field("cluster", &self.cluster)
            .field("key_prefix", &self.key_prefix)
            .field("clock", &self.clock)
            .finish()
    }
}

/// `scheme://user:secret@host` -> `scheme://user:***@host`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let creds = &rest[..at];
    let user = creds.split(':').next().unwrap_or("");
    let shown = if creds.contains(':') {
        format!("{user}:***")
    } else {
        "***".to_string()
    };
    format!("{}{shown}{}", &url[..scheme_end], &rest[at..])
}

/// A connection attempt gives up after this: a dead server fails calls fast.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// A reply that takes longer than this fails the call (callers usually time out sooner).
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_passwords() {
        let c = RedisConfig::standalone("redis://app:s3cret@127.0.0.1:6379/0");
        let s = format!("{c:?}");
        assert!(!s.contains("s3cret"), "{s}");
        assert!(s.contains("app:***@127.0.0.1"), "{s}");
        assert_eq!(redact("redis://127.0.0.1:1"), "redis://127.0.0.1:1");
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
    }
}
