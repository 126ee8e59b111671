-- floor_gcra.lua: a reference point for `cargo xtask bench` (section redis), NOT used by tollgate: the
-- cheapest GCRA a script can be (TIME, GET, arithmetic, SET PX; no argument validation, no
-- multi-policy driver). The distance between it and tollgate's script is what validation and
-- all-or-nothing cost; the distance between it and a no-op script is what Redis itself
-- charges for the three commands and the key's life cycle.
-- KEYS[1] the key; ARGV[1] ignored; ARGV[2] ignored; ARGV[3..6] limit, period, burst, cost.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local limit, p, burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local iv = math.floor(p / limit)
local tat = tonumber(redis.call('GET', KEYS[1])) or 0
if tat < now then tat = now end
local used = tat - now
local new_used = used + cost * iv
local cap = burst * iv
if new_used <= cap then
  redis.call('SET', KEYS[1], now + new_used, 'PX', math.floor((new_used + 999) / 1000))
  return {1, math.floor((cap - new_used) / iv), new_used, -1}
end
return {0, 0, used, new_used - cap}
