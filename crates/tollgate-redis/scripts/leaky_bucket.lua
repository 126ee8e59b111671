-- leaky_bucket.lua: leaky bucket as a meter, ported from tollgate-core's
-- algorithms/leaky_bucket.rs.
--
-- KEYS and ARGV: run by check.lua for policy i with KEYS[i] = this state key and
-- ARGV[5i-3 .. 5i+1] = 'leaky_bucket', limit, period (us), burst, cost (see check.lua, which also says
-- why this is a Lua script), and by a single-policy script (check_one.lua) with the quota
-- built in. This file only decides: it returns the new value and the instant it becomes
-- idle, and the driver writes it (SET ... PX) when every policy allows.
--
-- State: one string key, 15 bytes: "L", level (7 bytes), last (7 bytes), big-endian
-- integers: the units in the bucket at `last`, the instant the partial unit being drained
-- started. Missing (or another algorithm's value) is an empty bucket: level 0, last 0.
-- Two integers rather than one for the same reason as the token bucket (the clamp of a clock
-- that went back needs `last`). The key expires when the bucket is empty: last + level * T.
--
-- Returns allowed, remaining, reset_after, retry_after (-1: never), new value, idle_at.
local function leaky_bucket(raw, now, limit, p, burst, t, cost)
  local level, last = unpack_state(raw, 76, 2)
  if not level then
    level, last = 0, 0
  end
  if now < last then
    now = last
  end
  local drained = floor((now - last) / t)
  if drained >= level then
    level, last = 0, now
  else
    level, last = level - drained, last + drained * t
  end
  local remaining = 0
  if burst > level then
    remaining = burst - level
  end
  local reset = 0
  if level > 0 then
    reset = last + level * t - now
  end
  if cost > burst then
    return false, remaining, reset, -1
  end
  local new_level = level + cost
  if new_level <= burst then
    local idle_at = last + new_level * t
    local empty_after = 0
    if new_level > 0 then
      empty_after = idle_at - now
    end
    return true, burst - new_level, empty_after, -1, pack('>BI7I7', 76, new_level, last), idle_at
  end
  return false, remaining, reset, last + (new_level - burst) * t - now
end
