-- gcra.lua: GCRA (virtual scheduling), ported from tollgate-core's algorithms/gcra.rs.
--
-- A decision body (the contract is in check_one.lua): check.lua and lease.lua run it as the
-- function gcra(raw, now, limit, p, burst, t, cost) for KEYS[i] and the quota in
-- ARGV[5i-3 .. 5i+1] (check.lua says why this is a Lua script); a single-policy script runs
-- it inline, with the quota as constants. It only decides: the driver writes `value` (the new
-- TAT formatted with %d) with SET ... PX when every policy allows.
--
-- State: one string key holding the theoretical arrival time (TAT) as a decimal integer, in
-- microseconds since the epoch (Redis stores it as an integer-encoded string). A missing key
-- or any other value is TAT = 0, which is fresh. The key expires at TAT: from then on the
-- state equals a fresh one.
--
-- A request of cost c passes when max(TAT, now) + c*T - now <= B*T, with T the emission
-- interval and B the burst; it then sets TAT = max(TAT, now) + c*T.
local capacity = burst * t
local tat = raw and tonumber(raw) or 0
if tat < now then
  tat = now
end
local used = tat - now
local new_used = used + cost * t
if cost <= burst and new_used <= capacity then
  ok, remaining, reset, retry = true, math.floor((capacity - new_used) / t), new_used, -1
  idle_at = now + new_used
  value = string.format('%d', idle_at)
else
  ok, remaining, reset, retry = false, 0, used, -1
  if capacity > used then
    remaining = math.floor((capacity - used) / t)
  end
  if cost <= burst then
    retry = new_used - capacity
  end
end
