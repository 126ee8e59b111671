-- sliding_window_log.lua: the exact sliding window, ported from tollgate-core's
-- algorithms/sliding_window_log.rs.
--
-- KEYS and ARGV: run by check.lua for policy i with KEYS[i] = this state key and
-- ARGV[5i-3 .. 5i+1] = 'sliding_window_log', limit, period (us), burst, cost (see check.lua, which also says
-- why this is a Lua script), and by a single-policy script (check_one.lua) with the quota
-- built in. This file only decides: it returns the new value and the instant it becomes
-- idle, and the driver writes it (SET ... PX) when every policy allows.
--
-- State: one string key: "S", base (7 bytes), then one 14-byte record per admission instant:
-- at (7 bytes), cum (7 bytes), big-endian integers, `at` strictly increasing. `cum` is the
-- running total of admitted units up to and including the record, and `base` the total
-- before the first record, so the units in any run of records is a difference of two totals:
-- the live window is found by binary search and summed in O(1), and the oldest record that
-- must slide out for a retry is found by a second binary search. Only a commit is O(n): it
-- rewrites the string without the expired prefix (a memcpy inside Redis, not a Lua loop).
--
-- Memory is O(limit): up to one record per admitted unit still in the window (14 bytes each;
-- requests at the same microsecond share one). That is why the core caps its limit at
-- MAX_LOG_LIMIT. Missing (or another algorithm's value) is an empty log. The key expires one
-- period after its newest record.
--
-- Record i (1-based) starts at byte 9 + (i - 1) * 14: `at` there, `cum` 7 bytes later.
local function log_at(raw, i)
  return (unpack_bin('>I7', raw, i * 14 - 5))
end

local function log_cum(raw, i)
  if i == 0 then
    return (unpack_bin('>I7', raw, 2))
  end
  return (unpack_bin('>I7', raw, i * 14 + 2))
end

-- The smallest i in [lo, hi + 1] for which pred(i) holds, pred being monotonic.
local function first_where(lo, hi, pred)
  while lo <= hi do
    local mid = floor((lo + hi) / 2)
    if pred(mid) then
      hi = mid - 1
    else
      lo = mid + 1
    end
  end
  return lo
end

-- Returns allowed, remaining, reset_after, retry_after (-1: never), new value, idle_at.
local function sliding_window_log(raw, now, limit, p, burst, t, cost)
  local n = 0
  if raw and #raw >= 8 and (#raw - 8) % 14 == 0 and byte(raw, 1) == 83 then
    n = (#raw - 8) / 14
  else
    raw = pack('>BI7', 83, 0)
  end
  local newest = 0
  if n > 0 then
    newest = log_at(raw, n)
  end
  if now < newest then
    now = newest
  end
  -- Records at or before the horizon are out of the window (now - p, now].
  local first = 1
  if now >= p then
    local horizon = now - p
    first = first_where(1, n, function(i)
      return log_at(raw, i) > horizon
    end)
  end
  local before = log_cum(raw, first - 1)
  local total = log_cum(raw, n)
  local in_window = total - before
  local remaining, reset = 0, 0
  if limit > in_window then
    remaining = limit - in_window
  end
  if in_window > 0 then
    reset = newest + p - now
  end
  if cost > limit then
    return false, remaining, reset, -1
  end
  if in_window + cost <= limit then
    if cost == 0 then
      return true, limit - in_window, reset, -1
    end
    local kept
    if first > n then
      kept, total = pack('>BI7', 83, 0), 0
    else
      kept = pack('>BI7', 83, before) .. string.sub(raw, 9 + (first - 1) * 14, 8 + (n - 1) * 14)
      if newest ~= now then
        kept = kept .. string.sub(raw, 9 + (n - 1) * 14)
      end
    end
    return true, limit - in_window - cost, p, -1, kept .. pack('>I7I7', now, total + cost), now + p
  end
  -- Drop the oldest live records until the request fits: the last one dropped decides.
  local excess = in_window + cost - limit
  local j = first_where(first, n, function(i)
    return log_cum(raw, i) - before >= excess
  end)
  return false, remaining, reset, log_at(raw, j) + p - now
end
