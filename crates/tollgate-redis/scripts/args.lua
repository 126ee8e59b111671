-- args.lua: argument checks shared by the drivers that validate with a message per argument
-- (check.lua for several policies, lease.lua). Not part of the single-policy scripts
-- (check_one.lua validates inline: Redis runs a script's whole chunk on every call, and every
-- definition here would cost those, the most frequent calls, on each one).

local function fail(msg)
  error(redis.error_reply('ERR tollgate: ' .. msg))
end

-- ARGV[i] as an integer in [lo, hi], or an error naming it.
local function int(i, lo, hi, what)
  local x = tonumber(ARGV[i])
  if not x or x % 1 ~= 0 or x < lo or x > hi then
    fail('ARGV[' .. i .. '] (' .. what .. ') must be an integer in [' ..
      string.format('%.0f', lo) .. ', ' .. string.format('%.0f', hi) .. ']')
  end
  return x
end

-- Now, from ARGV[1] (clock = local) or Redis TIME when ARGV[1] is '' (clock = store). TIME is
-- not deterministic: Redis >= 5 replicates a script's effects, not the script.
local function read_now()
  if ARGV[1] == '' then
    local time = redis.call('TIME')
    return tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return int(1, 0, MAX_INT - 1, 'now')
end

-- The quota at ARGV[b], ARGV[b + 1], ARGV[b + 2] (limit, period in us, burst), checked
-- against the core's bounds: limit, period, burst and the emission interval ceil(p / limit).
-- `who` prefixes the messages of checks that involve several arguments.
local function quota(b, who)
  local limit = int(b, 1, MAX_LIMIT, 'limit')
  local p = int(b + 1, 1, MAX_PERIOD, 'period')
  if limit > p then
    fail(who .. 'more than one unit per microsecond')
  end
  local burst = int(b + 2, 1, MAX_LIMIT, 'burst')
  local t = floor(p / limit)
  if t * limit < p then
    t = t + 1
  end
  if burst * t > MAX_BURST_SPAN then
    fail(who .. 'burst x interval exceeds 2^52 us')
  end
  return limit, p, burst, t
end
