-- leaky_bucket.lua: leaky bucket as a meter, ported from tollgate-core's
-- algorithms/leaky_bucket.rs.
--
-- A decision body (the contract is in check_one.lua): check.lua and lease.lua run it as the
-- function leaky_bucket(raw, now, limit, p, burst, t, cost) for KEYS[i] and the quota in
-- ARGV[5i-3 .. 5i+1] (check.lua says why this is a Lua script); a single-policy script runs
-- it inline, with the quota as constants. It only decides: the driver writes `value`
-- (SET ... PX) when every policy allows.
--
-- State: one string key, 15 bytes: "L", level (7 bytes), last (7 bytes), big-endian
-- integers: the units in the bucket at `last`, the instant the partial unit being drained
-- started. Missing (or another algorithm's value) is an empty bucket: level 0, last = now.
-- Two integers rather than one for the same reason as the token bucket (the clamp of a clock
-- that went back needs `last`). The key expires when the bucket is empty: last + level * T.
--
-- A missing state is empty at `now` (draining one of last = 0 gives the same), so only a
-- state found is drained: a fresh client's plan skips the division.
local now = now -- clamped below when the clock went back; the driver keeps its own
local level, last = 0, now
if raw and #raw == 15 then
  local tag, found, at = struct.unpack('>BI7I7', raw)
  if tag == 76 then
    level, last = found, at
    if now < last then
      now = last
    end
    -- floor((now - last) / t) by `%`, which Lua does in place (math.floor is a call): exact,
    -- as now >= last and both are whole numbers below 2^53.
    local drained = now - last
    drained = (drained - drained % t) / t
    if drained >= level then
      level, last = 0, now
    else
      level, last = level - drained, last + drained * t
    end
  end
end
local new_level = level + cost
if cost <= burst and new_level <= burst then
  ok, remaining, reset, retry = true, burst - new_level, 0, -1
  idle_at = last + new_level * t
  if new_level > 0 then
    reset = idle_at - now
  end
  value = struct.pack('>BI7I7', 76, new_level, last)
else
  ok, remaining, reset, retry = false, 0, 0, -1
  if burst > level then
    remaining = burst - level
  end
  if level > 0 then
    reset = last + level * t - now
  end
  if cost <= burst then
    retry = last + (new_level - burst) * t - now
  end
end
