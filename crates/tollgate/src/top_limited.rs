//! The most limited clients of the last few minutes, for the operators' status page.
//!
//! A space-saving summary (Metwally, Agrawal, El Abbadi 2005): at most [`CAPACITY`] counters
//! per shard and per minute; an unmonitored client replaces the smallest counter and inherits
//! its count as its error. So memory is fixed whatever the traffic, a client limited more than
//! `n / CAPACITY` times in a shard's minute (`n` its limited requests) is always present, and a
//! reported count is never below the true one and at most `error` above it.
//!
//! Only limited decisions are recorded: allowed traffic pays nothing. Clients are spread over
//! shards by their key (a keyed hash, uniform), each shard behind its own mutex held for a
//! scan of at most 32 counters, and a client always lands in the same shard, so shards never
//! overlap when merged. Minutes are a
//! ring indexed by `now`: a slot whose minute is over is reused, so nothing needs a timer.

use std::sync::{Arc, Mutex};
use tollgate_core::{ClientKey, Micros};

/// Counters per shard and minute.
pub const CAPACITY: usize = 32;
/// Shards (a power of two; a client's shard is picked from its key's first byte).
pub const SHARDS: usize = 16;
/// The length of one slot of the ring.
pub const MINUTE: Micros = 60_000_000;
/// Minutes kept: the current one and the four before it.
pub const MINUTES: usize = 5;

/// One monitored (client, policy).
#[derive(Debug, Clone)]
struct Counter {
    client: ClientKey,
    policy: Arc<str>,
    count: u64,
    error: u64,
}

/// One minute of one shard.
#[derive(Debug, Default)]
struct Slot {
    minute: u64,
    limited: u64,
    counters: Vec<Counter>,
}

impl Slot {
    fn record(&mut self, client: &ClientKey, policy: &Arc<str>) {
        self.limited += 1;
        if let Some(c) = self
            .counters
            .iter_mut()
            .find(|c| c.client == *client && same_policy(&c.policy, policy))
        {
            c.count += 1;
            return;
        }
        if self.counters.len() < CAPACITY {
            self.counters.push(Counter {
                client: *client,
                policy: policy.clone(),
                count: 1,
                error: 0,
            });
            return;
        }
        // Full: the smallest counter is taken over, its count kept as the newcomer's error.
        if let Some(min) = self.counters.iter_mut().min_by_key(|c| c.count) {
            min.error = min.count;
            min.count += 1;
            min.client = *client;
            min.policy = policy.clone();
        }
    }

    /// What an unmonitored client may have had in this slot: the smallest count when full.
    fn floor(&self) -> u64 {
        if self.counters.len() < CAPACITY {
            0
        } else {
            self.counters.iter().map(|c| c.count).min().unwrap_or(0)
        }
    }
}

fn same_policy(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// One row of [`MostLimited`](crate::metrics::MostLimited): a client the limiter rejected often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitedClient {
    /// The client's key (the keyed hash of its identity; never the identity).
    pub client: ClientKey,
    /// The policy that limited it.
    pub policy: Arc<str>,
    /// Limited requests in the window: never below the true count.
    pub count: u64,
    /// How much `count` may exceed the true count (`count - error` is a lower bound).
    pub error: u64,
}

/// The bounded summary of limited clients; see the module docs.
pub struct TopLimited {
    shards: Vec<Mutex<[Slot; MINUTES]>>,
}

impl std::fmt::Debug for TopLimited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the clients: a debug print of a policy should not list who was limited.
        f.debug_struct("TopLimited").finish_non_exhaustive()
    }
}

impl Default for TopLimited {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Default::default()))
                .collect(),
        }
    }
}

impl TopLimited {
    /// Counts one limited request of `client` under `policy` at `now`.
    pub fn record(&self, client: &ClientKey, policy: &Arc<str>, now: Micros) {
        let minute = now / MINUTE;
        let mut slots = self.shard(client).lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut slots[slot_index(minute)];
        if slot.minute != minute {
            slot.minute = minute;
            slot.limited = 0;
            slot.counters.clear();
        }
        slot.record(client, policy);
    }

    /// The `k` most limited (client, policy) pairs over the minutes of the ring that are not
    /// over at `now` (the current minute and the [`MINUTES`]` - 1` before it), most limited
    /// first, and the number of limited requests recorded in that window.
    pub fn top(&self, k: usize, now: Micros) -> (Vec<LimitedClient>, u64) {
        let current = now / MINUTE;
        let mut rows: Vec<LimitedClient> = Vec::new();
        let mut total = 0;
        for shard in &self.shards {
            let slots = shard.lock().unwrap_or_else(|e| e.into_inner());
            let live: Vec<&Slot> = slots
                .iter()
                .filter(|s| s.minute <= current && current - s.minute < MINUTES as u64)
                .filter(|s| !s.counters.is_empty())
                .collect();
            let start = rows.len();
            for s in &live {
                total += s.limited;
                for c in &s.counters {
                    let seen = rows[start..]
                        .iter()
                        .any(|r| r.client == c.client && same_policy(&r.policy, &c.policy));
                    if !seen {
                        rows.push(merged(&live, &c.client, &c.policy));
                    }
                }
            }
        }
        rows.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then((b.count - b.error).cmp(&(a.count - a.error)))
                .then(a.client.0.cmp(&b.client.0))
        });
        rows.truncate(k);
        (rows, total)
    }

    /// Counters held now, over every shard and minute (at most `SHARDS * MINUTES * CAPACITY`).
    #[cfg(test)]
    fn counters(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let slots = s.lock().unwrap_or_else(|e| e.into_inner());
                slots.iter().map(|s| s.counters.len()).sum::<usize>()
            })
            .sum()
    }

    fn shard(&self, client: &ClientKey) -> &Mutex<[Slot; MINUTES]> {
        &self.shards[usize::from(client.0[0]) % SHARDS]
    }
}

fn slot_index(minute: u64) -> usize {
    // The remainder is below MINUTES, so it fits any usize.
    usize::try_from(minute % MINUTES as u64).unwrap_or(0)
}

/// One pair's count over the live slots of its shard: a slot that does not monitor it adds
/// its floor to both the count and the error (the pair may have had that many there).
fn merged(live: &[&Slot], client: &ClientKey, policy: &Arc<str>) -> LimitedClient {
    let mut count = 0;
    let mut error = 0;
    for s in live {
        match s
            .counters
            .iter()
            .find(|c| c.client == *client && same_policy(&c.policy, policy))
        {
            Some(c) => {
                count += c.count;
                error += c.error;
            }
            None => {
                let floor = s.floor();
                count += floor;
                error += floor;
            }
        }
    }
    LimitedClient {
        client: *client,
        policy: policy.clone(),
        count,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(i: u64) -> ClientKey {
        // Spread like real keys: the first byte picks the shard.
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
        b[8..].copy_from_slice(&i.to_le_bytes());
        ClientKey(b)
    }

    /// A small deterministic generator (xorshift), so the streams are reproducible.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    const T0: Micros = 1_700_000_000_000_000;

    #[test]
    fn memory_stays_bounded_whatever_the_number_of_clients() {
        let top = TopLimited::default();
        let p: Arc<str> = "api".into();
        for i in 0..200_000u64 {
            // Seven minutes of distinct clients: every slot fills and the ring wraps.
            top.record(&key(i), &p, T0 + i * 2_100);
        }
        assert!(top.counters() <= SHARDS * MINUTES * CAPACITY);
        assert!(top.counters() >= SHARDS * CAPACITY, "the slots did fill");
    }

    #[test]
    fn heavy_hitters_are_found_among_many_light_clients() {
        let top = TopLimited::default();
        let p: Arc<str> = "api".into();
        let mut rng = Rng(0x5eed);
        let heavy = [key(1_000_001), key(1_000_002), key(1_000_003)];
        for i in 0..60_000u64 {
            let c = if i % 10 < 3 {
                heavy[usize::try_from(i % 10).unwrap_or(0)]
            } else {
                key(rng.next() % 50_000)
            };
            top.record(&c, &p, T0 + i * 1_000);
        }
        let (rows, total) = top.top(3, T0 + 60_000 * 1_000);
        assert_eq!(total, 60_000);
        let found: Vec<ClientKey> = rows.iter().map(|r| r.client).collect();
        for h in heavy {
            assert!(found.contains(&h), "{h} missing from {rows:?}");
        }
    }

    #[test]
    fn counts_are_never_below_the_truth_nor_above_it_by_more_than_the_error() {
        let top = TopLimited::default();
        let policies: [Arc<str>; 2] = ["api".into(), "login".into()];
        let mut rng = Rng(42);
        let mut truth: HashMap<(ClientKey, usize), u64> = HashMap::new();
        let n = 80_000u64;
        for i in 0..n {
            // Zipf-like: small ids far more often than large ones.
            let r = rng.next();
            let id = (r % 4_000) / (1 + (r >> 40) % 64);
            let p = usize::try_from(r >> 63).unwrap_or(0);
            let c = key(id);
            *truth.entry((c, p)).or_default() += 1;
            // Spread over three minutes of the ring.
            top.record(&c, &policies[p], T0 + i * 2_000);
        }
        let (rows, total) = top.top(usize::MAX, T0 + n * 2_000);
        assert_eq!(total, n);
        assert!(!rows.is_empty());
        for r in &rows {
            let p = policies.iter().position(|p| *p == r.policy).unwrap_or(0);
            let t = truth.get(&(r.client, p)).copied().unwrap_or(0);
            assert!(r.count >= t, "under-reported: {r:?}, true {t}");
            assert!(
                r.count - r.error <= t,
                "error bound broken: {r:?}, true {t}"
            );
            // The space-saving bound: the error is at most the requests of its shard's
            // minutes divided by the counters of a slot.
            assert!(r.error <= n / CAPACITY as u64, "{r:?}");
        }
        // Every client above the bound is reported.
        let reported: Vec<(ClientKey, usize)> = rows
            .iter()
            .map(|r| {
                let p = policies.iter().position(|p| *p == r.policy).unwrap_or(0);
                (r.client, p)
            })
            .collect();
        let mut per_shard = [0u64; SHARDS];
        for ((c, _), t) in &truth {
            per_shard[usize::from(c.0[0]) % SHARDS] += t;
        }
        for ((c, p), t) in &truth {
            if *t > per_shard[usize::from(c.0[0]) % SHARDS] / CAPACITY as u64 {
                assert!(reported.contains(&(*c, *p)), "{c} under policy {p}: {t}");
            }
        }
    }

    #[test]
    fn minutes_older_than_the_ring_are_forgotten() {
        let top = TopLimited::default();
        let p: Arc<str> = "api".into();
        top.record(&key(7), &p, T0);
        top.record(&key(7), &p, T0 + 1);
        let (rows, _) = top.top(10, T0 + MINUTE * (MINUTES as u64 - 1));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].count, 2);
        assert_eq!(rows[0].error, 0);
        let (rows, total) = top.top(10, T0 + MINUTE * MINUTES as u64);
        assert!(rows.is_empty(), "{rows:?}");
        assert_eq!(total, 0);
        // A later minute reusing the slot starts from zero.
        top.record(&key(8), &p, T0 + MINUTE * MINUTES as u64);
        let (rows, _) = top.top(10, T0 + MINUTE * MINUTES as u64);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].client, key(8));
    }

    #[test]
    fn one_client_under_two_policies_is_two_rows_ordered_by_count() {
        let top = TopLimited::default();
        let (a, b): (Arc<str>, Arc<str>) = ("api".into(), "login".into());
        for _ in 0..3 {
            top.record(&key(1), &a, T0);
        }
        top.record(&key(1), &b, T0);
        let (rows, total) = top.top(10, T0);
        assert_eq!(total, 4);
        assert_eq!(rows.len(), 2);
        assert_eq!((&*rows[0].policy, rows[0].count), ("api", 3));
        assert_eq!((&*rows[1].policy, rows[1].count), ("login", 1));
    }
}
