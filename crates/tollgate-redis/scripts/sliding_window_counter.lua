-- sliding_window_counter.lua: two fixed windows, the previous weighted by its overlap,
-- ported from tollgate-core's algorithms/sliding_window_counter.rs.
--
-- KEYS and ARGV: run by check.lua for policy i with KEYS[i] = this state key and
-- ARGV[5i-3 .. 5i+1] = 'sliding_window_counter', limit, period (us), burst, cost (see check.lua, which also says
-- why this is a Lua script), and by a single-policy script (check_one.lua) with the quota
-- built in. This file only decides: it returns the new value and the instant it becomes
-- idle, and the driver writes it (SET ... PX) when every policy allows.
--
-- State: one string key, 22 bytes: "C", window_start, current, previous (7 bytes each,
-- big-endian integers). Missing (or another algorithm's value) is all zero. The key expires
-- when both windows have slid out: window_start + 2 * period.
--
-- The test previous * (p - elapsed) + (current + cost) * p <= limit * p is evaluated in
-- integers; Algorithm::validate keeps limit * p <= 2^53, and every comparison is written as
-- a difference of two such products so no intermediate exceeds 2^53.
--
-- Returns allowed, remaining, reset_after, retry_after (-1: never), new value, idle_at.
local function sliding_window_counter(raw, now, limit, p, burst, t, cost)
  local stored_start, current, previous = unpack_state(raw, 67, 3)
  if not stored_start then
    stored_start, current, previous = 0, 0, 0
  end
  if now < stored_start then
    now = stored_start
  end
  local start = now - now % p
  if start ~= stored_start then
    if start == stored_start + p then
      previous, current = current, 0
    else
      previous, current = 0, 0
    end
  end
  local elapsed = now - start
  local weighted = previous * (p - elapsed)
  local budget = limit * p
  -- Whole units left once `c` units of the current window are counted.
  local function remaining(c)
    local left = budget - c * p - weighted
    if left <= 0 then
      return 0
    end
    return floor(left / p)
  end
  local function reset(c)
    if c > 0 then
      return start + 2 * p - now
    elseif previous > 0 then
      return start + p - now
    end
    return 0
  end
  if cost > limit then
    return false, remaining(current), reset(current), -1
  end
  local new_current = current + cost
  if new_current <= limit and weighted <= budget - new_current * p then
    return true, remaining(new_current), reset(new_current), -1,
      pack('>BI7I7I7', 67, start, new_current, previous), start + 2 * p
  end
  -- The earliest elapsed time e at which weight * (p - e) <= room * p.
  local function earliest(weight, room)
    if weight == 0 then
      return 0
    end
    local fits = floor(room * p / weight)
    if fits > p then
      fits = p
    end
    return p - fits
  end
  local at
  if new_current > limit then
    at = start + p + earliest(current, limit - cost)
  else
    at = start + earliest(previous, limit - new_current)
  end
  return false, remaining(current), reset(current), at - now
end
