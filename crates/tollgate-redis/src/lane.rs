//! Coalesced calls: while a script call is in flight on a lane (a connection; on a Cluster,
//! one node, or one hash slot where the node is not known), the plans that arrive wait in its queue and leave together in the next
//! call, one batch script call carrying up to `max_batch` plans (`batch_script.rs`). This
//! module is the queue; the calls it feeds (`enqueue`, the drain task) are in `store.rs`, so
//! the store and its lanes import no circle.
//!
//! A plan that finds its lane idle is sent at once by its own caller, with its shape's own
//! script, exactly as with `max_batch = 1`: no hand-off, no added wait. When that call ends
//! and plans have queued behind it, a task is spawned that drains the queue in arrival order,
//! each round taking what waits (up to a few batch calls of `max_batch` plans, written
//! together), until it finds the queue empty and marks the lane idle again. A
//! plan whose caller gave up, or whose deadline (`call_timeout` after its call began)
//! passed, before its batch left is dropped from the queue, so nothing is charged for it.
//!
//! Failures are per plan: a batch that fails or outlives the earliest deadline of its plans
//! answers every one of them with that error (each caller then applies its own failure
//! policy), and a plan whose arguments the script refuses fails alone.

use crate::batch_script::{script_holds, MAX_BATCH_FORMS};
use crate::direct::Direct;
use crate::error::RedisStoreError;
use crate::keys::Keys;
use crate::lease::LeaseJob;
use crate::script::{Form, Quotas, Script};
use smallvec::SmallVec;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::oneshot;
use tollgate_core::Micros;

/// A call that coalesces: a plan's check or a lease call. A batch holds calls of one kind
/// (a call of the other kind leaves in the next batch), so arrival order holds across both.
// A plan's shape is boxed (see `RedisStore::run_plan`), so a job is about the size of a lease.
pub(crate) enum Job {
    Plan(PlanJob),
    Lease(LeaseJob),
}

impl Job {
    pub(crate) fn is_lease(&self) -> bool {
        matches!(self, Job::Lease(_))
    }
}

/// One plan, owned, as it waits in a queue: its keys and costs in rule order, its `now` (for
/// the local clock), its form and packed quotas, and its form's own script.
pub(crate) struct PlanJob {
    pub(crate) keys: Keys,
    /// In rule order, clamped to the scripts' bound.
    pub(crate) costs: SmallVec<[u64; 2]>,
    pub(crate) now: Micros,
    /// Which script: the batch script's branch for it.
    pub(crate) form: Form,
    /// Its quotas, packed once (the script's first argument).
    pub(crate) quotas: Quotas,
    pub(crate) script: Arc<Script>,
}

/// Room for a script call's arguments: how many, and about how many bytes (a guess on the
/// large side; a call that needs more grows its command as usual).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    pub(crate) args: usize,
    pub(crate) bytes: usize,
}

impl Room {
    /// A call of a few short arguments.
    pub(crate) const SMALL: Room = Room {
        args: 8,
        bytes: 256,
    };

    /// A lease call: its key and ten numbers.
    pub(crate) fn lease(job: &LeaseJob) -> Room {
        Room {
            args: 12,
            bytes: job.key.len() + 12 * 20,
        }
    }

    /// Both.
    pub(crate) fn and(self, other: Room) -> Room {
        Room {
            args: self.args.saturating_add(other.args),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }
}

impl PlanJob {
    /// Room for the plan's arguments, alone or in a batch: its keys, its quotas, its costs,
    /// its instant and a form byte.
    pub(crate) fn room(&self) -> Room {
        Room {
            args: 2 * self.keys.len() + 4,
            bytes: self.keys.bytes()
                + crate::script::constants_len(self.keys.len())
                + 20 * self.keys.len()
                + 48,
        }
    }
}

/// What a plan's caller gets: the element of the reply that is its own (the reply of its
/// shape's script), or its failure.
pub(crate) type Answer = Result<redis::Value, RedisStoreError>;

/// One lane: whether a call is in flight, and the plans waiting for the next.
#[derive(Default)]
pub(crate) struct Lane {
    pub(crate) state: Mutex<State>,
    /// A Cluster node's lane: its calls are of several slots, and a batch of them runs an
    /// across-slots batch script (`batch_script.rs`, or the lease batch's variant).
    pub(crate) across_slots: bool,
    /// A Cluster node's own connection (`direct.rs`), where its calls go; `None` where they
    /// go on the store's other connections.
    pub(crate) node: Option<NodeConn>,
    /// The SHAs of the scripts this lane's calls have run on its server: a call of any other
    /// script is sent behind a SCRIPT LOAD of it, and a round with such a call goes call after
    /// call, so that no call of a round is answered NOSCRIPT and run again after the round's
    /// later calls, out of arrival order. Forgotten when a call is answered NOSCRIPT anyway (a
    /// restart, a flush, a failover); after a load, only those the server says it still has
    /// (SCRIPT EXISTS, written with the load) are kept ([`Lane::keep_run`]).
    pub(crate) loaded: Mutex<HashSet<String>>,
}

/// The store's own connection to one Cluster node, and the address it was made for.
pub(crate) struct NodeConn {
    pub(crate) addr: (String, u16),
    pub(crate) direct: Arc<Direct>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) busy: bool,
    pub(crate) queue: VecDeque<Waiting>,
}

/// The plan forms a store's batches name, in one order (see [`take_one`]): a batch whose
/// plans are all of these forms runs the one batch script generated for the whole list,
/// whichever of them it holds. Grows as forms arrive, up to what one script holds
/// ([`script_holds`]), and never shrinks. One list for all of a store's lanes, so that every
/// lane (each Cluster node, each slot whose node is not known) grows the same lists and
/// shares their scripts: at most fifteen lists a store, where a list a lane, each grown in
/// its own arrival order, could make fifteen a lane.
pub(crate) type Forms = Mutex<Vec<Form>>;

/// Whether `form` is in a store's forms (kept in their order), added if it was not and one
/// batch script still holds them all with it ([`script_holds`]).
fn listed(forms: &mut Vec<Form>, form: &Form) -> bool {
    let Err(at) = forms.binary_search(form) else {
        return true;
    };
    let rules = forms.iter().map(|f| f.rules().len()).sum::<usize>() + form.rules().len();
    if !script_holds(forms.len() + 1, rules) {
        return false;
    }
    forms.insert(at, form.clone());
    true
}

pub(crate) struct Waiting {
    pub(crate) job: Job,
    pub(crate) reply: oneshot::Sender<Answer>,
    /// When the plan's caller stops waiting (`call_timeout` after its call began): a plan
    /// still queued then is answered with a timeout and never sent, and a batch's call is
    /// bounded by the earliest deadline of its plans.
    pub(crate) deadline: tokio::time::Instant,
}

impl Lane {
    /// A Cluster node's lane (see [`Lane::across_slots`]), with its own connection or none.
    pub(crate) fn across_slots(node: Option<NodeConn>) -> Self {
        Self {
            state: Mutex::default(),
            across_slots: true,
            node,
            loaded: Mutex::default(),
        }
    }

    /// The SHAs of the scripts calls written together have run on this lane's server (see
    /// [`Lane::loaded`]), held for as long as the guard lives: one lock for a round's calls.
    pub(crate) fn scripts_run(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that `shas` have run on this lane's server.
    pub(crate) fn note_run<'a>(&self, shas: impl Iterator<Item = &'a str>) {
        let mut loaded = self.scripts_run();
        for sha in shas {
            if !loaded.contains(sha) {
                loaded.insert(sha.to_string());
            }
        }
    }

    /// Forgets every script noted: the server answered that it has one no more.
    pub(crate) fn forget_run(&self) {
        self.scripts_run().clear();
    }

    /// Keeps, of the scripts noted, only those `present` (what the server said it has, just
    /// after a call that loaded one), and notes those.
    pub(crate) fn keep_run(&self, present: impl Iterator<Item = String>) {
        let mut loaded = self.scripts_run();
        loaded.clear();
        loaded.extend(present);
    }

    /// The address of the node's own connection (see [`Lane::node`]).
    pub(crate) fn node_addr(&self) -> Option<&(String, u16)> {
        self.node.as_ref().map(|n| &n.addr)
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Batches off the queue, one after another (so in arrival order), for calls that leave
    /// together on one connection, up to `rounds` x `max` plans in all; none (and the lane
    /// marked idle) when the queue is empty. Each batch holds up to `max` queued calls of one
    /// kind (plans of the store's `forms`, or of at most [`MAX_BATCH_FORMS`] others, or leases;
    /// see [`take_one`]), in arrival order, without
    /// those whose callers are gone; those past their deadline are answered `timed_out`
    /// (`call_timeout`) and not sent. A queue longer than one batch leaves whole (up to that
    /// bound) rather than one batch a round trip, which would hold a lane to `max` plans a
    /// round trip however many wait and however far the server is; the bound counts plans,
    /// not batches, since plans of many forms make short batches.
    pub(crate) fn take_calls(
        &self,
        max: usize,
        rounds: usize,
        call_timeout: std::time::Duration,
        forms: &Forms,
    ) -> Vec<(Vec<Waiting>, Vec<Form>)> {
        let now = tokio::time::Instant::now();
        let mut state = self.lock();
        // Always after the lane's state, never before: no other lock order exists.
        let mut forms = forms.lock().unwrap_or_else(PoisonError::into_inner);
        let mut taken = Vec::new();
        let mut left = max.saturating_mul(rounds);
        while left > 0 {
            let next = take_one(&mut state, &mut forms, max.min(left), now, call_timeout);
            if next.0.is_empty() {
                break;
            }
            left -= next.0.len();
            taken.push(next);
        }
        if taken.is_empty() {
            state.busy = false;
        }
        taken
    }
}

/// One batch off the front of `state`'s queue (see [`Lane::take_calls`]) and the list of
/// forms its script is generated for; the lane's busy flag is its caller's to change.
///
/// A batch of plans whose forms are all the store's (`forms`, see [`Forms`], which takes each
/// new form while one script still holds them all) names the whole list: every batch of a
/// store whose clients choose among a few policies runs one script, whatever mix of forms it
/// holds, where a list of each batch's own forms made a script for each set of them (385 sets
/// of up to four of ten forms), each batch stopped at four forms, and every script kept
/// added to the Lua heap that Redis's garbage collection walks on every call. Measured on ten
/// two-rule forms (docs/benchmarks.md, "One script for a store's forms"): script calls a
/// request 0.26 to 0.044, Redis CPU a decision 10.6 to 8.2 µs (`max_batch = 1`: 9.8).
/// A plan of a form the full list cannot take ends the batch before it, or, first in its
/// batch, makes a batch of its own forms as before: at most [`MAX_BATCH_FORMS`] of them, in
/// one order.
fn take_one(
    state: &mut State,
    forms: &mut Vec<Form>,
    max: usize,
    now: tokio::time::Instant,
    call_timeout: std::time::Duration,
) -> (Vec<Waiting>, Vec<Form>) {
    let mut batch: Vec<Waiting> = Vec::with_capacity(max.min(state.queue.len()));
    let mut shapes: Vec<Form> = Vec::new();
    // Whether every plan taken so far is of the store's forms; a batch that starts with a
    // plan of a form they cannot take (the list is full) is of its own forms instead, at most
    // MAX_BATCH_FORMS of them.
    let mut known = true;
    let mut plans = false;
    while batch.len() < max {
        let Some(next) = state.queue.front() else {
            break;
        };
        if next.reply.is_closed() {
            state.queue.pop_front();
            continue;
        }
        if next.deadline <= now {
            if let Some(late) = state.queue.pop_front() {
                let _ = late
                    .reply
                    .send(Err(RedisStoreError::timed_out(call_timeout)));
            }
            continue;
        }
        if batch
            .first()
            .is_some_and(|f| f.job.is_lease() != next.job.is_lease())
        {
            break;
        }
        if let Job::Plan(plan) = &next.job {
            let form = &plan.form;
            let listed = known && listed(forms, form);
            if known && !listed && plans {
                // The plans before it leave with the list's script; it starts the next batch.
                break;
            }
            known = listed;
            if !known && !shapes.contains(form) {
                if shapes.len() == MAX_BATCH_FORMS {
                    break;
                }
                shapes.push(form.clone());
            }
            plans = true;
        }
        if let Some(w) = state.queue.pop_front() {
            batch.push(w);
        }
    }
    if plans && known {
        // The store's whole list, whichever of its forms this batch holds: one script for
        // every batch of a store whose clients choose among up to MAX_SCRIPT_FORMS forms,
        // instead of one for each set of them (385 sets of up to four of ten forms), each
        // kept by Redis, whose Lua heap every call's garbage collection then walks.
        return (batch, forms.clone());
    }
    // One order for a set of forms, whatever order its plans came in: the batch script is
    // generated for the list (each plan names its form by its place in it), so every order of
    // the same forms shares one script, and a client that chooses among n forms makes at most
    // the sets of up to four of them (56 for six forms), not their orderings (516): fewer
    // scripts to generate, load and keep, and fewer batches past the bound on them.
    shapes.sort_unstable();
    (batch, shapes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch_script::MAX_SCRIPT_FORMS;
    use crate::script::plan_script;
    use std::time::Duration;
    use tollgate_core::{Algorithm, Limit, Mode, Quota};

    /// A form of `n` rules: the first of algorithm `a`, the others of `b`, all enforced.
    fn form(n: usize, a: usize, b: usize) -> Form {
        let rules = (0..n).map(|i| {
            let k = if i == 0 { a } else { b };
            (Algorithm::ALL[k % Algorithm::ALL.len()], Mode::Enforce)
        });
        Form::new(rules).expect("form")
    }

    /// A queue of plans of these forms (their callers kept waiting in `callers`).
    fn queue(forms: &[Form], callers: &mut Vec<oneshot::Receiver<Answer>>) -> VecDeque<Waiting> {
        let quota = Quota::new(10, Duration::from_secs(60)).expect("quota");
        forms
            .iter()
            .map(|f| {
                let limits: Vec<Limit> = f
                    .rules()
                    .iter()
                    .map(|&(a, _)| Limit::new(a, quota).expect("limit"))
                    .collect();
                let (reply, caller) = oneshot::channel();
                callers.push(caller);
                Waiting {
                    job: Job::Plan(PlanJob {
                        keys: (0..f.rules().len()).map(|i| format!("k{i}")).collect(),
                        costs: f.rules().iter().map(|_| 1).collect(),
                        now: 0,
                        form: f.clone(),
                        quotas: Quotas::pack(limits.iter(), false).0,
                        script: plan_script(f).expect("script"),
                    }),
                    reply,
                    deadline: tokio::time::Instant::now() + Duration::from_secs(60),
                }
            })
            .collect()
    }

    fn take(state: &mut State, forms: &mut Vec<Form>, max: usize) -> (usize, Vec<Form>) {
        let (batch, list) = take_one(
            state,
            forms,
            max,
            tokio::time::Instant::now(),
            Duration::from_secs(1),
        );
        (batch.len(), list)
    }

    /// Batches of the store's forms name its whole list, in one order, whatever forms each
    /// holds and on whichever lane: two lanes grow one list, and more than four forms leave
    /// in one batch.
    #[test]
    fn batches_of_the_stores_forms_name_its_whole_list() {
        let mut callers = Vec::new();
        let mut forms = Vec::new();
        let (a, b, c) = (form(2, 0, 1), form(2, 4, 1), form(2, 2, 3));
        let mut one = State {
            queue: queue(&[b.clone(), a.clone()], &mut callers),
            ..State::default()
        };
        let mut two = State {
            queue: queue(&[c.clone(), a.clone()], &mut callers),
            ..State::default()
        };
        let mut sorted = vec![a.clone(), b.clone()];
        sorted.sort();
        assert_eq!(take(&mut one, &mut forms, 64), (2, sorted));
        let mut all = vec![a.clone(), b.clone(), c.clone()];
        all.sort();
        assert_eq!(take(&mut two, &mut forms, 64), (2, all.clone()));
        // A lane's next batch of one form names the list both grew.
        one.queue = queue(std::slice::from_ref(&a), &mut callers);
        assert_eq!(take(&mut one, &mut forms, 64), (1, all));

        // Ten forms, twenty plans: one batch (four forms a batch of its own forms).
        let ten: Vec<Form> = (0..10).map(|i| form(2, i / 5, i)).collect();
        let mut state = State {
            queue: queue(&[ten.clone(), ten.clone()].concat(), &mut callers),
            ..State::default()
        };
        let mut forms = Vec::new();
        let (n, list) = take(&mut state, &mut forms, 64);
        assert_eq!((n, list.len()), (20, 10));
        assert!(list.windows(2).all(|w| w[0] < w[1]), "one order: {list:?}");
        assert!(state.queue.is_empty());
    }

    /// The list holds at most fifteen forms of at most 64 rules; a plan of a form past it ends
    /// the batch of listed forms before it, and first in a batch makes a batch of its own
    /// forms (at most four, in one order), listed ones among them.
    #[test]
    fn a_plan_past_the_full_list_ends_the_batch_or_starts_one_of_its_own_forms() {
        let mut forms = Vec::new();
        let two_rules: Vec<Form> = (0..25).map(|i| form(2, i / 5, i)).collect();
        for f in &two_rules[..MAX_SCRIPT_FORMS] {
            assert!(listed(&mut forms, f));
        }
        assert!(
            !listed(&mut forms, &two_rules[MAX_SCRIPT_FORMS]),
            "a 16th form"
        );
        let mut big = Vec::new();
        for f in &[form(16, 0, 1), form(16, 1, 2), form(16, 2, 3)] {
            assert!(listed(&mut big, f));
        }
        assert!(listed(&mut big, &form(15, 3, 4)), "63 rules");
        assert!(listed(&mut big, &form(1, 4, 4)), "64 rules");
        assert!(!listed(&mut big, &form(1, 0, 0)), "65 rules");

        let (listed, others) = (&two_rules[0], &two_rules[15..20]);
        let mut callers = Vec::new();
        let mut plans = vec![listed.clone()];
        plans.extend(others.iter().cloned());
        plans.push(listed.clone());
        let mut state = State {
            queue: queue(&plans, &mut callers),
            ..State::default()
        };
        // The listed plan leaves alone, with the list's script.
        assert_eq!(take(&mut state, &mut forms, 64), (1, forms.clone()));
        // Then four forms past the list: a batch of its own forms, in one order.
        let (n, list) = take(&mut state, &mut forms, 64);
        let mut own = others[..4].to_vec();
        own.sort();
        assert_eq!((n, list), (4, own));
        // Then the fifth, and the listed plan with it: its own forms again.
        let (n, list) = take(&mut state, &mut forms, 64);
        let mut own = vec![others[4].clone(), listed.clone()];
        own.sort();
        assert_eq!((n, list), (2, own));
        assert_eq!(forms.len(), MAX_SCRIPT_FORMS, "the list changed");
    }
}
