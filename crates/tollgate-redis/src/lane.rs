//! Coalesced calls: while a script call is in flight on a lane (a connection; on a Cluster,
//! one hash slot), the plans that arrive wait in its queue and leave together in the next
//! call, one batch script call carrying up to `max_batch` plans (`batch_script.rs`).
//!
//! A plan that finds its lane idle is sent at once by its own caller, with its shape's own
//! script, exactly as with `max_batch = 1`: no hand-off, no added wait. When that call ends
//! and plans have queued behind it, a task is spawned that drains the queue, one batch per
//! call, in arrival order, until it finds the queue empty and marks the lane idle again. A
//! plan whose caller gave up (its `store.timeout` passed) before its batch left is dropped
//! from the queue, so nothing is charged for it.
//!
//! Failures are per plan: a batch that fails or outlives `call_timeout` answers every one of
//! its plans with that error (each caller then applies its own failure policy), and a plan
//! whose arguments the script refuses fails alone.

use crate::batch_script::{batch_script, MAX_BATCH_SHAPES};
use crate::error::RedisStoreError;
use crate::lease::LeaseJob;
use crate::script::lease_batch_script;
use crate::script::{Script, Shape};
use crate::store::RedisStore;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::oneshot;
use tollgate_core::Micros;

/// A call that coalesces: a plan's check or a lease call. A batch holds calls of one kind
/// (a call of the other kind leaves in the next batch), so arrival order holds across both.
// A plan's shape is kept inline (no allocation per plan); a job is moved once, into its queue.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Job {
    Plan(PlanJob),
    Lease(LeaseJob),
}

impl Job {
    fn is_lease(&self) -> bool {
        matches!(self, Job::Lease(_))
    }
}

/// One plan, owned, as it waits in a queue: its keys and costs in rule order, its `now` (for
/// the local clock), its shape and its shape's own script.
pub(crate) struct PlanJob {
    pub(crate) keys: Vec<String>,
    /// In rule order, clamped to the scripts' bound.
    pub(crate) costs: Vec<u64>,
    pub(crate) now: Micros,
    pub(crate) shape: Shape,
    pub(crate) script: Arc<Script>,
}

/// What a plan's caller gets: the element of the reply that is its own (the reply of its
/// shape's script), or its failure.
pub(crate) type Answer = Result<redis::Value, RedisStoreError>;

/// One lane: whether a call is in flight, and the plans waiting for the next.
#[derive(Default)]
pub(crate) struct Lane {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    busy: bool,
    queue: VecDeque<Waiting>,
}

struct Waiting {
    job: Job,
    reply: oneshot::Sender<Answer>,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to `max` queued calls of one kind (plans of at most [`MAX_BATCH_SHAPES`] shapes,
    /// or leases), in arrival order, without those whose callers are gone; none (and the lane
    /// marked idle) when the queue is empty.
    fn take(&self, max: usize) -> (Vec<Waiting>, Vec<Shape>) {
        let mut state = self.lock();
        let mut batch: Vec<Waiting> = Vec::with_capacity(max.min(state.queue.len()));
        let mut shapes: Vec<Shape> = Vec::new();
        while batch.len() < max {
            let Some(next) = state.queue.front() else {
                break;
            };
            if next.reply.is_closed() {
                state.queue.pop_front();
                continue;
            }
            if batch
                .first()
                .is_some_and(|f| f.job.is_lease() != next.job.is_lease())
            {
                break;
            }
            if let Job::Plan(plan) = &next.job {
                if !shapes.contains(&plan.shape) {
                    if shapes.len() == MAX_BATCH_SHAPES {
                        break;
                    }
                    shapes.push(plan.shape);
                }
            }
            if let Some(w) = state.queue.pop_front() {
                batch.push(w);
            }
        }
        if batch.is_empty() {
            state.busy = false;
        }
        (batch, shapes)
    }
}

/// Marks the lane idle when the direct call it guards ends (or its caller gives up), or hands
/// what queued meanwhile to a drain task.
struct Busy<'a> {
    store: &'a RedisStore,
    lane: &'a Arc<Lane>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut state = self.lane.lock();
        if state.queue.is_empty() {
            state.busy = false;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                drop(state);
                rt.spawn(drain(self.store.clone(), Arc::clone(self.lane)));
            }
            // No runtime left (shutting down): the waiting callers get an error.
            Err(_) => {
                state.queue.clear();
                state.busy = false;
            }
        }
    }
}

impl RedisStore {
    /// Runs `job` on `lane`: at once when the lane is idle, else in the next batch.
    pub(crate) async fn submit(&self, lane: &Arc<Lane>, job: Job) -> Answer {
        let waiting = {
            let mut state = lane.lock();
            if state.busy {
                let (tx, rx) = oneshot::channel();
                state.queue.push_back(Waiting { job, reply: tx });
                Err(rx)
            } else {
                state.busy = true;
                Ok(job)
            }
        };
        match waiting {
            Ok(job) => {
                let _busy = Busy { store: self, lane };
                self.run_alone(&job).await.map_err(Into::into)
            }
            Err(rx) => match rx.await {
                Ok(answer) => answer,
                Err(_) => Err(RedisStoreError::dropped()),
            },
        }
    }

    /// One call alone, with its own script.
    async fn run_alone(&self, job: &Job) -> Result<redis::Value, redis::RedisError> {
        match job {
            Job::Plan(plan) => self.run_job(plan).await,
            Job::Lease(lease) => self.run_lease(lease).await,
        }
    }

    /// One batch: the plans' batch script (or, alone, the plan's own), every plan answered.
    async fn run_batch(&self, batch: Vec<Waiting>, shapes: &[Shape]) {
        let timeout = self.call_timeout();
        if let [one] = &batch[..] {
            let answer = match tokio::time::timeout(timeout, self.run_alone(&one.job)).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(RedisStoreError::timed_out(timeout)),
            };
            if let Some(w) = batch.into_iter().next() {
                let _ = w.reply.send(answer);
            }
            return;
        }
        let leases = batch.iter().all(|w| w.job.is_lease());
        let generated = if leases { None } else { batch_script(shapes) };
        let script: Option<&Script> = if leases {
            Some(lease_batch_script())
        } else {
            generated.as_deref()
        };
        let Some(script) = script else {
            // No batch script for this list (past the bound): one call each, in order.
            for w in batch {
                let answer = match tokio::time::timeout(timeout, self.run_alone(&w.job)).await {
                    Ok(r) => r.map_err(Into::into),
                    Err(_) => Err(RedisStoreError::timed_out(timeout)),
                };
                let _ = w.reply.send(answer);
            }
            return;
        };
        let jobs: Vec<&Job> = batch.iter().map(|w| &w.job).collect();
        let call = self.run_script(script, |cmd| {
            if leases {
                self.push_lease_batch_args(cmd, &jobs);
            } else {
                self.push_batch_args(cmd, &jobs, shapes);
            }
        });
        let reply = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(redis::Value::Array(items))) if items.len() == batch.len() => Ok(items),
            Ok(Ok(other)) => Err(RedisStoreError::protocol(format!(
                "the batch script answered {other:?}, expected an array of {}",
                batch.len()
            ))),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(RedisStoreError::timed_out(timeout)),
        };
        match reply {
            Ok(items) => {
                for (w, item) in batch.into_iter().zip(items) {
                    let answer = match item {
                        redis::Value::ServerError(e) => Err(redis::RedisError::from(e).into()),
                        v => Ok(v),
                    };
                    let _ = w.reply.send(answer);
                }
            }
            Err(e) => {
                for w in batch {
                    let _ = w.reply.send(Err(e.duplicate()));
                }
            }
        }
    }

    /// The lease batch script's arguments (see `lease_batch_script`).
    fn push_lease_batch_args(&self, cmd: &mut redis::Cmd, jobs: &[&Job]) {
        let leases: Vec<&LeaseJob> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Lease(l) => Some(l),
                Job::Plan(_) => None,
            })
            .collect();
        cmd.arg(leases.len());
        for l in &leases {
            cmd.arg(&l.key);
        }
        cmd.arg(if self.ttl_floor_ms().is_some() { 10 } else { 9 });
        for l in &leases {
            self.push_lease_args(cmd, l);
        }
    }

    /// The batch script's arguments (see `batch_script.rs`).
    fn push_batch_args(&self, cmd: &mut redis::Cmd, jobs: &[&Job], shapes: &[Shape]) {
        let jobs: Vec<&PlanJob> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Plan(p) => Some(p),
                Job::Lease(_) => None,
            })
            .collect();
        let keys: usize = jobs.iter().map(|j| j.keys.len()).sum();
        cmd.arg(keys);
        for j in &jobs {
            for k in &j.keys {
                cmd.arg(k);
            }
        }
        let local = self.clock() == crate::StoreClock::Local;
        let spec: Vec<u8> = jobs
            .iter()
            .map(|j| {
                let s = shapes.iter().position(|s| *s == j.shape).unwrap_or(0);
                // At most MAX_BATCH_SHAPES (< 16) shapes: the number fits the low bits.
                let mut b = u8::try_from(s + 1).unwrap_or(0);
                if j.costs.iter().any(|&c| c != 1) {
                    b += 16;
                }
                if local {
                    b += 32;
                }
                b
            })
            .collect();
        cmd.arg(spec).arg(self.ttl_floor_ms().unwrap_or(0));
        for j in &jobs {
            if local {
                cmd.arg(j.now);
            }
            if j.costs.iter().any(|&c| c != 1) {
                for c in &j.costs {
                    cmd.arg(*c);
                }
            }
        }
    }
}

/// Drains `lane`: one batch per call until the queue is empty (which marks the lane idle).
async fn drain(store: RedisStore, lane: Arc<Lane>) {
    loop {
        let (batch, shapes) = lane.take(store.max_batch());
        if batch.is_empty() {
            return;
        }
        store.run_batch(batch, &shapes).await;
    }
}
