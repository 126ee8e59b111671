//! The shared conformance suite (tollgate-conformance) against the Redis store: a real
//! standalone redis-server, and a real 3-master Redis Cluster, each started per test with the
//! caller's clock so time-travelling tests run too.

use tollgate_conformance::ConformanceStore;
use tollgate_core::{Check, Micros, Verdict};
use tollgate_redis::{RedisConfig, RedisStore, StoreClock};
use tollgate_testkit::{RedisCluster, RedisServer};

/// A store and the Redis it talks to (`S`, a server or a cluster: dropped, and killed, with
/// the test).
struct Served<S> {
    store: RedisStore,
    _redis: S,
}

/// Connects to `redis` with `config` (its own URLs), on the caller's clock.
async fn served<S>(redis: S, config: RedisConfig) -> Served<S> {
    let store = match RedisStore::connect(config.with_clock(StoreClock::Local)).await {
        Ok(s) => s,
        Err(e) => panic!("cannot connect: {e}"),
    };
    Served {
        store,
        _redis: redis,
    }
}

impl<S: Send + Sync + 'static> ConformanceStore for Served<S> {
    async fn check(&self, checks: &[Check<'_>], now: Micros) -> Verdict {
        match self.store.check(checks, now).await {
            Ok(v) => v,
            Err(e) => panic!("store error: {e}"),
        }
    }
}

mod standalone {
    use super::*;

    tollgate_conformance::conformance_suite!({
        let server = RedisServer::start();
        let config = RedisConfig::standalone(server.url());
        served(server, config).await
    });
}

mod cluster {
    use super::*;

    tollgate_conformance::conformance_suite!({
        let cluster = RedisCluster::start(3, 0);
        let config = RedisConfig::cluster(cluster.seed_urls());
        served(cluster, config).await
    });
}
