-- sliding_window_counter.lua: two fixed windows, the previous weighted by its overlap,
-- ported from tollgate-core's algorithms/sliding_window_counter.rs.
--
-- A decision body (the contract is in check_one.lua): check.lua and lease.lua run it as the
-- function sliding_window_counter(raw, now, limit, p, burst, t, cost) for KEYS[i] and the quota in
-- ARGV[5i-3 .. 5i+1] (check.lua says why this is a Lua script); a single-policy script runs
-- it inline, with the quota as constants. It only decides: the driver writes `value`
-- (SET ... PX) when every policy allows.
--
-- State: one string key, 22 bytes: "C", window_start, current, previous (7 bytes each,
-- big-endian integers). Missing (or another algorithm's value) is all zero. The key expires
-- when both windows have slid out: window_start + 2 * period.
--
-- The test previous * (p - elapsed) + (current + cost) * p <= limit * p is evaluated in
-- integers; Algorithm::validate keeps limit * p <= 2^53, and every comparison is written as
-- a difference of two such products so no intermediate exceeds 2^53.
--
local stored, current, previous = 0, 0, 0
if raw and #raw == 22 then
  local tag
  tag, stored, current, previous = struct.unpack('>BI7I7I7', raw)
  if tag ~= 67 then
    stored, current, previous = 0, 0, 0
  end
end
local now = now -- clamped below when the clock went back; the driver keeps its own
if now < stored then
  now = stored
end
local start = now - now % p
if start ~= stored then
  if start == stored + p then
    previous, current = current, 0
  else
    previous, current = 0, 0
  end
end
local weighted = previous * (p - (now - start))
local budget = limit * p
local new_current = current + cost
-- After the decision, `counted` is the current window's count the reply describes.
local counted = current
if cost <= limit and new_current <= limit and weighted <= budget - new_current * p then
  ok, retry, counted = true, -1, new_current
  value, idle_at = struct.pack('>BI7I7I7', 67, start, new_current, previous), start + 2 * p
else
  ok, retry = false, -1
  if cost <= limit then
    -- The earliest instant the request fits: when the window that overflows has slid far
    -- enough, the current one past the next boundary, else the previous one now.
    local weight, room, from = previous, limit - new_current, start
    if new_current > limit then
      weight, room, from = current, limit - cost, start + p
    end
    local at = from
    if weight ~= 0 then
      local fits = math.floor(room * p / weight)
      if fits > p then
        fits = p
      end
      at = from + p - fits
    end
    retry = at - now
  end
end
local left = budget - counted * p - weighted
remaining = 0
if left > 0 then
  remaining = math.floor(left / p)
end
reset = 0
if counted > 0 then
  reset = start + 2 * p - now
elseif previous > 0 then
  reset = start + p - now
end
