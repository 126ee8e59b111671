//! The series the operator asked for with `detailed_metric` or `value_to_metric`:
//! `tollgate_rls_descriptor_decisions_total{key, outcome}`, `key` named as envoyproxy/ratelimit
//! names its stats (`domain.key_value...`, request values in it where asked).
//!
//! Request values pick these labels, so they are bounded: at most [`MAX_SERIES_KEYS`] keys (and the overflow key),
//! each at most [`MAX_KEY_BYTES`] long (cut on a character boundary); past the bound every new
//! key counts under the one overflow key [`OVERFLOW_KEY`] (no dot, so no configured descriptor
//! can be named like it). Label values are escaped as the Prometheus text format requires.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tollgate::Outcome;

/// The most distinct keys kept.
pub const MAX_SERIES_KEYS: usize = 1000;
/// The longest key kept, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Where keys past the bound count.
pub const OVERFLOW_KEY: &str = "_overflow";

type Counts = Arc<[AtomicU64; Outcome::ALL.len()]>;

/// The bounded family. Cheap to share; one per service generation.
#[derive(Default)]
pub struct DescriptorMetrics {
    series: RwLock<HashMap<String, Counts>>,
}

impl DescriptorMetrics {
    /// Counts one decision under `key`.
    pub fn record(&self, key: &str, outcome: Outcome) {
        let key = cut(key);
        let counts = self.counts(key);
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == outcome) {
            counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counts(&self, key: &str) -> Counts {
        {
            let map = self.series.read().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = map.get(key) {
                return Arc::clone(c);
            }
            // Full: a flood of new keys counts under the overflow key without taking the
            // write lock (each would, and contend with every counted request).
            if map.len() >= MAX_SERIES_KEYS {
                if let Some(c) = map.get(OVERFLOW_KEY) {
                    return Arc::clone(c);
                }
            }
        }
        let mut map = self.series.write().unwrap_or_else(|e| e.into_inner());
        let key = if map.len() >= MAX_SERIES_KEYS && !map.contains_key(key) {
            OVERFLOW_KEY
        } else {
            key
        };
        Arc::clone(
            map.entry(key.to_string())
                .or_insert_with(|| Arc::new(std::array::from_fn(|_| AtomicU64::new(0)))),
        )
    }

    /// How many keys are held (the overflow key included).
    pub fn len(&self) -> usize {
        self.series.read().map_or(0, |m| m.len())
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The family in the Prometheus text format (nothing when empty).
    pub fn render(&self, out: &mut String) {
        let map = self.series.read().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return;
        }
        out.push_str("# HELP tollgate_rls_descriptor_decisions_total RLS decisions of descriptors with detailed_metric or value_to_metric, by envoyproxy's stat key (bounded).\n");
        out.push_str("# TYPE tollgate_rls_descriptor_decisions_total counter\n");
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        for key in keys {
            let counts = &map[key];
            for (o, n) in Outcome::ALL.iter().zip(counts.iter()) {
                let n = n.load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "tollgate_rls_descriptor_decisions_total{{key=\"{}\",outcome=\"{}\"}} {n}",
                        tollgate::metrics::escape_label(key),
                        o.as_str()
                    );
                }
            }
        }
    }
}

/// `key` cut to at most [`MAX_KEY_BYTES`] on a character boundary.
fn cut(key: &str) -> &str {
    if key.len() <= MAX_KEY_BYTES {
        return key;
    }
    let mut end = MAX_KEY_BYTES;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_cut_and_escaped() {
        let m = DescriptorMetrics::default();
        for i in 0..(MAX_SERIES_KEYS + 500) {
            m.record(&format!("d.user_{i}"), Outcome::Allowed);
        }
        assert_eq!(
            m.len(),
            MAX_SERIES_KEYS + 1,
            "the kept keys and the overflow key"
        );
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains(&format!(
            "tollgate_rls_descriptor_decisions_total{{key=\"{OVERFLOW_KEY}\",outcome=\"allowed\"}} 500"
        )));
        let m = DescriptorMetrics::default();
        m.record("d.k_a\"b\\c\nd", Outcome::Limited);
        m.record(&format!("d.k_{}", "é".repeat(300)), Outcome::Limited);
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("key=\"d.k_a\\\"b\\\\c\\nd\",outcome=\"limited\"} 1"));
        let long = out.lines().find(|l| l.contains('é')).expect("the long key");
        assert!(long.len() < MAX_KEY_BYTES + 100, "{}", long.len());
        assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 2);
    }
}
