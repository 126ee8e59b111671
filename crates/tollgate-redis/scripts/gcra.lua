-- gcra.lua: GCRA (virtual scheduling), ported from tollgate-core's algorithms/gcra.rs.
--
-- KEYS and ARGV: run by check.lua for policy i with KEYS[i] = this state key and
-- ARGV[5i-3 .. 5i+1] = 'gcra', limit, period (us), burst, cost (see check.lua, which also says
-- why this is a Lua script), and by a single-policy script (check_one.lua) with the quota
-- built in. This file only decides: it returns the new value (a string, formatted with %d)
-- and the instant it becomes idle, and the driver writes it (SET ... PX) when every policy
-- allows.
--
-- State: one string key holding the theoretical arrival time (TAT) as a decimal integer, in
-- microseconds since the epoch (Redis stores it as an integer-encoded string). A missing key
-- or any other value is TAT = 0, which is fresh. The key expires at TAT: from then on the
-- state equals a fresh one.
--
-- A request of cost c passes when max(TAT, now) + c*T - now <= B*T, with T the emission
-- interval and B the burst; it then sets TAT = max(TAT, now) + c*T.
--
-- Returns allowed, remaining, reset_after, retry_after (-1: never), new value, idle_at.
local function gcra(raw, now, limit, p, burst, t, cost)
  local capacity = burst * t
  local tat = raw and tonumber(raw) or 0
  if tat < now then
    tat = now
  end
  local used = tat - now
  local before = 0
  if capacity > used then
    before = floor((capacity - used) / t)
  end
  if cost > burst then
    return false, before, used, -1
  end
  local new_used = used + cost * t
  if new_used <= capacity then
    local new_tat = now + new_used
    return true, floor((capacity - new_used) / t), new_used, -1, fmt('%d', new_tat), new_tat
  end
  return false, before, used, new_used - capacity
end
