//! The rate limit service a listener serves, swapped whole on a reload of the rules while
//! calls keep arriving: a call is decided from start to end by the service current when it
//! started, never half by the old rules and half by the new.

use crate::service::RlsService;
use std::sync::Arc;

/// The rate limit service a listener serves, replaceable while it serves (a reload of the
/// rules): each call is decided whole by the service current when it started. Cheap to clone;
/// clones share the current service.
#[derive(Clone)]
pub struct LiveRls {
    current: Arc<arc_swap::ArcSwap<RlsService>>,
}

impl LiveRls {
    /// Serves `service` until it is replaced.
    pub fn new(service: RlsService) -> Self {
        Self {
            current: Arc::new(arc_swap::ArcSwap::from_pointee(service)),
        }
    }

    /// Serves `service` from the next call on; calls in flight finish with the old one.
    pub fn replace(&self, mut service: RlsService) {
        service.keep_metrics_of(&self.current.load());
        self.current.store(Arc::new(service));
    }

    /// The service serving now.
    pub fn current(&self) -> Arc<RlsService> {
        self.current.load_full()
    }
}

impl From<RlsService> for LiveRls {
    fn from(service: RlsService) -> Self {
        Self::new(service)
    }
}
