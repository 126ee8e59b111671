-- fixed_window.lua: fixed window aligned to multiples of the period since the epoch, ported
-- from tollgate-core's algorithms/fixed_window.rs.
--
-- KEYS and ARGV: run by check.lua for policy i with KEYS[i] = this state key and
-- ARGV[5i-3 .. 5i+1] = 'fixed_window', limit, period (us), burst, cost (see check.lua, which also says
-- why this is a Lua script), and by a single-policy script (check_one.lua) with the quota
-- built in. This file only decides: it returns the new value and the instant it becomes
-- idle, and the driver writes it (SET ... PX) when every policy allows.
--
-- State: one string key, 15 bytes: "F", window_start (7 bytes), count (7 bytes), big-endian
-- integers. Why not one key per window with INCRBY: with clock = store the window is only
-- known inside the script, and a key name must be declared in KEYS before the script runs
-- (Redis Cluster routes by it). Missing (or another algorithm's value) is count 0. The key
-- expires at the end of the counted window.
--
-- Returns allowed, remaining, reset_after, retry_after (-1: never), new value, idle_at.
local function fixed_window(raw, now, limit, p, burst, t, cost)
  local stored_start, count = unpack_state(raw, 70, 2)
  if not stored_start then
    stored_start, count = 0, 0
  end
  if now < stored_start then
    now = stored_start
  end
  local start = now - now % p
  if start ~= stored_start then
    count = 0
  end
  local window_end = start + p
  local remaining, reset = 0, 0
  if limit > count then
    remaining = limit - count
  end
  if count > 0 then
    reset = window_end - now
  end
  if cost > limit then
    return false, remaining, reset, -1
  end
  local new_count = count + cost
  if new_count <= limit then
    local after = 0
    if new_count > 0 then
      after = window_end - now
    end
    return true, limit - new_count, after, -1, pack('>BI7I7', 70, start, new_count), window_end
  end
  return false, remaining, reset, window_end - now
end
