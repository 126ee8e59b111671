//! ns per client key: keyed BLAKE3 of a request's identities one at a time
//! (`client_key_joined`, the `blake3` crate) against together (`client_keys_joined`, eight
//! at a time with AVX2 where the processor has it; `client_keys_in`, from one buffer as the
//! RLS writes them), side by side, for the shapes an Envoy
//! request has: ten, eight and three descriptors of 46 bytes (the RLS bench's `dN=<key>` in
//! domain `bench`), ten of 90 bytes (two blocks each: a longer domain and value), and two
//! (fewer than the lanes take: one at a time either way). SipHash (the memory store's
//! hasher) for reference. `cargo bench -p tollgate --bench identity`.

#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tollgate::{ClientKey, IdentityHasher};

/// `n` distinct identities of `len` bytes each.
fn identities(n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut b = format!("rls\0bench d{i}=client-{i:08}").into_bytes();
            b.resize(len, b'x');
            b
        })
        .collect()
}

fn keys(c: &mut Criterion) {
    let shared = IdentityHasher::new(b"bench secret");
    let local = IdentityHasher::process_local(b"bench secret");
    let mut g = c.benchmark_group("client_keys");
    for (n, len) in [(10, 46), (8, 46), (3, 46), (10, 90), (2, 46)] {
        let ids = identities(n, len);
        let joined: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
        let shape = format!("{n}x{len}B");
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(
            BenchmarkId::new("one_at_a_time", &shape),
            &joined,
            |b, j| {
                b.iter(|| {
                    let mut acc = 0u8;
                    for id in j.iter() {
                        acc ^= shared.client_key_joined(black_box(id)).0[0];
                    }
                    acc
                })
            },
        );
        let mut out = vec![ClientKey([0; 16]); n];
        g.bench_with_input(BenchmarkId::new("together", &shape), &joined, |b, j| {
            b.iter(|| {
                shared.client_keys_joined(black_box(j), &mut out);
                out[0].0[0]
            })
        });
        // One buffer, as the RLS writes a request's identities.
        let mut buffer = Vec::new();
        let mut spans = Vec::new();
        for id in &ids {
            let start = buffer.len();
            buffer.extend_from_slice(id);
            spans.push((start, buffer.len()));
        }
        buffer.extend_from_slice(&[0; 32]);
        let mut out = vec![ClientKey([0; 16]); n];
        g.bench_with_input(
            BenchmarkId::new("together_in_one_buffer", &shape),
            &spans,
            |b, s| {
                b.iter(|| {
                    shared.client_keys_in(black_box(&buffer), s, &mut out);
                    out[0].0[0]
                })
            },
        );
        let mut out = vec![ClientKey([0; 16]); n];
        g.bench_with_input(
            BenchmarkId::new("siphash_together", &shape),
            &joined,
            |b, j| {
                b.iter(|| {
                    local.client_keys_joined(black_box(j), &mut out);
                    out[0].0[0]
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, keys);
criterion_main!(benches);
