//! Leases (`sync = "lease"`): take units from a policy's shared state in one call, spend them
//! locally, give back the unused ones. See `scripts/lease.lua` for the exact semantics.

use crate::error::RedisStoreError;
use tollgate_core::{Limit, Micros};

/// One lease call: give back `give_back` unused units of the previous lease (taken in
/// `give_back_window` for a fixed window), then take up to `want` units if at least `need`
/// are available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The most units to take (0: only give back).
    pub want: u64,
    /// The fewest units worth taking (1..=want; 0 with want = 0).
    pub need: u64,
    /// Unused units of the previous lease.
    pub give_back: u64,
    /// The fixed window the given-back units came from (0 for other algorithms).
    pub give_back_window: Micros,
}

/// What a lease call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Units granted (0 when fewer than `need` were available).
    pub granted: u64,
    /// Units left in the shared state after the grant.
    pub remaining: u64,
    /// Microseconds until the shared state is fresh.
    pub reset_after: Micros,
    /// When nothing was granted: microseconds until `need` units would be available;
    /// `None` when `need` can never be met or nothing was asked.
    pub retry_after: Option<Micros>,
    /// The fixed window the grant belongs to (0 for other algorithms).
    pub window: Micros,
    /// Microseconds until that window ends: a fixed-window lease must not outlive it.
    pub window_end_after: Micros,
}

/// One lease call, owned, as it waits in a lane's queue.
pub(crate) struct LeaseJob {
    pub(crate) key: String,
    pub(crate) limit: Limit,
    pub(crate) request: LeaseRequest,
    pub(crate) now: Micros,
}

pub(crate) fn parse_lease(reply: &redis::Value) -> Result<Lease, RedisStoreError> {
    let redis::Value::Array(items) = reply else {
        return Err(RedisStoreError::protocol(format!(
            "the lease script answered {reply:?}, expected an array"
        )));
    };
    let ints: Vec<i64> = items
        .iter()
        .map(|v| match v {
            redis::Value::Int(i) => Ok(*i),
            other => Err(RedisStoreError::protocol(format!(
                "the lease script answered {other:?}, expected an integer"
            ))),
        })
        .collect::<Result<_, _>>()?;
    let [granted, remaining, reset, retry, window, window_end] = ints[..] else {
        return Err(RedisStoreError::protocol(format!(
            "the lease script answered {} integers, expected 6",
            ints.len()
        )));
    };
    let unsigned = |i: i64| {
        u64::try_from(i).map_err(|_| RedisStoreError::protocol("negative count in lease reply"))
    };
    Ok(Lease {
        granted: unsigned(granted)?,
        remaining: unsigned(remaining)?,
        reset_after: unsigned(reset)?,
        retry_after: u64::try_from(retry).ok(),
        window: unsigned(window)?,
        window_end_after: unsigned(window_end)?,
    })
}
