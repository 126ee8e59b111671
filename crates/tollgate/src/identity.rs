//! Identities are hashed with a keyed hash before they reach any store, so raw API keys never
//! leave the process and a store dump cannot be reversed without the secret.
//!
//! Two keyed hashes, one per kind of store, both keyed from `identity.secret`:
//! - keyed BLAKE3 ([`IdentityHasher::new`]) for a store other processes share (Redis): its
//!   keys must be the same in every gateway and across upgrades, so this one never changes.
//! - SipHash-2-4 with a 128-bit output ([`IdentityHasher::process_local`]) for a store only
//!   this process reads (the memory store): its keys live as long as the process, so nothing
//!   outside it depends on them, and SipHash costs a short identity less than half of
//!   BLAKE3's instructions (`client_key_parts` of an API key: 857 against 368 a request
//!   under callgrind, docs/benchmarks.md). It is a pseudorandom function under a secret key:
//!   a client that does not know the key can neither predict a key nor aim two identities at
//!   one.

use tollgate_core::ClientKey;

#[cfg(target_arch = "x86_64")]
mod lanes;

/// The longest identity (source, separator and value) hashed from one stack buffer; longer
/// ones are streamed.
const ONE_SHOT: usize = 256;

/// Turns an identity (its source and value) into a [`ClientKey`] with a keyed hash: keyed
/// BLAKE3 for stores other processes share, SipHash-2-4 for a store of this process alone
/// (see the module's documentation).
#[derive(Clone)]
pub struct IdentityHasher {
    key: Key,
}

#[derive(Clone)]
enum Key {
    /// Keyed BLAKE3's 32-byte key.
    Shared([u8; 32]),
    /// SipHash's two 64-bit key words.
    Local(u64, u64),
}

impl std::fmt::Debug for IdentityHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.key {
            Key::Shared(_) => "shared",
            Key::Local(..) => "process-local",
        };
        write!(f, "IdentityHasher {{ {kind}, key: <redacted> }}")
    }
}

impl IdentityHasher {
    /// A hasher keyed by `secret` (any length; it is stretched with BLAKE3's key derivation)
    /// for a store other processes share: every gateway with the same secret makes the same
    /// keys, today and after an upgrade.
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: Key::Shared(blake3::derive_key(
                "tollgate 2026-11 client identity key",
                secret,
            )),
        }
    }

    /// A hasher keyed by `secret` for a store no other process reads (the memory store):
    /// SipHash-2-4, cheaper than BLAKE3, under a key derived from the secret in a context of
    /// its own. The keys differ from [`IdentityHasher::new`]'s: never give a store that other
    /// processes share keys made by this one.
    pub fn process_local(secret: &[u8]) -> Self {
        let k = blake3::derive_key("tollgate 2026-12 process-local client identity key", secret);
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&k[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Self {
            key: Key::Local(word(0), word(8)),
        }
    }

    /// Whether this hasher is [`IdentityHasher::process_local`]'s.
    pub fn is_process_local(&self) -> bool {
        matches!(self.key, Key::Local(..))
    }

    /// The client key of `value` as read from `source` (e.g. `header:x-api-key`, `ip`). The
    /// source is part of the hash, so the same string from two sources is two clients. Any
    /// length and any bytes are accepted.
    pub fn client_key(&self, source: &str, value: &[u8]) -> ClientKey {
        self.client_key_parts(&[source.as_bytes()], value)
    }

    /// [`IdentityHasher::client_key`] with the source name given in pieces (`"header:"` and
    /// the header's name, say), hashed as their concatenation: the same key, without building
    /// the name on every request.
    pub fn client_key_parts(&self, source: &[&[u8]], value: &[u8]) -> ClientKey {
        let key = match &self.key {
            Key::Shared(key) => key,
            Key::Local(k0, k1) => {
                // SipHash takes the pieces as they come, a word at a time.
                let mut h = Sip::new(*k0, *k1);
                for part in source {
                    h.write(part);
                }
                h.write(&[0]);
                h.write(value);
                return ClientKey(h.finish());
            }
        };
        let len = source.iter().map(|p| p.len()).sum::<usize>() + 1 + value.len();
        let out = if len <= ONE_SHOT {
            // The whole input in one buffer, hashed in one call: BLAKE3's one-shot hash skips
            // the streaming hasher's work per update (about 400 of a request's 1,100
            // instructions here, under callgrind). The hash of the same bytes either way.
            let mut buf = [0u8; ONE_SHOT];
            let mut at = 0;
            for part in source.iter().copied().chain([&[0u8][..], value]) {
                if let Some(to) = buf.get_mut(at..at + part.len()) {
                    to.copy_from_slice(part);
                }
                at += part.len();
            }
            blake3::keyed_hash(key, &buf[..at.min(ONE_SHOT)])
        } else {
            let mut h = blake3::Hasher::new_keyed(key);
            for part in source {
                h.update(part);
            }
            h.update(&[0]);
            h.update(value);
            h.finalize()
        };
        Self::truncated(&out)
    }

    /// [`IdentityHasher::client_key`] of an identity its caller has already joined into
    /// one buffer: `joined` is the source's bytes, a 0 byte, then the value's. The same key as
    /// from the parts, without copying them into a buffer of this function's own (a caller
    /// that builds the identity anyway, as the RLS does for each descriptor, writes it here
    /// first).
    pub fn client_key_joined(&self, joined: &[u8]) -> ClientKey {
        match &self.key {
            Key::Shared(key) => Self::truncated(&blake3::keyed_hash(key, joined)),
            Key::Local(k0, k1) => {
                let mut h = Sip::new(*k0, *k1);
                h.write(joined);
                ClientKey(h.finish())
            }
        }
    }

    /// Whether [`IdentityHasher::client_keys_in`] of `n` identities costs less than `n` calls
    /// of [`IdentityHasher::client_key_joined`]: a shared secret (keyed BLAKE3), AVX2 on this
    /// processor and at least three identities. A caller that would gather its identities
    /// only to hash them together asks first, and otherwise hashes each in place.
    pub fn hashes_together(&self, n: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Key::Shared(_) = &self.key {
            return n >= LANES_FROM && std::arch::is_x86_feature_detected!("avx2");
        }
        let _ = n;
        false
    }

    /// [`IdentityHasher::client_key_joined`] of each of `joined`, in order, into `out`
    /// (`out[i]` for each i below both lengths): the same keys, computed together. Keyed
    /// BLAKE3 hashes identities of one chunk (1,024 bytes) eight at a time with AVX2 where
    /// the processor has it (see `lanes` and `in_lanes`); the rest go one by one.
    pub fn client_keys_joined(&self, joined: &[&[u8]], out: &mut [ClientKey]) {
        self.client_keys_with(joined.len(), |i| (joined[i], joined[i].len()), out);
    }

    /// [`IdentityHasher::client_keys_joined`] of identities written one after the other in
    /// one buffer: identity i is `bytes[spans[i].0 .. spans[i].1]`. The same keys, and a
    /// little cheaper: an identity's last bytes are read with the buffer's next ones and
    /// masked, not copied (a buffer that goes on 32 bytes past its last identity spares that
    /// one the copy too). A span outside `bytes` is the key of the part inside it.
    pub fn client_keys_in(&self, bytes: &[u8], spans: &[(usize, usize)], out: &mut [ClientKey]) {
        self.client_keys_with(
            spans.len(),
            |i| {
                let (start, end) = spans[i];
                let tail = bytes.get(start..).unwrap_or_default();
                (tail, end.saturating_sub(start).min(tail.len()))
            },
            out,
        );
    }

    /// The keys of `n` identities (at most `out.len()`), identity i being `input(i)`:
    /// `(bytes, len)`, its bytes `bytes[..len]` (`len` within `bytes`), maybe followed by
    /// others.
    fn client_keys_with<'b>(
        &self,
        n: usize,
        input: impl Fn(usize) -> (&'b [u8], usize),
        out: &mut [ClientKey],
    ) {
        let n = n.min(out.len());
        #[cfg(target_arch = "x86_64")]
        if let Key::Shared(key) = &self.key {
            if self.hashes_together(n) {
                Self::in_lanes(key, n, input, out);
                return;
            }
        }
        for (i, o) in out.iter_mut().enumerate().take(n) {
            let (bytes, len) = input(i);
            *o = self.client_key_joined(bytes.get(..len).unwrap_or(bytes));
        }
    }

    /// A key's eight little-endian words.
    #[cfg(target_arch = "x86_64")]
    fn words(key: &[u8; 32]) -> [u32; 8] {
        let mut words = [0u32; 8];
        for (w, b) in words.iter_mut().zip(key.chunks_exact(4)) {
            let mut a = [0u8; 4];
            a.copy_from_slice(b);
            *w = u32::from_le_bytes(a);
        }
        words
    }

    /// Keyed BLAKE3 of identities `0..n` into `out[i]`, taken in order: each run of one
    /// size (number of blocks) eight at a time in lanes, a run of fewer than [`LANES_FROM`]
    /// or an identity past a chunk one at a time. A request's identities are of one size
    /// nearly always, so runs find what a sort by size would, without the sort. Only called
    /// where AVX2 was detected (`hashes_together`).
    #[cfg(target_arch = "x86_64")]
    fn in_lanes<'b>(
        key: &[u8; 32],
        n: usize,
        input: impl Fn(usize) -> (&'b [u8], usize),
        out: &mut [ClientKey],
    ) {
        let words = Self::words(key);
        let mut run = [(&[][..], 0usize); lanes::LANES];
        let mut run_at = 0;
        let mut k = 0;
        let mut run_blocks = 0;
        for i in 0..n {
            let (bytes, len) = input(i);
            let Some(blocks) = lanes::blocks_of(len) else {
                // Past a chunk: alone (the run goes on after it).
                out[i] =
                    Self::truncated(&blake3::keyed_hash(key, bytes.get(..len).unwrap_or(bytes)));
                continue;
            };
            // A run is contiguous in `out` unless an identity past a chunk broke it: then,
            // and at a new size or a full run, the run is hashed first.
            if k > 0 && (blocks != run_blocks || run_at + k != i || k == lanes::LANES) {
                Self::lane_call(key, &words, &run[..k], run_blocks, &mut out[run_at..]);
                k = 0;
            }
            if k == 0 {
                run_at = i;
                run_blocks = blocks;
            }
            run[k] = (bytes, len);
            k += 1;
        }
        Self::lane_call(key, &words, &run[..k], run_blocks, &mut out[run_at..]);
    }

    /// Keyed BLAKE3 of `inputs` (at most eight, each of `blocks` blocks) into `out`: in lanes
    /// from [`LANES_FROM`] of them, one at a time below. Only called where AVX2 was detected.
    #[cfg(target_arch = "x86_64")]
    fn lane_call(
        key: &[u8; 32],
        words: &[u32; 8],
        inputs: &[(&[u8], usize)],
        blocks: usize,
        out: &mut [ClientKey],
    ) {
        if inputs.len() < LANES_FROM {
            for (o, &(bytes, len)) in out.iter_mut().zip(inputs) {
                *o = Self::truncated(&blake3::keyed_hash(key, bytes.get(..len).unwrap_or(bytes)));
            }
            return;
        }
        let mut keys = [[0u8; 16]; lanes::LANES];
        let n = inputs.len().min(lanes::LANES);
        // SAFETY: `keyed`'s one requirement, AVX2, was detected on this processor before
        // `in_lanes`, its one caller, was called (`client_keys_with`, by `hashes_together`);
        // it reads each input only within its slice.
        #[allow(unsafe_code)]
        unsafe {
            lanes::keyed(words, &inputs[..n], blocks, &mut keys[..n])
        };
        for (o, k) in out.iter_mut().zip(&keys[..n]) {
            *o = ClientKey(*k);
        }
    }

    fn truncated(out: &blake3::Hash) -> ClientKey {
        let mut k = [0u8; 16];
        k.copy_from_slice(&out.as_bytes()[..16]);
        ClientKey(k)
    }
}

/// The fewest identities of one size hashed in lanes: one lane call costs about what two
/// one-at-a-time hashes do (`cargo bench -p tollgate --bench identity`).
#[cfg(target_arch = "x86_64")]
const LANES_FROM: usize = 3;

/// SipHash-2-4 with its 128-bit output (Aumasson and Bernstein, "SipHash: a fast short-input
/// PRF", and the 128-bit variant of its reference code), fed in pieces: the words of eight
/// bytes, little-endian, each compressed with two rounds; the last word holds the bytes left
/// and the input's length mod 256 in its top byte; four rounds give each half of the output.
struct Sip {
    v: [u64; 4],
    /// The bytes of a word not yet whole, low byte first, and how many there are (0..8).
    tail: u64,
    ntail: usize,
    len: usize,
}

impl Sip {
    fn new(k0: u64, k1: u64) -> Self {
        Self {
            v: [
                k0 ^ 0x736f_6d65_7073_6575,
                // The 128-bit variant marks v1.
                k1 ^ 0x646f_7261_6e64_6f6d ^ 0xee,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
            tail: 0,
            ntail: 0,
            len: 0,
        }
    }

    #[inline(always)]
    fn round(&mut self) {
        let [v0, v1, v2, v3] = &mut self.v;
        *v0 = v0.wrapping_add(*v1);
        *v1 = v1.rotate_left(13) ^ *v0;
        *v0 = v0.rotate_left(32);
        *v2 = v2.wrapping_add(*v3);
        *v3 = v3.rotate_left(16) ^ *v2;
        *v0 = v0.wrapping_add(*v3);
        *v3 = v3.rotate_left(21) ^ *v0;
        *v2 = v2.wrapping_add(*v1);
        *v1 = v1.rotate_left(17) ^ *v2;
        *v2 = v2.rotate_left(32);
    }

    #[inline(always)]
    fn word(&mut self, m: u64) {
        self.v[3] ^= m;
        self.round();
        self.round();
        self.v[0] ^= m;
    }

    #[inline(always)]
    fn write(&mut self, mut bytes: &[u8]) {
        self.len = self.len.wrapping_add(bytes.len());
        if self.ntail > 0 {
            // Fill the word begun by an earlier piece first.
            let take = (8 - self.ntail).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            self.tail |= low_bytes(head) << (8 * self.ntail);
            self.ntail += take;
            bytes = rest;
            if self.ntail < 8 {
                return;
            }
            let m = self.tail;
            self.word(m);
            self.tail = 0;
            self.ntail = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            self.word(u64::from_le_bytes(a));
        }
        self.tail = low_bytes(words.remainder());
        self.ntail = words.remainder().len();
    }

    #[inline(always)]
    fn finish(mut self) -> [u8; 16] {
        // The length's low byte, by the definition (an input of 256 bytes ends as one of 0).
        let last = self.tail | ((self.len as u64 & 0xff) << 56);
        self.word(last);
        self.v[2] ^= 0xee;
        for _ in 0..4 {
            self.round();
        }
        let low = self.v.iter().fold(0, |a, v| a ^ v);
        self.v[1] ^= 0xdd;
        for _ in 0..4 {
            self.round();
        }
        let high = self.v.iter().fold(0, |a, v| a ^ v);
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&low.to_le_bytes());
        out[8..].copy_from_slice(&high.to_le_bytes());
        out
    }
}

/// Up to seven bytes as the low bytes of a little-endian word (in four, two and one byte
/// reads, not one a byte).
#[inline(always)]
fn low_bytes(b: &[u8]) -> u64 {
    let (mut out, mut at) = (0u64, 0usize);
    if let Some(w) = b.get(..4) {
        let mut a = [0u8; 4];
        a.copy_from_slice(w);
        out = u64::from(u32::from_le_bytes(a));
        at = 4;
    }
    if let Some(w) = b.get(at..at + 2) {
        let mut a = [0u8; 2];
        a.copy_from_slice(w);
        out |= u64::from(u16::from_le_bytes(a)) << (8 * at);
        at += 2;
    }
    if let Some(&x) = b.get(at) {
        out |= u64::from(x) << (8 * at);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Identities short enough for one buffer and longer ones (streamed) hash to what the
    /// streaming hasher gives for the same bytes: no client changes its key (nor its Redis
    /// key) across the two paths or across this change.
    #[test]
    fn one_buffer_and_streaming_give_the_same_key() {
        let h = IdentityHasher::new(b"secret");
        let streamed = |source: &[u8], value: &[u8]| {
            let Key::Shared(key) = &h.key else {
                unreachable!("new is keyed BLAKE3")
            };
            let mut s = blake3::Hasher::new_keyed(key);
            s.update(source);
            s.update(&[0]);
            s.update(value);
            let mut k = [0u8; 16];
            k.copy_from_slice(&s.finalize().as_bytes()[..16]);
            ClientKey(k)
        };
        let source = b"header:x-api-key";
        for len in [0, 1, 64, 238, 239, 240, 255, 256, 1024, 5000] {
            let value: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            assert_eq!(
                h.client_key_parts(&[b"header:", b"x-api-key"], &value),
                streamed(source, &value),
                "a value of {len} bytes"
            );
        }
        // A key written down before this path existed: the keys every store already holds
        // stay where they are.
        let k = IdentityHasher::new(b"bench").client_key("ip", b"127.0.0.1");
        let hex: String = k.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "9ef347243136c9596ff8992c354fcad7");
    }

    /// An identity joined by its caller is the key of its parts, short or long.
    #[test]
    fn a_joined_identity_is_the_same_key() {
        let h = IdentityHasher::new(b"s");
        for len in [0, 1, 200, 251, 252, 300, 5000] {
            let value: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
            let mut joined = b"rls\0".to_vec();
            joined.extend_from_slice(&value);
            assert_eq!(
                h.client_key_joined(&joined),
                h.client_key("rls", &value),
                "a value of {len} bytes"
            );
        }
        assert_ne!(h.client_key_joined(b"rls\0v"), h.client_key("rls", b"\0v"));
    }

    #[test]
    fn a_source_in_pieces_is_the_same_key() {
        let h = IdentityHasher::new(b"s");
        assert_eq!(
            h.client_key_parts(&[b"header:", b"x-api-key"], b"v"),
            h.client_key("header:x-api-key", b"v")
        );
        assert_ne!(
            h.client_key_parts(&[b"header:", b"x-api-key"], b"v"),
            h.client_key("header:x-api-keyv", b"")
        );
    }

    #[test]
    fn same_identity_same_key_other_secret_other_key() {
        let a = IdentityHasher::new(b"s1");
        let b = IdentityHasher::new(b"s2");
        assert_eq!(
            a.client_key("ip", b"1.2.3.4"),
            a.client_key("ip", b"1.2.3.4")
        );
        assert_ne!(
            a.client_key("ip", b"1.2.3.4"),
            b.client_key("ip", b"1.2.3.4")
        );
    }

    #[test]
    fn source_is_part_of_the_identity() {
        let h = IdentityHasher::new(b"s");
        assert_ne!(
            h.client_key("ip", b"1.2.3.4"),
            h.client_key("header:x-api-key", b"1.2.3.4")
        );
    }

    #[test]
    fn huge_and_non_utf8_identities_hash() {
        for h in [
            IdentityHasher::new(b"s"),
            IdentityHasher::process_local(b"s"),
        ] {
            let big = vec![0xffu8; 1 << 20];
            let k = h.client_key("header:x-api-key", &big);
            assert_ne!(k, h.client_key("header:x-api-key", &big[1..]));
            // SipHash folds in the length mod 256 only: inputs 256 bytes apart still differ.
            assert_ne!(k, h.client_key("header:x-api-key", &big[256..]));
            assert_ne!(
                h.client_key("ip", &[0u8; 300]),
                h.client_key("ip", &[0u8; 44])
            );
        }
    }

    #[test]
    fn debug_redacts_the_key() {
        let h = IdentityHasher::new(b"topsecret");
        assert!(format!("{h:?}").contains("redacted"));
    }

    /// SipHash-2-4-128 as written here against the reference's first vector (key 00..0f,
    /// the empty message) and against the `siphasher` crate, an implementation of its own,
    /// for messages 00, 01, ... of every length up to 300 bytes, written in one piece and in
    /// pieces cut at every place.
    #[test]
    fn siphash_is_the_reference_function() {
        use siphasher::sip128::Hasher128 as _;
        use std::hash::Hasher as _;
        let (k0, k1) = (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);
        let key: Vec<u8> = (0..16).collect();
        let ours = |pieces: &[&[u8]]| {
            let mut h = Sip::new(k0, k1);
            for p in pieces {
                h.write(p);
            }
            h.finish()
        };
        let hex = |b: [u8; 16]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(ours(&[])), "a3817f04ba25a8e66df67214c7550293");
        let message: Vec<u8> = (0..300).map(|i| i as u8).collect();
        for len in 0..=300 {
            let m = &message[..len];
            let mut theirs = siphasher::sip128::SipHasher24::new_with_key(
                key.as_slice().try_into().expect("16 bytes"),
            );
            theirs.write(m);
            let want = theirs.finish128().as_bytes();
            assert_eq!(ours(&[m]), want, "{len} bytes in one piece");
            for cut in 0..=len {
                assert_eq!(
                    ours(&[&m[..cut], &m[cut..]]),
                    want,
                    "{len} bytes cut at {cut}"
                );
            }
            if len >= 10 {
                let pieces: Vec<&[u8]> = m.chunks(3).collect();
                assert_eq!(ours(&pieces), want, "{len} bytes in pieces of 3");
            }
        }
    }

    /// The process-local hasher is SipHash-2-4 of the same bytes the shared one hashes, under
    /// a key of its own: the same identity gives the same key every time and from every way
    /// of giving it, another secret or source another key, and never the shared hasher's key.
    #[test]
    fn the_process_local_hasher_keys_like_the_shared_one_but_apart_from_it() {
        let local = IdentityHasher::process_local(b"s");
        let shared = IdentityHasher::new(b"s");
        assert!(local.is_process_local() && !shared.is_process_local());
        let Key::Local(k0, k1) = local.key else {
            unreachable!("process_local is SipHash")
        };
        for len in [0, 1, 7, 8, 9, 15, 64, 238, 239, 240, 255, 256, 257, 5000] {
            let value: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let key = local.client_key_parts(&[b"header:", b"x-api-key"], &value);
            let mut joined = b"header:x-api-key\0".to_vec();
            joined.extend_from_slice(&value);
            let mut h = Sip::new(k0, k1);
            h.write(&joined);
            assert_eq!(key, ClientKey(h.finish()), "{len} bytes");
            assert_eq!(key, local.client_key_joined(&joined), "{len} bytes joined");
            assert_eq!(key, local.client_key("header:x-api-key", &value));
            assert_eq!(
                key,
                IdentityHasher::process_local(b"s").client_key("header:x-api-key", &value),
                "the same secret, the same key"
            );
            assert_ne!(key, shared.client_key("header:x-api-key", &value));
            assert_ne!(
                key,
                IdentityHasher::process_local(b"t").client_key("header:x-api-key", &value)
            );
            assert_ne!(key, local.client_key("ip", &value));
        }
        // A source and a value are told apart by the 0 between them.
        assert_ne!(
            local.client_key("header:x-api-key", b"v"),
            local.client_key("header:x-api-keyv", b"")
        );
        assert!(format!("{local:?}").contains("redacted"));
        assert!(!format!("{local:?}").contains(&format!("{k0}")));
    }

    /// Bytes that differ from identity to identity and from length to length.
    fn filler(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Keys computed together are the keys computed one at a time, whatever the mix: every
    /// length around the block boundaries of a chunk and past it (one at a time there),
    /// groups of one size of every count from 1 to 19 (the lanes take 3 to 8 at a time), and
    /// shuffled sizes; for both hashers.
    #[test]
    fn keys_together_are_the_keys_one_at_a_time() {
        for h in [
            IdentityHasher::new(b"secret"),
            IdentityHasher::new(b""),
            IdentityHasher::process_local(b"secret"),
        ] {
            let mut out = Vec::new();
            let check = |ids: &[Vec<u8>], out: &mut Vec<ClientKey>| {
                let joined: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
                out.clear();
                out.resize(joined.len(), ClientKey([0; 16]));
                h.client_keys_joined(&joined, out);
                let one: Vec<ClientKey> = joined.iter().map(|j| h.client_key_joined(j)).collect();
                assert_eq!(
                    *out,
                    one,
                    "lengths {:?}",
                    ids.iter().map(Vec::len).collect::<Vec<_>>()
                );
            };
            // Every length of a chunk and a little past it, eight of each (one lane call).
            for len in 0..=1030 {
                let ids: Vec<Vec<u8>> = (0..8).map(|i| filler(len as u64 * 8 + i, len)).collect();
                check(&ids, &mut out);
            }
            for count in 0..20 {
                let ids: Vec<Vec<u8>> = (0..count).map(|i| filler(i, 46)).collect();
                check(&ids, &mut out);
            }
            let lens = [
                0, 64, 65, 3, 128, 64, 129, 1, 1024, 1025, 63, 64, 700, 2, 65, 66, 5000, 64,
            ];
            let ids: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &l)| filler(i as u64, l))
                .collect();
            check(&ids, &mut out);
            // The same identities written one after the other in one buffer, between bytes
            // that are not theirs (read and masked, never hashed): the same keys.
            let mut buffer = vec![0xa5u8; 7];
            let mut spans = Vec::new();
            for id in &ids {
                let start = buffer.len();
                buffer.extend_from_slice(id);
                spans.push((start, buffer.len()));
                buffer.extend_from_slice(&[0xff; 5]);
            }
            let mut inside = vec![ClientKey([0; 16]); spans.len()];
            h.client_keys_in(&buffer, &spans, &mut inside);
            assert_eq!(inside, out);
            // Keys for as many identities as `out` has room for.
            let mut fewer = vec![ClientKey([0; 16]); 2];
            h.client_keys_in(&buffer, &spans, &mut fewer);
            assert_eq!(fewer, out[..2]);
            // A span past the buffer's end is the key of the part inside it.
            let mut inside = vec![ClientKey([0; 16]); 3];
            h.client_keys_in(b"abc", &[(1, 9), (4, 2), (0, 3)], &mut inside);
            let parts = [&b"bc"[..], b"", b"abc"];
            let one: Vec<ClientKey> = parts.iter().map(|p| h.client_key_joined(p)).collect();
            assert_eq!(inside, one);
            // Runs of one size broken by an identity past a chunk and by a size change: three
            // in lanes, one alone, five in lanes, then two of another size.
            let runs: Vec<Vec<u8>> = [40, 41, 42, 2000, 43, 44, 45, 46, 47, 100, 101]
                .iter()
                .enumerate()
                .map(|(i, &l)| filler(100 + i as u64, l))
                .collect();
            check(&runs, &mut out);
            // The same identity twice is the same key twice.
            let twice = [filler(1, 40), filler(2, 40), filler(1, 40), filler(3, 40)];
            check(&twice, &mut out);
            assert_eq!(out[0], out[2]);
            assert_ne!(out[0], out[1]);
        }
    }

    /// The lanes on their own, where this processor has AVX2: each of eight inputs of every
    /// length of a chunk is the `blake3` crate's keyed hash, in any lane, with fewer than
    /// eight inputs too.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_lanes_are_keyed_blake3() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let key: [u8; 32] = filler(99, 32).try_into().expect("32 bytes");
        let mut words = [0u32; 8];
        for (w, b) in words.iter_mut().zip(key.chunks_exact(4)) {
            *w = u32::from_le_bytes(b.try_into().expect("4 bytes"));
        }
        for len in 0..=lanes::MAX_INPUT {
            let blocks = lanes::blocks_of(len).expect("one chunk");
            let ids: Vec<Vec<u8>> = (0..8).map(|i| filler(len as u64 * 8 + i, len)).collect();
            // Each input alone, and followed by bytes not its own (read, then masked).
            let followed: Vec<Vec<u8>> = ids
                .iter()
                .map(|i| [i.as_slice(), &[0xff; 40]].concat())
                .collect();
            for (n, tail) in [(8, false), (5, false), (1, false), (8, true), (3, true)] {
                let from = if tail { &followed } else { &ids };
                let inputs: Vec<(&[u8], usize)> =
                    from.iter().take(n).map(|i| (i.as_slice(), len)).collect();
                let mut out = [[0u8; 16]; 8];
                // SAFETY: AVX2 was detected above.
                #[allow(unsafe_code)]
                unsafe {
                    lanes::keyed(&words, &inputs, blocks, &mut out[..n])
                };
                for (l, &(input, len)) in inputs.iter().enumerate() {
                    let want = blake3::keyed_hash(&key, &input[..len]);
                    assert_eq!(
                        out[l],
                        want.as_bytes()[..16],
                        "length {len}, lane {l} of {n}, followed: {tail}"
                    );
                }
                assert!(
                    out[n..].iter().all(|o| *o == [0; 16]),
                    "only {n} lanes written"
                );
            }
        }
        assert_eq!(lanes::blocks_of(0), Some(1));
        assert_eq!(lanes::blocks_of(64), Some(1));
        assert_eq!(lanes::blocks_of(65), Some(2));
        assert_eq!(lanes::blocks_of(1024), Some(16));
        assert_eq!(lanes::blocks_of(1025), None);
    }
}
