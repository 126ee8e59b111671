-- token_bucket.lua: token bucket with lazy integer refill, ported from tollgate-core's
-- algorithms/token_bucket.rs.
--
-- A decision body (the contract is in check_one.lua): check.lua and lease.lua run it as the
-- function token_bucket(raw, now, limit, p, burst, t, cost) for KEYS[i] and the quota in
-- ARGV[5i-3 .. 5i+1] (check.lua says why this is a Lua script); a single-policy script runs
-- it inline, with the quota as constants. It only decides: the driver writes `value`
-- (SET ... PX) when every policy allows.
--
-- State: one string key, 15 bytes: "T", tokens (7 bytes), last (7 bytes), big-endian
-- integers: the whole tokens in hand at `last`, the instant the partial token being accrued
-- started. Missing (or another algorithm's value) is a full bucket: tokens = burst, last = now.
-- A bucket in debt (written only by settle.lua) is "t", the tokens owed, last: negative
-- tokens, paid off by refill before the bucket holds one again.
--
-- Why not GCRA's single integer: the decisions are the same while time moves forward
-- (tokens = burst - ceil((TAT - now) / T)), but the core clamps a clock that went back to
-- `last`, and `last` cannot be recovered from TAT alone. Two integers keep the port exact.
-- The key expires when the bucket is full again: last + (burst - tokens) * T.
--
-- A missing state is full at `now` (refilling one of last = 0 gives the same), so only a
-- state found is refilled: a fresh client's plan skips the division.
local now = now -- clamped below when the clock went back; the driver keeps its own
local tokens, last = burst, now
if raw and #raw == 15 then
  local tag, a, b = struct.unpack('>BI7I7', raw)
  if tag == 84 or tag == 116 then
    tokens, last = a, b
    if tag == 116 then
      -- A settled debt (settle.lua): `a` tokens owed below empty at `last`.
      tokens = -a
    end
    if now < last then
      now = last
    end
    -- floor((now - last) / t) by `%`, which Lua does in place (math.floor is a call): exact,
    -- as now >= last and both are whole numbers below 2^53.
    local n = now - last
    n = (n - n % t) / t
    if (tokens < burst and tokens or burst) + n >= burst then
      tokens, last = burst, now
    else
      tokens, last = tokens + n, last + n * t
    end
  end
end
if cost <= burst and tokens >= cost then
  local left = tokens - cost
  ok, remaining, reset, retry = true, left, 0, -1
  idle_at = last + (burst - left) * t
  if left < burst then
    reset = idle_at - now
  end
  value = struct.pack('>BI7I7', 84, left, last)
else
  ok, remaining, reset, retry = false, 0, 0, -1
  if tokens > 0 then
    remaining = tokens
  end
  if tokens < burst then
    reset = last + (burst - tokens) * t - now
  end
  if cost <= burst then
    retry = last + (cost - tokens) * t - now
  end
end
