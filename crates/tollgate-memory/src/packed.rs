//! How one algorithm state fits in a table slot.
//!
//! A slot has two state words: `meta` (a 41-bit value, the slot's rule index and a 3-bit kind)
//! and `time`. Four algorithms keep their exact tollgate-core state there, field for field, so
//! the store calls the core functions on the very state the core defines and nothing is
//! re-derived:
//!
//! | kind | value (41 bits) | time (64 bits) |
//! |---|---|---|
//! | fixed window | count | window start |
//! | token bucket | tokens | last |
//! | leaky bucket | level | last |
//! | GCRA | unused | TAT |
//! | sliding window counter | current (20 bits) and previous (20 bits) | window start |
//!
//! Counts never exceed the quota's limit or burst, at most 2^40 (`MAX_LIMIT`), which is why 41
//! bits suffice. A state that does not fit (a sliding log, a sliding counter above 2^20 per
//! window) goes to the shard's slab and the slot keeps the slab index.

use tollgate_core::algorithms::{
    FixedWindowState, GcraState, LeakyBucketState, SlidingWindowCounterState, TokenBucketState,
};
use tollgate_core::State;

const VALUE_BITS: u32 = 41;
const VALUE_MASK: u64 = (1 << VALUE_BITS) - 1;
const RULE_SHIFT: u32 = VALUE_BITS;
const RULE_MASK: u64 = 0xffff;
const KIND_SHIFT: u32 = RULE_SHIFT + 16;
const HALF_BITS: u32 = 20;
const HALF_MASK: u64 = (1 << HALF_BITS) - 1;

/// The largest number of distinct rules one shard can index (rule indices are 16 bits).
pub const MAX_RULES: usize = RULE_MASK as usize;

/// What a slot holds. `Empty` is zero so that a zeroed slot is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A free slot.
    Empty = 0,
    /// Fixed window, inline.
    FixedWindow = 1,
    /// Token bucket, inline.
    TokenBucket = 2,
    /// Leaky bucket, inline.
    LeakyBucket = 3,
    /// GCRA, inline.
    Gcra = 4,
    /// Sliding window counter, inline.
    SlidingCounter = 5,
    /// Any state, kept in the shard's slab at index `value`.
    Slab = 6,
}

/// The bit of a meta word that a check holding the shard lock shared sets while it updates a
/// two-word state in place. Never set while the lock is held exclusively.
pub const LOCKED: u64 = 1 << 63;

/// Reads the kind of a slot from its meta word.
pub fn kind(meta: u64) -> Kind {
    match (meta >> KIND_SHIFT) & 7 {
        1 => Kind::FixedWindow,
        2 => Kind::TokenBucket,
        3 => Kind::LeakyBucket,
        4 => Kind::Gcra,
        5 => Kind::SlidingCounter,
        6 => Kind::Slab,
        _ => Kind::Empty,
    }
}

/// The rule index stored in a meta word.
pub fn rule(meta: u64) -> u16 {
    // Masked to 16 bits, so the cast cannot truncate.
    ((meta >> RULE_SHIFT) & RULE_MASK) as u16
}

/// The 41-bit value stored in a meta word.
pub fn value(meta: u64) -> u64 {
    meta & VALUE_MASK
}

/// A meta word from its parts; `value` must fit in 41 bits.
pub fn meta(kind: Kind, rule: u16, value: u64) -> u64 {
    debug_assert!(value <= VALUE_MASK);
    ((kind as u64) << KIND_SHIFT) | (u64::from(rule) << RULE_SHIFT) | (value & VALUE_MASK)
}

/// Packs an inline state into `(kind, value, time)`, or `None` when it must go to the slab.
pub fn encode(state: &State) -> Option<(Kind, u64, u64)> {
    let (kind, value, time) = match state {
        State::FixedWindow(s) => (Kind::FixedWindow, s.count, s.window_start),
        // A bucket in debt goes to the slab (rare: only a settled debt makes one).
        State::TokenBucket(s) if s.debt > 0 => return None,
        State::TokenBucket(s) => (Kind::TokenBucket, s.tokens, s.last),
        State::LeakyBucket(s) => (Kind::LeakyBucket, s.level, s.last),
        State::Gcra(s) => (Kind::Gcra, 0, s.tat),
        State::SlidingWindowCounter(s) => {
            if s.current > HALF_MASK || s.previous > HALF_MASK {
                return None;
            }
            let v = (s.current << HALF_BITS) | s.previous;
            (Kind::SlidingCounter, v, s.window_start)
        }
        State::SlidingWindowLog(_) | State::Concurrency(_) => return None,
    };
    (value <= VALUE_MASK).then_some((kind, value, time))
}

/// Unpacks an inline state; `None` for `Empty` and `Slab`.
pub fn decode(meta: u64, time: u64) -> Option<State> {
    let v = value(meta);
    Some(match kind(meta) {
        Kind::FixedWindow => State::FixedWindow(FixedWindowState {
            window_start: time,
            count: v,
        }),
        Kind::TokenBucket => State::TokenBucket(TokenBucketState {
            tokens: v,
            last: time,
            debt: 0,
        }),
        Kind::LeakyBucket => State::LeakyBucket(LeakyBucketState {
            level: v,
            last: time,
        }),
        Kind::Gcra => State::Gcra(GcraState { tat: time }),
        Kind::SlidingCounter => State::SlidingWindowCounter(SlidingWindowCounterState {
            window_start: time,
            current: v >> HALF_BITS,
            previous: v & HALF_MASK,
        }),
        Kind::Empty | Kind::Slab => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::algorithms::SlidingWindowLogState;
    use tollgate_core::MAX_LIMIT;

    #[test]
    fn inline_states_round_trip_exactly() {
        let states = [
            State::FixedWindow(FixedWindowState {
                window_start: u64::MAX,
                count: MAX_LIMIT,
            }),
            State::TokenBucket(TokenBucketState {
                tokens: MAX_LIMIT,
                last: 1_700_000_000_000_000,
                debt: 0,
            }),
            State::LeakyBucket(LeakyBucketState { level: 7, last: 3 }),
            State::Gcra(GcraState { tat: u64::MAX }),
            State::SlidingWindowCounter(SlidingWindowCounterState {
                window_start: 60_000_000,
                current: HALF_MASK,
                previous: 1,
            }),
        ];
        for s in states {
            let (kind, value, time) = encode(&s).expect("fits inline");
            let m = meta(kind, 513, value);
            assert_eq!(rule(m), 513);
            assert_eq!(decode(m, time), Some(s));
        }
    }

    #[test]
    fn states_that_do_not_fit_go_to_the_slab() {
        let big = State::SlidingWindowCounter(SlidingWindowCounterState {
            window_start: 0,
            current: HALF_MASK + 1,
            previous: 0,
        });
        assert_eq!(encode(&big), None);
        let log = State::SlidingWindowLog(SlidingWindowLogState::default());
        assert_eq!(encode(&log), None);
        assert_eq!(decode(meta(Kind::Slab, 1, 5), 0), None);
        assert_eq!(kind(0), Kind::Empty);
    }
}
