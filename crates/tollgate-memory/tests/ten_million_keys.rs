//! Ten million distinct keys through a store bounded at one million. Alone in its test binary
//! so that the resident-memory figure it prints is the store's.

use tollgate_core::{Algorithm, Check, ClientKey, Limit, Quota, Rule};
use tollgate_memory::{MemoryConfig, MemoryStore};

const KEYS: u64 = 10_000_000;
const MAX_KEYS: usize = 1_000_000;
const BATCH: u64 = 100_000;

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn ten_million_distinct_keys_never_exceed_a_bound_of_one_million() {
    let store = MemoryStore::new(MemoryConfig {
        max_keys: MAX_KEYS,
        ..MemoryConfig::default()
    });
    // 100 per minute: one request leaves a key idle 0.6 s later (1.6 s with the grace). Time
    // advances 2 us per key, so the oldest of the million tracked keys are idle and the newer
    // ones are victims chosen by closeness to fresh.
    let quota = Quota::per_minute(100).expect("quota");
    let rule = Rule::new(
        "ten-million",
        Limit::new(Algorithm::TokenBucket, quota).expect("limit"),
    );
    let t0: u64 = 1_750_000_000_000_000;
    let rss_before = rss_bytes();
    let mut max_seen = 0;
    for batch in 0..KEYS / BATCH {
        for i in batch * BATCH..(batch + 1) * BATCH {
            let key = ClientKey::from_u128(
                u128::from(i).wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9_7f4a_7c15),
            );
            let v = store.check(&[Check::new(key, &rule, 1)], t0 + 2 * i);
            assert!(v.allowed, "a new client's first request is admitted");
        }
        let len = store.len();
        max_seen = max_seen.max(len);
        assert!(len <= MAX_KEYS, "batch {batch}: {len} keys tracked");
    }
    assert!(
        max_seen > MAX_KEYS * 9 / 10,
        "the table did fill up: {max_seen}"
    );
    // The newest key is tracked: a query shows its charge.
    let last = ClientKey::from_u128(
        u128::from(KEYS - 1).wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9_7f4a_7c15),
    );
    let again = store.check(&[Check::new(last, &rule, 0)], t0 + 2 * (KEYS - 1));
    assert_eq!(
        again.decisions[0].remaining, 99,
        "the newest key kept its charge"
    );
    assert_eq!(
        store.untracked(),
        0,
        "nothing was limited, so every key found room"
    );
    if let (Some(before), Some(after)) = (rss_before, rss_bytes()) {
        let delta = after.saturating_sub(before);
        eprintln!(
            "10M keys, max_keys 1M: {} tracked, {} untracked decisions, RSS +{:.1} MiB ({:.1} bytes/key)",
            store.len(),
            store.untracked(),
            delta as f64 / 1048576.0,
            delta as f64 / store.len() as f64
        );
        // 40 bytes per key of table at the bound; anything near 4x that is a leak.
        assert!(delta < 160 * MAX_KEYS as u64, "RSS grew by {delta} bytes");
    }
}
