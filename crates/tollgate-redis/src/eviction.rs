//! What Redis does when it is full, as a limiter sees it.
//!
//! A Redis given a `maxmemory` acts on its `maxmemory-policy` once it reaches it. Every key the
//! store writes expires when its state is fresh again, so the keys nearest to fresh hold the
//! least: `volatile-ttl` evicts those first, and a flood of made-up clients (keys one request
//! old) makes room out of its own keys. `noeviction`, Redis's default, refuses every write
//! instead, and so every decision (each request follows its `on_failure`: `open` lets it
//! through); the LRU and random policies evict a limited client's state as readily as any
//! (the LFU ones too, once its count of uses has decayed while it waited), which gives it its
//! whole limit again. The store reads the setting when it connects and says so when a limit is
//! set under another policy (docs/operations.md, "Redis: memory").

use crate::reply::{info_field, info_texts};
use redis::Value;

/// The policy operations.md advises for a limiter's Redis given a `maxmemory`.
pub(crate) const ADVISED_POLICY: &str = "volatile-ttl";

/// A server's memory limit in bytes (0: none) and its `maxmemory-policy`, from an `INFO
/// memory` text.
pub(crate) fn limit_of(info: &str) -> Option<(u64, String)> {
    let bytes = info_field(info, "maxmemory")?.parse().ok()?;
    let policy = info_field(info, "maxmemory_policy")?;
    Some((bytes, policy.to_string()))
}

/// Every server's limit and policy in an `INFO memory` reply (a Cluster's: one per node).
pub(crate) fn collect_limits(reply: &Value) -> Vec<(u64, String)> {
    info_texts(reply).into_iter().filter_map(limit_of).collect()
}

/// What to tell the operator of a Redis of `maxmemory` bytes under `policy`, if anything.
pub(crate) fn advice(maxmemory: u64, policy: &str) -> Option<String> {
    if maxmemory == 0 || policy == ADVISED_POLICY {
        return None;
    }
    // The policy is the server's text: bounded, as every value the store logs.
    let shown: String = policy.chars().take(40).collect();
    let full = match policy {
        "noeviction" => "refuses every write, so every decision fails and each request \
                         follows its policy's on_failure (open lets it through)"
            .to_string(),
        _ => format!(
            "evicts keys by `{shown}`, a limited client's among them, which gives that client \
             its whole limit again"
        ),
    };
    Some(format!(
        "Redis has a maxmemory of {maxmemory} bytes under maxmemory-policy `{shown}`: once \
         full it {full}; run it with `maxmemory-policy {ADVISED_POLICY}`, which evicts the keys \
         nearest to fresh first (docs/operations.md, \"Redis: memory\")"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Memory\r\nused_memory:1030040\r\nmaxmemory:104857600\r\n\
                        maxmemory_human:100.00M\r\nmaxmemory_policy:noeviction\r\n";

    #[test]
    fn the_limit_and_the_policy_are_read_from_info_memory() {
        assert_eq!(limit_of(INFO), Some((104_857_600, "noeviction".into())));
        assert_eq!(
            limit_of("maxmemory:0\r\nmaxmemory_policy:volatile-ttl\r\n"),
            Some((0, "volatile-ttl".into()))
        );
        // `maxmemory_human` and `maxmemory_policy` start like `maxmemory`: not it.
        assert_eq!(
            limit_of("maxmemory_human:1M\r\nmaxmemory_policy:x\r\n"),
            None
        );
        assert_eq!(limit_of("maxmemory:lots\r\nmaxmemory_policy:x\r\n"), None);
        assert_eq!(limit_of(""), None);
    }

    #[test]
    fn every_node_of_a_cluster_reply_counts() {
        let node = |policy: &str| {
            Value::BulkString(format!("maxmemory:10\r\nmaxmemory_policy:{policy}\r\n").into_bytes())
        };
        let reply = Value::Map(vec![
            (Value::SimpleString("a:1".into()), node("volatile-ttl")),
            (Value::SimpleString("b:2".into()), node("allkeys-lru")),
        ]);
        assert_eq!(
            collect_limits(&reply),
            [(10, "volatile-ttl".into()), (10, "allkeys-lru".into())]
        );
        assert!(collect_limits(&Value::Int(3)).is_empty());
    }

    #[test]
    fn advice_where_a_limit_is_set_under_another_policy_only() {
        assert_eq!(
            advice(0, "noeviction"),
            None,
            "no limit: nothing is refused or evicted"
        );
        assert_eq!(advice(1 << 30, "volatile-ttl"), None);
        let refuses = advice(1 << 30, "noeviction").expect("noeviction");
        assert!(refuses.contains("refuses every write") && refuses.contains("volatile-ttl"));
        let evicts = advice(1 << 30, "allkeys-lru").expect("allkeys-lru");
        assert!(evicts.contains("`allkeys-lru`") && evicts.contains("limited client"));
        let long = "x".repeat(1000);
        assert!(
            advice(1, &long).expect("some policy").len() < 600,
            "bounded"
        );
    }
}
