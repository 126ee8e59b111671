//! The shared conformance suite (tollgate-conformance) against the Redis store: a real
//! standalone redis-server, and a real 3-master Redis Cluster, each started per test with the
//! caller's clock so time-travelling tests run too.

use tollgate_conformance::ConformanceStore;
use tollgate_core::{Check, Micros, Verdict};
use tollgate_redis::{RedisConfig, RedisStore, StoreClock};
use tollgate_testkit::{RedisCluster, RedisServer};

async fn decide(store: &RedisStore, checks: &[Check<'_>], now: Micros) -> Verdict {
    match store.check(checks, now).await {
        Ok(v) => v,
        Err(e) => panic!("store error: {e}"),
    }
}

async fn connect(config: RedisConfig) -> RedisStore {
    match RedisStore::connect(config.with_clock(StoreClock::Local)).await {
        Ok(s) => s,
        Err(e) => panic!("cannot connect: {e}"),
    }
}

mod standalone {
    use super::*;

    /// A store and the server it talks to (dropped, and killed, with the test).
    struct Standalone {
        store: RedisStore,
        _server: RedisServer,
    }

    impl Standalone {
        async fn start() -> Self {
            let server = RedisServer::start();
            let store = connect(RedisConfig::standalone(server.url())).await;
            Self {
                store,
                _server: server,
            }
        }
    }

    impl ConformanceStore for Standalone {
        async fn check(&self, checks: &[Check<'_>], now: Micros) -> Verdict {
            decide(&self.store, checks, now).await
        }
    }

    tollgate_conformance::conformance_suite!(Standalone::start().await);
}

mod cluster {
    use super::*;

    struct Cluster {
        store: RedisStore,
        _cluster: RedisCluster,
    }

    impl Cluster {
        async fn start() -> Self {
            let cluster = RedisCluster::start(3, 0);
            let store = connect(RedisConfig::cluster(cluster.seed_urls())).await;
            Self {
                store,
                _cluster: cluster,
            }
        }
    }

    impl ConformanceStore for Cluster {
        async fn check(&self, checks: &[Check<'_>], now: Micros) -> Verdict {
            decide(&self.store, checks, now).await
        }
    }

    tollgate_conformance::conformance_suite!(Cluster::start().await);
}
