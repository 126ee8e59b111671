//! `RlsService::decide` on the embedded store, in-process: one Envoy request of one
//! descriptor (`client=<key>`) and one of ten (`d0=<key>` .. `d9=<key>`, each its own rule),
//! the rls section's shapes (docs/benchmarks.md) without the gRPC server around them. Every
//! rule is a limit no client reaches (10,000 clients in turn), so every call is a full
//! decision that charges each descriptor's key. What a change to the work per descriptor
//! (finding its rule, hashing its identity, building its status) costs or saves shows here
//! without the server's HTTP/2 and kernel time around it; on a busy machine it is as noisy
//! as the server (docs/benchmarks.md, thirty-fourth session).
//!
//!   cargo bench -p tollgate-rls --bench decide

// criterion's macros write undocumented functions.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use tollgate::{Backend, IdentityHasher, Limiter, LimiterConfig};
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_rls::{RlsOptions, RlsService};

const CLIENTS: usize = 10_000;

fn rules() -> String {
    let limit = "    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n";
    let mut yaml = format!("domain: bench\ndescriptors:\n  - key: client\n{limit}");
    for d in 0..10 {
        yaml.push_str(&format!("  - key: d{d}\n{limit}"));
    }
    yaml
}

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

fn requests(descriptors: usize) -> Vec<RateLimitRequest> {
    (0..CLIENTS)
        .map(|n| {
            // 36 bytes, as `tollgate bench`'s keys.
            let value = format!("client-{n:08}-0123456789abcdefghij");
            let descriptors = if descriptors == 1 {
                vec![descriptor("client", &value)]
            } else {
                (0..descriptors)
                    .map(|d| descriptor(&format!("d{d}"), &value))
                    .collect()
            };
            RateLimitRequest {
                domain: "bench".into(),
                descriptors,
                hits_addend: 0,
            }
        })
        .collect()
}

fn decide(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let yaml = rules();
    let config = tollgate_rls::config::load_str([("bench.yaml", yaml.as_str())]).expect("rules");
    let limiter = Limiter::new(LimiterConfig::new(Backend::default()));
    let service = RlsService::new(
        limiter,
        IdentityHasher::new(b"a shared secret"),
        config,
        RlsOptions::default(),
    )
    .expect("service");
    let mut group = c.benchmark_group("decide");
    for (name, descriptors) in [("one descriptor", 1), ("ten descriptors", 10)] {
        let reqs = requests(descriptors);
        let mut next = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                next = (next + 1) % CLIENTS;
                let answer = rt.block_on(service.decide(black_box(&reqs[next])));
                black_box(answer.expect("decided").overall_code)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decide);
criterion_main!(benches);
