-- sliding_window_log.lua: the exact sliding window, ported from tollgate-core's
-- algorithms/sliding_window_log.rs.
--
-- A decision body (the contract is in check_one.lua): check.lua and lease.lua run it as the
-- function sliding_window_log(raw, now, limit, p, burst, t, cost) for KEYS[i] and the quota in
-- ARGV[5i-3 .. 5i+1] (check.lua says why this is a Lua script); a single-policy script runs
-- it inline, with the quota as constants. It only decides: the driver writes `value`
-- (SET ... PX) when every policy allows.
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
-- period after its newest record. A value written in place (sliding_window_log_in_place.lua,
-- for a log longer than script.rs's IN_PLACE_LOG_LIMIT, which a reload may shorten) may begin
-- with records at or before newest - p: they fall before every horizon, and a commit drops
-- them with the other expired records.
--
-- Record i (1-based) starts at byte 9 + (i - 1) * 14: its `at` there (i * 14 - 5) and its
-- `cum` 7 bytes later (i * 14 + 2, which for i = 0 is `base`). Both binary searches are
-- written out: a helper would be a closure built on every call.
local unpack_bin = struct.unpack
local n = 0
if raw and #raw >= 8 and (#raw - 8) % 14 == 0 and string.byte(raw, 1) == 83 then
  n = (#raw - 8) / 14
end
local newest, before, total = 0, 0, 0
if n > 0 then
  newest, total = unpack_bin('>I7I7', raw, n * 14 - 5)
end
local now = now -- clamped below when the clock went back; the driver keeps its own
if now < newest then
  now = newest
end
-- Records at or before the horizon are out of the window (now - p, now]: `first` is the
-- first live one (n + 1 when none is).
local first = 1
if n > 0 then
  if now >= p then
    local horizon, lo, hi = now - p, 1, n
    while lo <= hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      if unpack_bin('>I7', raw, mid * 14 - 5) > horizon then
        hi = mid - 1
      else
        lo = mid + 1
      end
    end
    first = lo
  end
  before = unpack_bin('>I7', raw, first * 14 - 12)
end
local in_window = total - before
ok, remaining, reset, retry = false, 0, 0, -1
if limit > in_window then
  remaining = limit - in_window
end
if in_window > 0 then
  reset = newest + p - now
end
if cost <= limit and in_window + cost <= limit then
  ok, remaining = true, limit - in_window - cost
  if cost > 0 then
    reset, idle_at = p, now + p
    if first > n then
      value = struct.pack('>BI7I7I7', 83, 0, now, cost)
    else
      -- The live records, without the newest when this request shares its instant (the new
      -- record replaces it), then the new record.
      local last = n
      if newest == now then
        last = n - 1
      end
      value = struct.pack('>BI7', 83, before) .. string.sub(raw, first * 14 - 5, last * 14 + 8) ..
        struct.pack('>I7I7', now, total + cost)
    end
  end
elseif cost <= limit then
  -- Drop the oldest live records until the request fits: the last one dropped decides.
  local excess, lo, hi = in_window + cost - limit, first, n
  while lo <= hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    if unpack_bin('>I7', raw, mid * 14 + 2) - before >= excess then
      hi = mid - 1
    else
      lo = mid + 1
    end
  end
  retry = unpack_bin('>I7', raw, lo * 14 - 5) + p - now
end
