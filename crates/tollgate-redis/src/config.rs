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
    /// Redis Sentinel (`redis-sentinel` backend): `urls` are the sentinels, and this is the
    /// name under which they monitor the master. The store asks them where the master is and
    /// asks again after a failover.
    pub sentinel_master: Option<String>,
    /// The first part of every key: `<prefix>:{<client>}:<policy>`.
    pub key_prefix: String,
    /// Where `now` comes from.
    pub clock: StoreClock,
    /// The most plans one script call carries (`store.max_batch`): while a call is in flight
    /// on a connection, the plans that arrive wait and leave together in the next call. 1:
    /// every plan is a call of its own. 1 to [`MAX_BATCH`]; default [`DEFAULT_MAX_BATCH`].
    pub max_batch: usize,
    /// The longest a coalesced call may take before each of its plans fails with a timeout
    /// (the limiter sets it to `store.timeout`, which also bounds each caller).
    pub call_timeout: Duration,
}

/// The default of [`RedisConfig::max_batch`].
pub const DEFAULT_MAX_BATCH: usize = 64;
/// The largest [`RedisConfig::max_batch`]: it bounds a batch script's keys, arguments and
/// reply (8 rules a plan at most in a generated script: 8,192 keys).
pub const MAX_BATCH: usize = 1024;

impl RedisConfig {
    /// A standalone server at `url`, prefix `tollgate`, store clock.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            cluster: false,
            sentinel_master: None,
            key_prefix: "tollgate".to_string(),
            clock: StoreClock::Store,
            max_batch: DEFAULT_MAX_BATCH,
            call_timeout: RESPONSE_TIMEOUT,
        }
    }

    /// A cluster reached through `seeds`, prefix `tollgate`, store clock.
    pub fn cluster<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> Self {
        Self {
            urls: seeds.into_iter().map(Into::into).collect(),
            cluster: true,
            sentinel_master: None,
            key_prefix: "tollgate".to_string(),
            clock: StoreClock::Store,
            max_batch: DEFAULT_MAX_BATCH,
            call_timeout: RESPONSE_TIMEOUT,
        }
    }

    /// The master that the sentinels at `sentinels` know as `master_name`, prefix `tollgate`,
    /// store clock. The user info of the first sentinel URL (if any) also authenticates to
    /// the master and its replicas.
    pub fn sentinel<S: Into<String>>(
        sentinels: impl IntoIterator<Item = S>,
        master_name: impl Into<String>,
    ) -> Self {
        Self {
            urls: sentinels.into_iter().map(Into::into).collect(),
            cluster: false,
            sentinel_master: Some(master_name.into()),
            key_prefix: "tollgate".to_string(),
            clock: StoreClock::Store,
            max_batch: DEFAULT_MAX_BATCH,
            call_timeout: RESPONSE_TIMEOUT,
        }
    }

    /// The same configuration with `clock`.
    pub fn with_clock(mut self, clock: StoreClock) -> Self {
        self.clock = clock;
        self
    }

    /// The same configuration with `max_batch` plans per script call at most, clamped to
    /// 1..=[`MAX_BATCH`] (1: one plan per call).
    pub fn with_max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.clamp(1, MAX_BATCH);
        self
    }

    /// The same configuration with coalesced calls bounded by `timeout`.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How long redis-rs's connections wait for a reply: [`RESPONSE_TIMEOUT`], or the call
    /// timeout (`store.timeout`) when it is longer. Below it, a plan alone (`max_batch = 1`, a
    /// plan across slots) failed at 1 s while the coalesced ones waited the full timeout.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.call_timeout.max(RESPONSE_TIMEOUT)
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
        let urls: Vec<String> = self.urls.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("RedisConfig")
            .field("urls", &urls)
            .field("cluster", &self.cluster)
            .field("sentinel_master", &self.sentinel_master)
            .field("key_prefix", &self.key_prefix)
            .field("clock", &self.clock)
            .field("max_batch", &self.max_batch)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

/// `url` with its secrets replaced by `***`: the password of the user info
/// (`scheme://user:secret@host` -> `scheme://user:***@host`) and the value of every
/// `password=` query parameter. Used wherever a URL is logged or quoted in an error.
///
/// It errs on the side of hiding: a URL that does not parse (a password with an unencoded
/// `/` or `?`, say) still has everything between `://` and its last `@` hidden.
pub fn redact_url(url: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    // Where the user info may end: the last `@`, unless a `password=` query holds one.
    let query_at = rest.find('?').filter(|&q| has_password_param(&rest[q..]));
    let search = query_at.map_or(rest, |q| &rest[..q]);
    let (mut out, tail) = match (scheme_end > 0).then(|| search.rfind('@')).flatten() {
        Some(at) => {
            let creds = &rest[..at];
            let shown = match creds.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => "***".to_string(),
            };
            (format!("{}{shown}", &url[..scheme_end]), &rest[at..])
        }
        None => (url[..scheme_end].to_string(), rest),
    };
    out.push_str(&redact_password_params(tail));
    out
}

/// The name the store's error messages use.
pub(crate) use self::redact_url as redact;

fn has_password_param(s: &str) -> bool {
    s.to_ascii_lowercase().contains("password=")
}

/// Every `password=VALUE` (any case) in `s` with VALUE (up to `&` or `#`) replaced by `***`.
fn redact_password_params(s: &str) -> String {
    const KEY: &str = "password=";
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while let Some(found) = lower[i..].find(KEY) {
        let value_start = i + found + KEY.len();
        out.push_str(&s[i..value_start]);
        out.push_str("***");
        i = s[value_start..]
            .find(['&', '#'])
            .map_or(s.len(), |end| value_start + end);
    }
    out.push_str(&s[i..]);
    out
}

/// Checks that `url` is a Redis URL the store can connect with, without connecting:
/// `redis://` or `rediss://`, a host that is a DNS name or an IP address, a port from 1 to
/// 65535, an optional database number. The error never quotes the URL, nor any part of it.
pub fn check_url(url: &str) -> Result<(), String> {
    use redis::IntoConnectionInfo;
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
        .ok_or("expected redis://HOST:PORT or rediss://HOST:PORT")?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => {
            let (addr, after) = v6.split_once(']').ok_or("an IPv6 host lacks its \"]\"")?;
            if addr.parse::<std::net::Ipv6Addr>().is_err() {
                return Err("the host in [...] is not an IPv6 address".to_string());
            }
            (addr, after.strip_prefix(':'))
        }
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    let dns_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if host.is_empty() {
        return Err("the host is missing".to_string());
    }
    if !host_port.starts_with('[') && !host.chars().all(dns_char) {
        return Err("the host is neither a DNS name nor an IP address".to_string());
    }
    if let Some(p) = port {
        match p.parse::<u32>() {
            Ok(n) if (1..=65535).contains(&n) => {}
            _ => return Err("the port is not a number from 1 to 65535".to_string()),
        }
    }
    url.into_connection_info()
        .map(|_| ())
        .map_err(|e| format!("the Redis client refuses it: {e}"))
}

/// A connection attempt gives up after this: a dead server fails calls fast.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// A reply on redis-rs's connections that takes longer than this fails the call (callers
/// usually time out sooner), unless the store's call timeout is longer
/// ([`RedisConfig::response_timeout`]).
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
        assert_eq!(redact_url("redis://127.0.0.1:1"), "redis://127.0.0.1:1");
        assert_eq!(redact_url("redis://:pw@h:1"), "redis://:***@h:1");
    }

    #[test]
    fn password_query_parameters_are_redacted() {
        assert_eq!(
            redact_url("redis://h:1/0?password=hunter2&db=1"),
            "redis://h:1/0?password=***&db=1"
        );
        assert_eq!(
            redact_url("rediss://u:pw@h:1?protocol=resp3&PassWord=x@y#insecure"),
            "rediss://u:***@h:1?protocol=resp3&PassWord=***#insecure"
        );
        // Unparsable: everything up to the last `@` is hidden.
        assert_eq!(redact_url("redis://:pa/ss@h"), "redis://:***@h");
    }

    #[test]
    fn urls_the_store_cannot_use_are_refused() {
        for ok in [
            "redis://127.0.0.1:6379",
            "redis://:pw@redis.internal:6380/2",
            "rediss://[::1]:6379",
            "redis://h?password=x",
        ] {
            assert_eq!(check_url(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("redis://%%%", "neither a DNS name"),
            ("redis://host:notaport", "port is not a number"),
            ("redis://host:99999", "port is not a number"),
            ("redis://host:0", "from 1 to 65535"),
            ("redis://", "host is missing"),
            ("redis://:secret@:1", "host is missing"),
            ("http://h:1", "expected redis://"),
            ("redis://[zz]:1", "not an IPv6"),
            ("redis://h:1/notadb", "database"),
        ] {
            let e = check_url(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    fn cases() -> proptest::test_runner::Config {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(512);
        proptest::test_runner::Config {
            cases,
            ..proptest::test_runner::Config::default()
        }
    }

    /// Characters a password may hold written as is: RFC 3986 unreserved and sub-delims, plus
    /// the URL delimiters that misplaced passwords contain (`/`, `?`, `:`, `#`).
    const PW: &str = "[A-Za-z0-9._~!$&'()*+,;=:/?#%-]{4,24}";

    proptest::proptest! {
        #![proptest_config(cases())]

        #[test]
        fn no_password_in_the_user_info_survives(
            user in "[a-z]{0,6}",
            pw in PW,
            host in "[a-z]{1,8}(\\.[a-z]{1,5})?",
            tail in "(:[0-9]{1,5})?(/[0-9]{1,2})?(\\?[a-z]{1,6}=[a-z0-9]{1,6})?",
        ) {
            let url = format!("redis://{user}:{pw}@{host}{tail}");
            proptest::prop_assume!(!format!("{user}{host}{tail}").contains(&pw));
            proptest::prop_assume!(!pw.to_ascii_lowercase().contains("password="));
            let shown = redact_url(&url);
            proptest::prop_assert!(!shown.contains(&pw), "{url} -> {shown}");
            proptest::prop_assert!(shown.contains(&host), "{url} -> {shown}");
        }

        #[test]
        fn no_password_query_parameter_survives(
            host in "[a-z]{1,8}",
            pw in "[A-Za-z0-9._~!$'()*+,;=:/?%@-]{4,24}",
            name in "(password|PASSWORD|Password)",
            before in "([a-z]{1,6}=[a-z0-9]{1,6}&)?",
            after in "(&[a-z]{1,6}=[a-z0-9]{1,6})?(#insecure)?",
        ) {
            let url = format!("rediss://{host}:6379/0?{before}{name}={pw}{after}");
            proptest::prop_assume!(!format!("{host}{before}{after}").contains(&pw));
            let shown = redact_url(&url);
            proptest::prop_assert!(!shown.contains(&pw), "{url} -> {shown}");
        }

        #[test]
        fn arbitrary_input_never_panics(url in "(?s).{0,120}") {
            let _ = redact_url(&url);
            let _ = check_url(&url);
        }
    }
}
