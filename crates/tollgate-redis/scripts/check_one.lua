-- check_one.lua: the driver for a request matched by ONE policy, the common case. The Rust
-- side builds one script per algorithm: bounds, prelude.lua, that algorithm's file, then
-- `local decide, ALGORITHM = <function>, '<name>'` and this file. Each runs only its own
-- algorithm's definitions (Redis re-runs a script's whole chunk on every call), and
-- validates inline; requests with several policies use check.lua.
--
-- KEYS[1]  the state of the policy: <prefix>:{<client>}:<policy>.
-- ARGV     as check.lua with one policy: now ('' = Redis TIME), algorithm name (must be
--          this script's), limit, period (us), burst, cost, and the optional PX floor (ms).
-- Reply:   allowed (1 or 0), remaining, reset_after (us), retry_after (us; -1: never).
--
-- Why Lua, and why validate and read before writing: see check.lua. Here the only write is
-- the last command.

local function fail(msg)
  error(redis.error_reply('ERR tollgate: ' .. msg))
end

local nargs = #ARGV
if #KEYS ~= 1 or (nargs ~= 6 and nargs ~= 7) then
  fail('expected 1 key and 6 arguments, got ' .. #KEYS .. ' keys and ' .. nargs .. ' arguments')
end
if ARGV[2] ~= ALGORITHM then
  fail('ARGV[2] is not ' .. ALGORITHM .. ': ' .. tostring(ARGV[2]))
end
local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[1])
end
local limit, p, burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ttl_floor = 0
if nargs == 7 then
  ttl_floor = tonumber(ARGV[7])
end
if not (now and limit and p and burst and cost and ttl_floor)
  or now % 1 ~= 0 or limit % 1 ~= 0 or p % 1 ~= 0 or burst % 1 ~= 0 or cost % 1 ~= 0
  or ttl_floor % 1 ~= 0 or now < 0 or now >= MAX_INT or limit < 1 or limit > MAX_LIMIT
  or p < 1 or p > MAX_PERIOD or burst < 1 or burst > MAX_LIMIT or cost < 0 or cost > MAX_INT
  or ttl_floor < 0 or ttl_floor > MAX_PERIOD then
  fail('ARGV must be integers: now in [0, 2^53), limit and burst in [1, ' ..
    string.format('%.0f', MAX_LIMIT) .. '], period in [1, ' .. string.format('%.0f', MAX_PERIOD) ..
    '] us, cost in [0, 2^53], PX floor in [0, period bound]')
end
if limit > p then
  fail('more than one unit per microsecond')
end
local t = floor(p / limit)
if t * limit < p then
  t = t + 1
end
if burst * t > MAX_BURST_SPAN then
  fail('burst x interval exceeds 2^52 us')
end
if ALGORITHM == 'sliding_window_log' and limit > MAX_LOG_LIMIT then
  fail('sliding_window_log limit exceeds ' .. MAX_LOG_LIMIT)
end
if ALGORITHM == 'sliding_window_counter' and limit * p > MAX_INT then
  fail('sliding_window_counter needs limit x period <= 2^53')
end

local ok, remaining, reset, retry, value, idle_at =
  decide(redis.call('GET', KEYS[1]), now, limit, p, burst, t, cost)
if not ok then
  return { 0, remaining, reset, retry }
end
if cost > 0 then
  local ms = ttl_ms(idle_at, now)
  if ms < ttl_floor then
    ms = ttl_floor
  end
  redis.call('SET', KEYS[1], value, 'PX', ms)
end
return { 1, remaining, reset, retry }
