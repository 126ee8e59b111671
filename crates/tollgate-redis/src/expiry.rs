//! Redis's active expiry, as a limiter sees it.
//!
//! A limiter's keys live only while their state differs from a fresh one (a token bucket of 100
//! a minute: 0.6 s after a request), so Redis expires keys all the time, and many together when
//! many clients stop at once. It reclaims them in an active cycle run `hz` times a second, each
//! allowed a quarter of its period, during which it serves no command: up to 25 ms at its
//! default `hz 10`, 2.5 ms at `hz 100` (docs/operations.md, "Redis: `hz 100`"). The store reads
//! the setting when it connects and says so when it is below [`ADVISED_HZ`].

use crate::reply::{info_field, info_texts};
use redis::Value;

/// The `hz` operations.md advises for a limiter's Redis.
pub(crate) const ADVISED_HZ: u32 = 100;

/// The expiry frequency an `INFO server` text gives: `configured_hz` (what the operator set;
/// `hz` may be raised above it for a while by `dynamic-hz`), else `hz`.
pub(crate) fn hz_of(info: &str) -> Option<u32> {
    let field = |name: &str| info_field(info, name)?.parse().ok();
    field("configured_hz").or_else(|| field("hz"))
}

/// Every expiry frequency in an `INFO` reply: one text (a server), or one per node (a
/// Cluster's reply, a map or an array of them).
pub(crate) fn collect_hz(reply: &Value) -> Vec<u32> {
    info_texts(reply).into_iter().filter_map(hz_of).collect()
}

/// What to tell the operator of a Redis whose expiry runs `hz` times a second, if anything.
pub(crate) fn advice(hz: u32) -> Option<String> {
    (hz < ADVISED_HZ).then(|| {
        format!(
            "Redis reclaims expired keys {hz} times a second, in cycles of up to {} ms that \
             hold every command back when many keys expire together; run it with `hz {ADVISED_HZ}` \
             (docs/operations.md, \"Redis: hz 100\")",
            250 / hz.max(1)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nhz:10\r\nconfigured_hz:10\r\n";

    #[test]
    fn the_configured_frequency_comes_first() {
        assert_eq!(hz_of(INFO), Some(10));
        assert_eq!(
            hz_of("hz:40\r\nconfigured_hz:10\r\n"),
            Some(10),
            "dynamic-hz raised hz"
        );
        assert_eq!(
            hz_of("redis_version:2.8\r\nhz:10\r\n"),
            Some(10),
            "before configured_hz"
        );
        assert_eq!(hz_of("# Server\r\nhz:many\r\n"), None);
        assert_eq!(hz_of(""), None);
        // A longer field that starts like it is not it.
        assert_eq!(hz_of("hzx:5\r\nhz:100\r\n"), Some(100));
    }

    #[test]
    fn every_node_of_a_cluster_reply_counts() {
        let node =
            |hz: u32| Value::BulkString(format!("# Server\r\nconfigured_hz:{hz}\r\n").into_bytes());
        let found = collect_hz(&Value::Map(vec![
            (Value::SimpleString("a:1".into()), node(100)),
            (Value::SimpleString("b:2".into()), node(10)),
        ]));
        assert_eq!(found, [100, 10]);
        let found = collect_hz(&Value::Int(3));
        assert!(found.is_empty());
    }

    #[test]
    fn advice_below_the_advised_frequency_only() {
        let said = advice(10).expect("hz 10 is below");
        assert!(said.contains("25 ms") && said.contains("hz 100"), "{said}");
        assert!(advice(1).expect("hz 1").contains("250 ms"));
        assert_eq!(advice(100), None);
        assert_eq!(advice(500), None);
        assert!(advice(0).is_some(), "no division by zero");
    }
}
