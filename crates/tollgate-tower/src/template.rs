//! Response heads cloned from templates, kept per worker thread.
//!
//! Most answers of a gateway carry the same headers but for one or two values: decision
//! mode's 200 (`Content-Type`, the one advertised policy's `RateLimit-Policy` item, a
//! `RateLimit` of its own) and a refused request's 429 (the same with `Retry-After`). Written
//! header by header, each is a run of inserts into a new map (each name hashed, the map grown
//! on the first, each value checked byte by byte). A map cloned from a template whose varying
//! values are placeholders, replaced in place, costs less (callgrind figures in
//! docs/benchmarks.md). A 429's template also keeps its body up to the one number that
//! varies.
//!
//! A [`Templates`] keeps a few templates, keyed by the address of the policy's item (the same
//! bytes for every result of one policy, see `tollgate::headers::ratelimit_policy_item`). A
//! template keeps its item, so the address cannot be reused by another policy's while it is
//! kept. A policy replaced by a reload simply stops being asked for; its template goes when
//! another takes its place. Each kind of answer keeps its own `Templates` in a thread-local.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use std::cell::RefCell;
use std::thread::LocalKey;
use tollgate::LimitResult;

/// Templates per thread and kind of answer: the policies a gateway's requests advertise are
/// few, and a miss only costs the inserts it would have cost anyway (plus the template's
/// making).
pub const SLOTS: usize = 8;

struct Template<T> {
    /// The policy's `RateLimit-Policy` item, kept (its address is the key).
    item: Bytes,
    kept: T,
}

/// The templates of one kind of answer (see the module docs): a head, or whatever else the
/// answer keeps per policy (a 429 keeps its body too).
pub struct Templates<T = HeaderMap> {
    slots: [Option<Template<T>>; SLOTS],
}

impl<T> Default for Templates<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Templates<T> {
    /// No template yet.
    pub const fn new() -> Self {
        Self {
            slots: [const { None }; SLOTS],
        }
    }

    /// The template of the policy whose item is `item`, made by `make` when this thread keeps
    /// none for it (or another policy's took its slot). `None` when `make` fails.
    pub fn get(&mut self, item: Bytes, make: impl FnOnce(&Bytes) -> Option<T>) -> Option<&T> {
        let slot = &mut self.slots[(item.as_ptr() as usize >> 4) % SLOTS];
        let kept = matches!(
            slot,
            Some(t) if t.item.as_ptr() == item.as_ptr() && t.item.len() == item.len()
        );
        if !kept {
            let made = make(&item)?;
            *slot = Some(Template { item, kept: made });
        }
        slot.as_ref().map(|t| &t.kept)
    }
}

/// What `read` takes from the template of `result`'s one advertised policy (from this
/// thread's `templates`, made by `make` when missing), and `result`'s `RateLimit` value to put
/// in it; `None` when the answer does not advertise exactly one policy with a decision, when
/// `read` declines, or when this thread's templates are in use or gone: then the caller writes
/// the answer as usual.
pub fn for_result<T, R>(
    templates: &'static LocalKey<RefCell<Templates<T>>>,
    result: &LimitResult,
    make: impl FnOnce(&Bytes) -> Option<T>,
    read: impl FnOnce(&T) -> Option<R>,
) -> Option<(R, HeaderValue)> {
    let item = tollgate::headers::ratelimit_policy_item(result)?;
    let value = HeaderValue::from_maybe_shared(tollgate::headers::ratelimit_value(result)?).ok()?;
    let read = templates
        .try_with(|t| read(t.try_borrow_mut().ok()?.get(item, make)?))
        .ok()
        .flatten()?;
    Some((read, value))
}

/// Puts `value` in place of the placeholder at `index` of `head` (its entries are in insertion
/// order); `None`, changing nothing, when the entry there is not `name`.
pub fn fill(
    head: &mut HeaderMap,
    index: usize,
    name: &HeaderName,
    value: HeaderValue,
) -> Option<()> {
    let (at_name, at) = head.iter_mut().nth(index)?;
    // Always so for a template written with the placeholder there; checked, as it costs one
    // comparison.
    if at_name != name {
        return None;
    }
    *at = value;
    Some(())
}
