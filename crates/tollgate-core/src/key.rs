//! What a store is asked: for one client, a set of rules, each with a cost.

use crate::algorithms::Limit;
use std::fmt;
use std::sync::Arc;

/// A client's identity after the keyed hash: 16 bytes, so raw API keys never reach a store.
/// It renders as 32 lowercase hex digits (the `{<client>}` part of a Redis key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey(pub [u8; 16]);

impl ClientKey {
    /// The key as a 128-bit integer (for in-memory tables).
    pub fn as_u128(&self) -> u128 {
        u128::from_le_bytes(self.0)
    }

    /// The key from a 128-bit integer.
    pub fn from_u128(v: u128) -> Self {
        Self(v.to_le_bytes())
    }

    /// The 32 lowercase hex digits (the `{<client>}` of every Redis key), as ASCII bytes,
    /// written into a buffer and appended at once: both digits of a byte from one table entry
    /// (digit by digit cost 236 instructions a key under callgrind, a `String::push` a digit
    /// 257).
    pub fn hex(&self) -> [u8; 32] {
        let mut digits = [0u8; 32];
        for (pair, b) in digits.chunks_exact_mut(2).zip(self.0) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
        }
        digits
    }
}

impl ClientKey {
    /// The Redis Cluster slot of this client's keys: their hash tag is the 32 hex digits, and
    /// a slot is CRC16/XMODEM of the tag modulo 16384 (the Cluster specification). Stores
    /// group a plan's keys by it; breakers are kept per range of slots.
    pub fn cluster_slot(&self) -> u16 {
        // The CRC of the 32 hex digits, fed as they are produced (no string: breakers and the
        // Cluster store ask on every request).
        let mut crc = 0;
        for b in self.0 {
            crc = crc16_step(crc, HEX[usize::from(b >> 4)]);
            crc = crc16_step(crc, HEX[usize::from(b & 15)]);
        }
        crc % 16384
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The two hex digits of each byte.
const HEX_PAIRS: [[u8; 2]; 256] = {
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 15]];
        i += 1;
    }
    t
};

/// One byte of CRC16/XMODEM, the checksum Redis Cluster maps keys to slots with.
fn crc16_step(mut crc: u16, byte: u8) -> u16 {
    crc ^= u16::from(byte) << 8;
    for _ in 0..8 {
        crc = if crc & 0x8000 != 0 {
            (crc << 1) ^ 0x1021
        } else {
            crc << 1
        };
    }
    crc
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        // ASCII hex digits: always UTF-8.
        f.write_str(std::str::from_utf8(&hex).unwrap_or_default())
    }
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientKey({self})")
    }
}

/// A named limit: what one policy enforces, as a store sees it. The name is part of the store
/// key; `id` is a 64-bit hash of it that in-process tables use instead of the string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    name: Arc<str>,
    id: u64,
    limit: Limit,
}

impl Rule {
    /// A rule named `name` enforcing `limit`.
    pub fn new(name: impl Into<Arc<str>>, limit: Limit) -> Self {
        let name = name.into();
        let id = fnv1a(name.as_bytes());
        Self { name, id, limit }
    }

    /// The policy name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A stable 64-bit hash of the name (FNV-1a).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The limit it enforces.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Whether a rule of a plan may deny the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// The rule's denial denies the request.
    #[default]
    Enforce,
    /// Dry run: decided and charged like an enforced rule, but a would-be denial denies
    /// nothing (and charges that rule nothing).
    Shadow,
    /// envoyproxy/ratelimit's quota mode: a quota rule over its limit charges nothing and
    /// denies the request only when every quota rule of the plan is over its limit (enforced
    /// rules deny as usual). A plan's quota rules are alternatives: one that allows is enough.
    Quota,
}

/// Whether a plan is allowed, from each check's mode and whether it allowed alone: every
/// enforced check allowed, and, when the plan has quota checks, at least one of them did.
pub fn plan_allows(checks: impl IntoIterator<Item = (Mode, bool)>) -> bool {
    let (mut quota, mut quota_ok) = (false, false);
    for (mode, allowed) in checks {
        match mode {
            Mode::Enforce if !allowed => return false,
            Mode::Enforce | Mode::Shadow => {}
            Mode::Quota => {
                quota = true;
                quota_ok |= allowed;
            }
        }
    }
    !quota || quota_ok
}

/// One item of a request's plan: a client's state under a rule, the units this request costs
/// there, and whether the rule enforces. A store decides all the checks of one plan together
/// (see [`crate::decide`]).
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// Whose state: the keyed hash of the identity this rule counts by.
    pub client: ClientKey,
    /// The rule.
    pub rule: &'a Rule,
    /// Units this request costs (0 is a pure query).
    pub cost: u64,
    /// Enforced or shadow.
    pub mode: Mode,
}

impl<'a> Check<'a> {
    /// An enforced check of `rule` for `client` at `cost`.
    pub fn new(client: ClientKey, rule: &'a Rule, cost: u64) -> Self {
        Self {
            client,
            rule,
            cost,
            mode: Mode::Enforce,
        }
    }

    /// The same check in shadow mode.
    pub fn shadow(self) -> Self {
        Self {
            mode: Mode::Shadow,
            ..self
        }
    }

    /// Whether this check denies the request alone when it denies (quota checks deny only
    /// together, see [`plan_allows`]).
    pub fn enforces(&self) -> bool {
        self.mode == Mode::Enforce
    }

    /// The same check in quota mode.
    pub fn quota(self) -> Self {
        Self {
            mode: Mode::Quota,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_key_renders_as_32_hex_digits() {
        let mut b = [0u8; 16];
        b[0] = 0xab;
        b[15] = 0x01;
        let k = ClientKey(b);
        let s = k.to_string();
        assert_eq!(s.len(), 32);
        for n in [0u128, 1, 0x0123_4567_89ab_cdef, u128::MAX, 1 << 127] {
            let k = ClientKey::from_u128(n);
            let expected: String = k.0.iter().map(|b| format!("{b:02x}")).collect();
            let mut appended = String::from("tollgate:{");
            appended.push_str(std::str::from_utf8(&k.hex()).expect("ASCII digits"));
            assert_eq!(appended, format!("tollgate:{{{expected}"));
        }
        // Every byte value, the positions in turn (each position sees sixteen values).
        for b in 0..=255u8 {
            let mut bytes = [0u8; 16];
            bytes[usize::from(b) % 16] = b;
            let k = ClientKey(bytes);
            let expected: String = k.0.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(k.to_string(), expected);
        }
        assert!(s.starts_with("ab"));
        assert!(s.ends_with("01"));
        assert_eq!(ClientKey::from_u128(k.as_u128()), k);
    }

    #[test]
    fn cluster_slots_are_crc16_of_the_hash_tag() {
        // The Redis Cluster specification gives CRC16("123456789") = 0x31C3.
        let crc = |bytes: &[u8]| bytes.iter().fold(0, |c, &b| crc16_step(c, b));
        assert_eq!(crc(b"123456789"), 0x31c3);
        for n in [7u128, 1 << 100, u128::MAX] {
            let k = ClientKey::from_u128(n);
            assert_eq!(k.cluster_slot(), crc(k.to_string().as_bytes()) % 16384);
            assert!(k.cluster_slot() < 16384);
        }
    }
}
