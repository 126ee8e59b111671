//! The shared store conformance suite, run against the memory store.

use tollgate_conformance::ConformanceStore;
use tollgate_core::{Check, Micros, Verdict};
use tollgate_memory::{MemoryConfig, MemoryStore};

struct Mem(MemoryStore);

impl ConformanceStore for Mem {
    async fn check(&self, checks: &[Check<'_>], now: Micros) -> Verdict {
        self.0.check(checks, now)
    }
}

tollgate_conformance::conformance_suite!(Mem(MemoryStore::new(MemoryConfig::default())));

/// The same suite through a tiny table: 64 keys in one shard, so the time-travelling tests run
/// while eviction is busy (the other clients' traffic fills the table).
mod small_table {
    use super::*;
    tollgate_conformance::conformance_suite!(Mem(MemoryStore::new(MemoryConfig {
        max_keys: 4096,
        ..MemoryConfig::default()
    })));
}
