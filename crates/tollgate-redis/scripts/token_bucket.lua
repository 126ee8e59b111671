-- token_bucket.lua: token bucket with lazy integer refill, ported from tollgate-core's
-- algorithms/token_bucket.rs.
--
-- KEYS and ARGV: run by check.lua for policy i with KEYS[i] = this state key and
-- ARGV[5i-3 .. 5i+1] = 'token_bucket', limit, period (us), burst, cost (see check.lua, which also says
-- why this is a Lua script), and by a single-policy script (check_one.lua) with the quota
-- built in. This file only decides: it returns the new value and the instant it becomes
-- idle, and the driver writes it (SET ... PX) when every policy allows.
--
-- State: one string key, 15 bytes: "T", tokens (7 bytes), last (7 bytes), big-endian
-- integers: the whole tokens in hand at `last`, the instant the partial token being accrued
-- started. Missing (or another algorithm's value) is a full bucket: tokens = burst, last = 0.
--
-- Why not GCRA's single integer: the decisions are the same while time moves forward
-- (tokens = burst - ceil((TAT - now) / T)), but the core clamps a clock that went back to
-- `last`, and `last` cannot be recovered from TAT alone. Two integers keep the port exact.
-- The key expires when the bucket is full again: last + (burst - tokens) * T.
--
-- Returns allowed, remaining, reset_after, retry_after (-1: never), new value, idle_at.
local function token_bucket(raw, now, limit, p, burst, t, cost)
  local tokens, last = unpack_state(raw, 84, 2)
  if not tokens then
    tokens, last = burst, 0
  end
  if now < last then
    now = last
  end
  local n = floor((now - last) / t)
  if (tokens < burst and tokens or burst) + (n < burst and n or burst) >= burst then
    tokens, last = burst, now
  else
    tokens, last = tokens + n, last + n * t
  end
  local reset = 0
  if tokens < burst then
    reset = last + (burst - tokens) * t - now
  end
  if cost > burst then
    return false, tokens, reset, -1
  end
  if tokens >= cost then
    local left = tokens - cost
    local idle_at = last + (burst - left) * t
    local full_after = 0
    if left < burst then
      full_after = idle_at - now
    end
    return true, left, full_after, -1, pack('>BI7I7', 84, left, last), idle_at
  end
  return false, tokens, reset, last + (cost - tokens) * t - now
end
