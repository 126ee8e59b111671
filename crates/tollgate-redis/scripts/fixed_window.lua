-- fixed_window.lua: fixed window aligned to multiples of the period since the epoch, ported
-- from tollgate-core's algorithms/fixed_window.rs.
--
-- A decision body (the contract is in check_one.lua): check.lua and lease.lua run it as the
-- function fixed_window(raw, now, limit, p, burst, t, cost) for KEYS[i] and the quota in
-- ARGV[5i-3 .. 5i+1] (check.lua says why this is a Lua script); a single-policy script runs
-- it inline, with the quota as constants. It only decides: the driver writes `value`
-- (SET ... PX) when every policy allows.
--
-- State: one string key, 15 bytes: "F", window_start (7 bytes), count (7 bytes), big-endian
-- integers. Why not one key per window with INCRBY: with clock = store the window is only
-- known inside the script, and a key name must be declared in KEYS before the script runs
-- (Redis Cluster routes by it). Missing (or another algorithm's value) is count 0. The key
-- expires at the end of the counted window.
--
local stored, count = 0, 0
if raw and #raw == 15 then
  local tag
  tag, stored, count = struct.unpack('>BI7I7', raw)
  if tag ~= 70 then
    stored, count = 0, 0
  end
end
local now = now -- clamped below when the clock went back; the driver keeps its own
if now < stored then
  now = stored
end
local start = now - now % p
if start ~= stored then
  count = 0
end
local window_end = start + p
local new_count = count + cost
if cost <= limit and new_count <= limit then
  ok, remaining, reset, retry = true, limit - new_count, 0, -1
  if new_count > 0 then
    reset = window_end - now
  end
  value, idle_at = struct.pack('>BI7I7', 70, start, new_count), window_end
else
  ok, remaining, reset, retry = false, 0, 0, -1
  if limit > count then
    remaining = limit - count
  end
  if count > 0 then
    reset = window_end - now
  end
  if cost <= limit then
    retry = window_end - now
  end
end
