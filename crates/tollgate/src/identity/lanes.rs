//! Keyed BLAKE3 of up to eight identities at once, with AVX2: lane `l` of every 256-bit
//! vector is input `l`'s, so one compression (seven rounds of eight `G` steps) serves eight
//! inputs where the `blake3` crate runs one compression an input. Written from the BLAKE3
//! specification (O'Connor, Aumasson, Neves, Wilcox-O'Hearn, "BLAKE3: one function, fast
//! everywhere", sections 2.2-2.5): a keyed hash of one chunk (at most 1,024 bytes) is that
//! chunk's blocks compressed in turn from the key, the first flagged CHUNK_START, the last
//! CHUNK_END and ROOT, each KEYED_HASH, at counter 0; the root output's first words are the
//! hash. The eight inputs of one call have the same number of blocks, so every lane runs the
//! same steps; each lane's last block has its own length.
//!
//! Why: an Envoy request of ten descriptors hashes ten identities, and the `blake3` crate's
//! one-input calls were 70 ns each on the 2-core machine (AVX-512 there), 6 % of such an
//! answer's CPU. Ten identities of 46 bytes: 898 ns one at a time, 429 together from one
//! buffer (docs/benchmarks.md, thirty-third and thirty-fourth sessions, "Envoy RLS CPU per
//! decision"). The RLS hashes together only requests of three descriptors or more. The
//! tests hold every output to the crate's.

use core::arch::x86_64::{
    __m256i, _mm256_add_epi32, _mm256_and_si256, _mm256_castsi256_si128, _mm256_cmpgt_epi8,
    _mm256_or_si256, _mm256_permute2x128_si256, _mm256_set1_epi32, _mm256_set1_epi8,
    _mm256_setr_epi32, _mm256_setr_epi8, _mm256_setzero_si256, _mm256_shuffle_epi8,
    _mm256_slli_epi32, _mm256_srli_epi32, _mm256_unpackhi_epi32, _mm256_unpackhi_epi64,
    _mm256_unpacklo_epi32, _mm256_unpacklo_epi64, _mm256_xor_si256, _mm_extract_epi64,
};

/// Inputs a call hashes at most.
pub(super) const LANES: usize = 8;

/// The longest input: one chunk.
pub(super) const MAX_INPUT: usize = 1024;

const BLOCK: usize = 64;

/// The first four words of BLAKE3's IV (those of SHA-256).
const IV: [u32; 4] = [0x6A09_E667, 0xBB67_AE85, 0x3C6E_F372, 0xA54F_F53A];

const CHUNK_START: i32 = 1;
const CHUNK_END: i32 = 2;
const ROOT: i32 = 8;
const KEYED_HASH: i32 = 16;

/// The message word each round's `G` steps take, in order: round 0 takes the words as they
/// are, and each later round permutes the round before's by BLAKE3's permutation.
const SCHEDULE: [[usize; 16]; 7] = {
    const PERMUTATION: [usize; 16] = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
    let mut s = [[0usize; 16]; 7];
    let mut i = 0;
    while i < 16 {
        s[0][i] = i;
        i += 1;
    }
    let mut r = 1;
    while r < 7 {
        let mut i = 0;
        while i < 16 {
            s[r][i] = s[r - 1][PERMUTATION[i]];
            i += 1;
        }
        r += 1;
    }
    s
};

/// The number of blocks BLAKE3 compresses for an input of `len` bytes (one for the empty
/// input), when it fits one chunk.
pub(super) fn blocks_of(len: usize) -> Option<usize> {
    (len <= MAX_INPUT).then(|| len.div_ceil(BLOCK).max(1))
}

/// Each 32-bit word rotated right by 16 (a byte shuffle).
#[target_feature(enable = "avx2")]
fn rot16(x: __m256i) -> __m256i {
    let m = _mm256_setr_epi8(
        2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9,
        14, 15, 12, 13,
    );
    _mm256_shuffle_epi8(x, m)
}

/// Each 32-bit word rotated right by 8 (a byte shuffle).
#[target_feature(enable = "avx2")]
fn rot8(x: __m256i) -> __m256i {
    let m = _mm256_setr_epi8(
        1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12, 1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8,
        13, 14, 15, 12,
    );
    _mm256_shuffle_epi8(x, m)
}

#[target_feature(enable = "avx2")]
fn rot12(x: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_srli_epi32::<12>(x), _mm256_slli_epi32::<20>(x))
}

#[target_feature(enable = "avx2")]
fn rot7(x: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_srli_epi32::<7>(x), _mm256_slli_epi32::<25>(x))
}

/// BLAKE3's `G` on state words a, b, c, d with message words x, y, in every lane.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
fn g(v: &mut [__m256i; 16], a: usize, b: usize, c: usize, d: usize, x: __m256i, y: __m256i) {
    v[a] = _mm256_add_epi32(_mm256_add_epi32(v[a], v[b]), x);
    v[d] = rot16(_mm256_xor_si256(v[d], v[a]));
    v[c] = _mm256_add_epi32(v[c], v[d]);
    v[b] = rot12(_mm256_xor_si256(v[b], v[c]));
    v[a] = _mm256_add_epi32(_mm256_add_epi32(v[a], v[b]), y);
    v[d] = rot8(_mm256_xor_si256(v[d], v[a]));
    v[c] = _mm256_add_epi32(v[c], v[d]);
    v[b] = rot7(_mm256_xor_si256(v[b], v[c]));
}

/// Rows of eight words in, columns out: `out[j]` holds word j of every row, row i in lane i.
#[target_feature(enable = "avx2")]
fn transpose(r: [__m256i; 8]) -> [__m256i; 8] {
    let a0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let a1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let a2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let a3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let a4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let a5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let a6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let a7 = _mm256_unpackhi_epi32(r[6], r[7]);
    let b0 = _mm256_unpacklo_epi64(a0, a2);
    let b1 = _mm256_unpackhi_epi64(a0, a2);
    let b2 = _mm256_unpacklo_epi64(a1, a3);
    let b3 = _mm256_unpackhi_epi64(a1, a3);
    let b4 = _mm256_unpacklo_epi64(a4, a6);
    let b5 = _mm256_unpackhi_epi64(a4, a6);
    let b6 = _mm256_unpacklo_epi64(a5, a7);
    let b7 = _mm256_unpackhi_epi64(a5, a7);
    [
        _mm256_permute2x128_si256::<0x20>(b0, b4),
        _mm256_permute2x128_si256::<0x20>(b1, b5),
        _mm256_permute2x128_si256::<0x20>(b2, b6),
        _mm256_permute2x128_si256::<0x20>(b3, b7),
        _mm256_permute2x128_si256::<0x31>(b0, b4),
        _mm256_permute2x128_si256::<0x31>(b1, b5),
        _mm256_permute2x128_si256::<0x31>(b2, b6),
        _mm256_permute2x128_si256::<0x31>(b3, b7),
    ]
}

/// Bytes `at .. at + 32` of an input as eight little-endian words, zeros past its `len`.
/// `bytes` holds the input and may go on past it (the bytes of a buffer after the input):
/// where 32 bytes are there, they are read in one load and the input's end masked, rather
/// than copied into zeros and read back (a load of bytes just stored in smaller pieces
/// waits for them: `perf annotate` put 18 % of a call there).
#[target_feature(enable = "avx2")]
fn window(bytes: &[u8], len: usize, at: usize) -> __m256i {
    let keep = len.saturating_sub(at);
    if let Some(w) = bytes.get(at..at + 32) {
        let v = load(w);
        if keep >= 32 {
            return v;
        }
        let index = _mm256_setr_epi8(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31,
        );
        // Bytes 0 .. keep (keep < 32) stay.
        let mask = _mm256_cmpgt_epi8(_mm256_set1_epi8(keep as i8), index);
        return _mm256_and_si256(v, mask);
    }
    let mut w = [0u8; 32];
    let rest = bytes.get(at..len.min(bytes.len())).unwrap_or_default();
    if let Some(to) = w.get_mut(..rest.len()) {
        to.copy_from_slice(rest);
    }
    load(&w)
}

/// 32 bytes as eight little-endian words (`w` is 32 bytes long; zeros past a shorter one).
#[target_feature(enable = "avx2")]
fn load(w: &[u8]) -> __m256i {
    let mut x = [0i32; 8];
    for (word, b) in x.iter_mut().zip(w.chunks_exact(4)) {
        *word = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    _mm256_setr_epi32(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7])
}

/// The first 16 bytes of keyed BLAKE3 (`key`: the key's eight little-endian words) of each
/// of `inputs` (at most [`LANES`]), into `out[i]`. An input is `(bytes, len)`: its bytes are
/// `bytes[..len]`, and `bytes` may go on past them (see `window`). Every input must take
/// `blocks` blocks ([`blocks_of`] of its `len`); the caller checks it, and a call that breaks
/// it gives wrong keys, never a fault (bytes are read only where they exist).
#[target_feature(enable = "avx2")]
pub(super) fn keyed(
    key: &[u32; 8],
    inputs: &[(&[u8], usize)],
    blocks: usize,
    out: &mut [[u8; 16]],
) {
    let n = inputs.len().min(LANES).min(out.len());
    let mut cv: [__m256i; 8] = [_mm256_setzero_si256(); 8];
    for (c, &k) in cv.iter_mut().zip(key) {
        *c = _mm256_set1_epi32(k as i32);
    }
    let mut last_len = [0i32; LANES];
    for (l, &(_, len)) in inputs.iter().take(n).enumerate() {
        // At most MAX_INPUT, which the caller checked: the cast keeps it.
        last_len[l] = (len - BLOCK * (blocks - 1).min(len / BLOCK)) as i32;
    }
    let mut h = [_mm256_setzero_si256(); 8];
    for j in 0..blocks {
        let at = BLOCK * j;
        let mut lo = [_mm256_setzero_si256(); LANES];
        let mut hi = [_mm256_setzero_si256(); LANES];
        for (l, &(bytes, len)) in inputs.iter().take(n).enumerate() {
            lo[l] = window(bytes, len, at);
            hi[l] = window(bytes, len, at + 32);
        }
        let lo = transpose(lo);
        let hi = transpose(hi);
        let m = [
            lo[0], lo[1], lo[2], lo[3], lo[4], lo[5], lo[6], lo[7], hi[0], hi[1], hi[2], hi[3],
            hi[4], hi[5], hi[6], hi[7],
        ];
        let last = j + 1 == blocks;
        let mut flags = KEYED_HASH;
        if j == 0 {
            flags |= CHUNK_START;
        }
        let block_len = if last {
            let w = last_len;
            _mm256_setr_epi32(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
        } else {
            _mm256_set1_epi32(BLOCK as i32)
        };
        if last {
            flags |= CHUNK_END | ROOT;
        }
        let z = _mm256_setzero_si256();
        let mut v = [
            cv[0],
            cv[1],
            cv[2],
            cv[3],
            cv[4],
            cv[5],
            cv[6],
            cv[7],
            _mm256_set1_epi32(IV[0] as i32),
            _mm256_set1_epi32(IV[1] as i32),
            _mm256_set1_epi32(IV[2] as i32),
            _mm256_set1_epi32(IV[3] as i32),
            z,
            z,
            block_len,
            _mm256_set1_epi32(flags),
        ];
        // The seven rounds written out, so that every message word's place is a constant
        // (a loop over the schedule indexed the words at run time: 20 % slower a call).
        macro_rules! round {
            ($r:expr) => {{
                let s = &SCHEDULE[$r];
                g(&mut v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
                g(&mut v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
                g(&mut v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
                g(&mut v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
                g(&mut v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
                g(&mut v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
                g(&mut v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
                g(&mut v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
            }};
        }
        round!(0);
        round!(1);
        round!(2);
        round!(3);
        round!(4);
        round!(5);
        round!(6);
        if last {
            // The root output's first four words (16 bytes) are all a client key keeps.
            for i in 0..4 {
                h[i] = _mm256_xor_si256(v[i], v[i + 8]);
            }
        } else {
            for i in 0..8 {
                cv[i] = _mm256_xor_si256(v[i], v[i + 8]);
            }
        }
    }
    // Lane l's four words land in the low half of row l.
    let rows = transpose(h);
    for (l, o) in out.iter_mut().take(n).enumerate() {
        let low = _mm256_castsi256_si128(rows[l]);
        o[..8].copy_from_slice(&_mm_extract_epi64::<0>(low).to_le_bytes());
        o[8..].copy_from_slice(&_mm_extract_epi64::<1>(low).to_le_bytes());
    }
}
