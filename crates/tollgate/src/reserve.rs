//! Costs known later (shared/DESIGN.md "Costs known later"): [`Limiter::reserve`] decides a
//! plan like [`Limiter::check`] and returns a [`Reservation`] of what the request holds:
//!
//! - the estimate charged to each policy whose real cost comes later ([`Policy::settles`]),
//!   settled at the real cost by [`Reservation::settle`] (a refund below the estimate, a debt
//!   above it);
//! - one unit of each concurrency policy ([`Policy::is_concurrency`]), held until the
//!   reservation is released or dropped, and renewed meanwhile so that it outlives
//!   `hold_ttl` while this process lives (the store drops the holds of a process that died).
//!
//! Dropping a reservation unsettled settles at the estimate (the charge stands: nothing to
//! do) and releases the holds, so no client escapes a charge by hanging up and no hold of a
//! live process leaks. Settles and releases never wait on the request path: on a shared
//! store they queue and leave in batches (one script call carries up to [`BATCH`] of them,
//! behind the breaker and the timeout); a settle that fails leaves the estimate charged and a
//! release that fails leaves the hold to expire after `hold_ttl`, each counted in
//! `tollgate_settle_errors_total`.

use crate::metrics::SettleError;
use crate::policy::Policy;
use crate::store::Settle;
use crate::Limiter;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tollgate_core::{Charge, ClientKey, Micros};

/// The most settles, releases or renewals one store call carries.
pub const BATCH: usize = 256;

/// Settles that may wait for the store at once; past it a settle is dropped (and counted):
/// its estimate stands, or its hold expires after `hold_ttl`.
const QUEUE: usize = 65_536;

/// How often the renewer looks for holds due for renewal.
const RENEW_TICK: Duration = Duration::from_millis(100);

/// What a request holds after [`Limiter::reserve`] allowed it. See the module docs.
#[must_use = "dropping a reservation settles it at the estimate and releases its holds at once"]
pub struct Reservation {
    limiter: Limiter,
    held: Vec<Held>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.held.iter().map(|h| h.policy.name()).collect();
        f.debug_struct("Reservation").field("held", &names).finish()
    }
}

/// One charge or hold of a reservation.
struct Held {
    client: ClientKey,
    policy: Policy,
    charge: Charge,
    /// Charged on the local fallback (the store had failed), so settled there.
    fallback: bool,
    /// A concurrency hold's id in the renewer's table.
    hold: Option<u64>,
}

impl Reservation {
    /// Whether the request holds nothing to settle or release (no policy of its plan settles
    /// later or limits requests in flight, or none was charged).
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The policies whose charges or holds this reservation has.
    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.held.iter().map(|h| &h.policy)
    }

    /// Settles every policy that settles later at `real` units, and releases every hold.
    pub fn settle(self, real: u64) {
        self.settle_each(|_| Ok(Some(real)));
    }

    /// Settles each policy that settles later ([`Policy::settles`]) at the real cost
    /// `real(policy)` gives, and releases every hold. `Ok(None)`: the estimate stands;
    /// `Err(reason)`: the estimate stands and `tollgate_settle_errors_total{reason}` counts
    /// it (a response without, or with a bad, cost header). A real cost above what the
    /// policy can ever admit is not trusted either (`reason="too_large"`).
    pub fn settle_each(mut self, real: impl Fn(&Policy) -> Result<Option<u64>, SettleError>) {
        let held = std::mem::take(&mut self.held);
        self.limiter.finish(held, &real);
    }

    /// Releases every hold; every charge stands at its estimate.
    pub fn release(self) {
        // Dropping does exactly this.
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        self.limiter.finish(held, &|_| Ok(None));
    }
}

/// A settle, release or renewal waiting for the store.
pub(crate) struct Pending {
    client: ClientKey,
    policy: Policy,
    charge: Charge,
    /// The real cost (a release: any; the units held go), or `None` to renew.
    real: Option<u64>,
}

enum Job {
    Settle(Pending),
    Flush(oneshot::Sender<()>),
}

/// A live hold as the renewer knows it.
struct Live {
    client: ClientKey,
    policy: Policy,
    /// The units held and the store's instant of their bucket (the hold's take or its last
    /// renewal): what the next renewal or the release names.
    charge: Charge,
    /// When the hold was taken or last renewed, on this process's monotonic clock, read
    /// before the store call: when the next renewal is due. Neither the store's clock (a
    /// shared store with clock = store counts holds on its own) nor the limiter's wall clock
    /// (which an operator or NTP may step back, which would stall the renewals) decides it.
    since: tokio::time::Instant,
    fallback: bool,
    /// A renewal of it is in flight.
    renewing: bool,
    /// Released while its renewal was in flight: the renewal's end releases it.
    released: bool,
}

/// The limiter's side of reservations: the queue of settles for a shared store and the
/// table of live holds that the renewer keeps alive.
#[derive(Default)]
pub(crate) struct Reservations {
    queue: OnceLock<mpsc::Sender<Job>>,
    holds: Mutex<HashMap<u64, Live>>,
    next: AtomicU64,
    renewer: OnceLock<()>,
    /// Told when a batch of renewals has ended (and queued the releases that waited on it).
    renewals_ended: tokio::sync::Notify,
}

impl Reservations {
    fn holds(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Limiter {
    /// Decides `plan` like [`Limiter::check`]; when it is allowed, also returns what the
    /// request holds (see [`Reservation`]): settle it with the real cost once the response
    /// is done, or drop it. The estimate of a settling policy is its cost, as for `check`.
    pub async fn reserve(&self, plan: &crate::Plan) -> (crate::LimitResult, Option<Reservation>) {
        // The renewal schedule's start: no later than the store's instant of the holds.
        let since = tokio::time::Instant::now();
        let (result, at) = self.check_timed(plan).await;
        if !result.is_allowed() {
            return (result, None);
        }
        let mut held = Vec::new();
        for (r, (client, at)) in result.results.iter().zip(at) {
            let p = &r.policy;
            if !(p.settles() || p.is_concurrency()) || p.cost() == 0 {
                continue;
            }
            let fallback = match r.outcome {
                crate::Outcome::Allowed => false,
                crate::Outcome::FallbackAllowed => true,
                _ => continue,
            };
            let charge = Charge {
                units: p.cost(),
                at,
            };
            let hold = p
                .is_concurrency()
                .then(|| self.hold(client, p.clone(), charge, since, fallback));
            held.push(Held {
                client,
                policy: p.clone(),
                charge,
                fallback,
                hold,
            });
        }
        let reservation = Reservation {
            limiter: self.clone(),
            held,
        };
        (result, Some(reservation))
    }

    /// Waits until every settle and release queued so far has reached the store (or
    /// failed), a release that waits on its hold's renewal in flight included. For tests and
    /// for a clean shutdown; the request path never waits on them.
    pub async fn flush_settles(&self) {
        let r = &self.inner.reservations;
        // A hold released while its renewal is in flight is released when the renewal ends
        // (`renewed`): until then it is in no queue. A renewal's store call is bounded by
        // the store's timeout, and so is this wait.
        let deferred = async {
            loop {
                let ended = r.renewals_ended.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                if !r.holds().values().any(|l| l.renewing && l.released) {
                    return;
                }
                ended.await;
            }
        };
        let bound = self.inner.timeout.saturating_add(RENEW_TICK);
        let _ = tokio::time::timeout(bound, deferred).await;
        let Some(tx) = r.queue.get() else {
            return;
        };
        let (done, wait) = oneshot::channel();
        if tx.send(Job::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Registers a live hold with the renewer; its id.
    fn hold(
        &self,
        client: ClientKey,
        policy: Policy,
        charge: Charge,
        since: tokio::time::Instant,
        fallback: bool,
    ) -> u64 {
        let r = &self.inner.reservations;
        let id = r.next.fetch_add(1, Ordering::Relaxed);
        policy.inner.stats.hold(charge.units, true);
        r.holds().insert(
            id,
            Live {
                client,
                policy,
                charge,
                since,
                fallback,
                renewing: false,
                released: false,
            },
        );
        self.start_renewer();
        id
    }

    /// Settles and releases what a reservation held.
    fn finish(&self, held: Vec<Held>, real: &dyn Fn(&Policy) -> Result<Option<u64>, SettleError>) {
        for h in held {
            let pending = if let Some(id) = h.hold {
                // The hold as the renewer last moved it; a renewal in flight releases it.
                let mut holds = self.inner.reservations.holds();
                let Some(live) = holds.get_mut(&id) else {
                    continue;
                };
                if live.renewing {
                    live.released = true;
                    continue;
                }
                let Some(live) = holds.remove(&id) else {
                    continue;
                };
                drop(holds);
                Pending {
                    client: live.client,
                    charge: live.charge,
                    real: Some(0),
                    policy: live.policy,
                }
            } else {
                if !h.policy.settles() {
                    continue;
                }
                let cost = match real(&h.policy) {
                    Ok(Some(cost)) => cost,
                    Ok(None) => continue,
                    Err(reason) => {
                        h.policy.inner.stats.settle_error(reason);
                        continue;
                    }
                };
                if cost > h.policy.limit().max_cost() {
                    h.policy.inner.stats.settle_error(SettleError::TooLarge);
                    continue;
                }
                if cost == h.charge.units {
                    continue;
                }
                Pending {
                    client: h.client,
                    policy: h.policy,
                    charge: h.charge,
                    real: Some(cost),
                }
            };
            self.submit(pending, h.fallback);
        }
    }

    /// Applies a settle now (an in-process store) or queues it for the shared store.
    fn submit(&self, p: Pending, fallback: bool) {
        let i = &self.inner;
        let now = i.clock.now();
        if p.real.is_some() && p.policy.is_concurrency() {
            // Released as far as this gateway is concerned: its gauge drops now, not when
            // the store answers (a failed release leaves the hold to expire there).
            p.policy.inner.stats.hold(p.charge.units, false);
        }
        if fallback || !i.store.is_remote() {
            let memory = if fallback {
                Some(&i.fallback)
            } else {
                i.store.memory()
            };
            let applied = memory.map_or(0, |m| {
                let rule = if fallback {
                    p.policy.fallback_rule()
                } else {
                    p.policy.rule()
                };
                m.settle(&p.client, rule, p.charge, p.real, now)
            });
            self.applied(&p, Ok(applied));
            return;
        }
        let Some(tx) = self.settle_queue() else {
            p.policy.inner.stats.settle_error(SettleError::Dropped);
            self.applied(&p, Err(()));
            return;
        };
        if let Err(e) = tx.try_send(Job::Settle(p)) {
            if let Job::Settle(p) = e.into_inner() {
                p.policy.inner.stats.settle_error(SettleError::Dropped);
                self.applied(&p, Err(()));
            }
        }
    }

    /// Counts what a settle did (or that it failed) and keeps the deny cache exact.
    fn applied(&self, p: &Pending, result: Result<u64, ()>) {
        let stats = &p.policy.inner.stats;
        let Some(real) = p.real else {
            return;
        };
        if p.policy.is_concurrency() {
            if let Ok(released) = result {
                stats.holds_expired(p.charge.units.saturating_sub(released));
            }
            return;
        }
        match result {
            Ok(units) if real < p.charge.units => {
                stats.settled(units, 0);
                if units > 0 {
                    // Units went back: a denial remembered for this client may pass sooner.
                    if let Some(cache) = &self.inner.deny_cache {
                        cache.forget(&p.client, p.policy.inner.deny_key);
                    }
                    if let Some(last) = &self.inner.last {
                        last.forget(&p.client, p.policy.inner.deny_key);
                    }
                }
            }
            Ok(units) => stats.settled(0, units),
            Err(()) => {}
        }
    }

    /// The queue to the shared store, its drain task started on first use; `None` outside a
    /// tokio runtime (a reservation dropped by a thread of its own).
    fn settle_queue(&self) -> Option<&mpsc::Sender<Job>> {
        let r = &self.inner.reservations;
        if let Some(tx) = r.queue.get() {
            return Some(tx);
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = mpsc::channel(QUEUE);
        if r.queue.set(tx).is_ok() {
            handle.spawn(drain(Arc::downgrade(&self.inner), rx));
        }
        r.queue.get()
    }

    /// Starts the task that renews live holds (once, inside a tokio runtime).
    fn start_renewer(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.reservations.renewer.set(()).is_err() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        handle.spawn(async move {
            let mut tick = tokio::time::interval(RENEW_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Limiter { inner }.renew_due().await;
            }
        });
    }

    /// Renews the holds whose last renewal is a bucket width (`hold_ttl / 8`) old, by this
    /// process's monotonic clock.
    async fn renew_due(&self) {
        let i = &self.inner;
        let now = i.clock.now();
        let started = tokio::time::Instant::now();
        let due: Vec<(u64, ClientKey, Policy, Charge, bool)> = {
            let mut holds = i.reservations.holds();
            holds
                .iter_mut()
                .filter(|(_, l)| {
                    let w = Duration::from_micros(tollgate_core::algorithms::concurrency::width(
                        l.policy.limit().quota(),
                    ));
                    // A tick early, so that renewals are at most a bucket apart: a bucket
                    // lives 2W + hold_ttl from its start, so the holds of a process that
                    // dies are dropped no sooner than hold_ttl after its death.
                    !l.renewing && started + RENEW_TICK >= l.since + w
                })
                .map(|(&id, l)| {
                    l.renewing = true;
                    (id, l.client, l.policy.clone(), l.charge, l.fallback)
                })
                .collect()
        };
        for chunk in due.chunks(BATCH) {
            let remote: Vec<&(u64, ClientKey, Policy, Charge, bool)> = chunk
                .iter()
                .filter(|d| !d.4 && i.store.is_remote())
                .collect();
            // Per hold: the units still held and the store's instant they are counted at.
            let mut renewed: HashMap<u64, Option<(u64, Micros)>> = HashMap::new();
            for (id, client, p, charge, fallback) in
                chunk.iter().filter(|d| d.4 || !i.store.is_remote())
            {
                let (m, rule) = if *fallback {
                    (Some(&i.fallback), p.fallback_rule())
                } else {
                    (i.store.memory(), p.rule())
                };
                let units = m.map_or(0, |m| m.settle(client, rule, *charge, None, now));
                renewed.insert(*id, Some((units, now)));
            }
            if let Some(first) = remote.first() {
                let items: Vec<Settle<'_>> = remote
                    .iter()
                    .map(|(_, client, p, charge, _)| Settle {
                        client: *client,
                        rule: p.rule(),
                        charge: *charge,
                        real: None,
                    })
                    .collect();
                let result = self
                    .guarded(&first.1, now, i.store.settle(&items, now, i.timeout))
                    .await;
                for (k, d) in remote.iter().enumerate() {
                    let units = result
                        .as_ref()
                        .ok()
                        .and_then(|(units, at)| Some((*units.get(k)?, *at.get(k)?)));
                    if units.is_none() {
                        d.2.inner.stats.settle_error(SettleError::Store);
                    }
                    renewed.insert(d.0, units);
                }
            }
            self.renewed(renewed, started);
        }
    }

    /// Records the renewals' results: each hold moves to the store's instant of its renewal
    /// (with the units still held; its next renewal is due from `started`), is dropped when
    /// none is, or is released when its reservation ended meanwhile.
    fn renewed(&self, renewed: HashMap<u64, Option<(u64, Micros)>>, started: tokio::time::Instant) {
        let mut release = Vec::new();
        {
            let mut holds = self.inner.reservations.holds();
            for (id, units) in renewed {
                let Some(live) = holds.get_mut(&id) else {
                    continue;
                };
                live.renewing = false;
                if let Some((units, at)) = units {
                    let lost = live.charge.units.saturating_sub(units);
                    if lost > 0 {
                        let stats = &live.policy.inner.stats;
                        stats.holds_expired(lost);
                        stats.hold(lost, false);
                    }
                    live.charge = Charge { units, at };
                    live.since = started;
                }
                if live.released || live.charge.units == 0 {
                    if let Some(live) = holds.remove(&id) {
                        if live.charge.units > 0 {
                            release.push((id, live));
                        }
                    }
                }
            }
        }
        for (_, live) in release {
            let fallback = live.fallback;
            self.submit(
                Pending {
                    client: live.client,
                    policy: live.policy,
                    charge: live.charge,
                    real: Some(0),
                },
                fallback,
            );
        }
        // Queued before a flush that waited on them is.
        self.inner.reservations.renewals_ended.notify_waiters();
    }
}

/// Drains the settle queue: up to [`BATCH`] settles per store call, in arrival order.
async fn drain(inner: Weak<crate::Inner>, mut rx: mpsc::Receiver<Job>) {
    let mut batch: Vec<Pending> = Vec::with_capacity(BATCH);
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(job) = rx.recv().await {
        let mut next = Some(job);
        while let Some(job) = next.take() {
            match job {
                Job::Settle(p) => batch.push(p),
                Job::Flush(done) => flushes.push(done),
            }
            if batch.len() < BATCH {
                next = rx.try_recv().ok();
            }
        }
        let Some(inner) = inner.upgrade() else { return };
        let limiter = Limiter { inner };
        if !batch.is_empty() {
            limiter.settle_batch(&batch).await;
            batch.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

impl Limiter {
    /// One store call for a batch of queued settles and releases.
    async fn settle_batch(&self, batch: &[Pending]) {
        let i = &self.inner;
        let now = i.clock.now();
        let items: Vec<Settle<'_>> = batch
            .iter()
            .map(|p| Settle {
                client: p.client,
                rule: p.policy.rule(),
                charge: p.charge,
                real: p.real,
            })
            .collect();
        let Some(first) = batch.first() else {
            return;
        };
        let result = self
            .guarded(&first.client, now, i.store.settle(&items, now, i.timeout))
            .await;
        for (k, p) in batch.iter().enumerate() {
            match result.as_ref().ok().and_then(|(v, _)| v.get(k).copied()) {
                Some(units) => self.applied(p, Ok(units)),
                None => {
                    p.policy.inner.stats.settle_error(SettleError::Store);
                    self.applied(p, Err(()));
                }
            }
        }
    }
}
