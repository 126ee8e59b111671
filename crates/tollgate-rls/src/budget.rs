//! A bound on the calls in progress, per peer address and in all, across every connection of
//! a listener.
//!
//! HTTP/2 bounds the streams of one connection (`max_concurrent_streams`), but a call's
//! memory lives until its answer has left, and a peer that advertises a zero flow-control
//! window never lets an answer's body leave: its streams stay open for as long as the
//! connection does. Each call therefore holds a place from the moment it arrives until its
//! response body is dropped (sent, reset, or the connection gone): the body
//! ([`crate::wire::answer::Answer`]) owns the place. A call past its address's bound, or past
//! the listener's, is answered at once with `RESOURCE_EXHAUSTED` in a trailers-only
//! response: headers only, which flow control does not hold back, so the refusal costs no
//! memory that outlives it. As with connections, the last eighth of the listener's places
//! are kept for addresses holding none, so one address (or a few) cannot starve the others.

use std::sync::Arc;
use tollgate::places::Places;
use tonic::Status;

/// The most calls in progress from one address, over all its connections.
pub const MAX_CALLS_PER_ADDRESS: usize = 1024;
/// The most calls in progress on one listener.
pub const MAX_CALLS: usize = 16_384;

/// The places of one listener's calls: `per_address` for one address, `total` in all.
pub(crate) fn places(per_address: usize, total: usize) -> Arc<Places> {
    Places::new(total, per_address)
}

/// The answer to a call past its address's bound or the listener's.
pub(crate) fn refusal() -> Status {
    Status::resource_exhausted(
        "too many calls in progress from this address; retry when some have finished",
    )
}
