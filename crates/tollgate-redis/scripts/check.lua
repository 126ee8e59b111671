-- check.lua: the driver. Decides every policy matched by one request, all-or-nothing, in one
-- round trip. The Rust side runs it as one script: bounds, prelude.lua, the six algorithm
-- files, then this file, loaded once with SCRIPT LOAD and called with EVALSHA.
--
-- KEYS[i]  the state of policy i: <prefix>:{<client>}:<policy>. Every key carries the same
--          {<client>} hash tag, so one client's keys share one Redis Cluster slot.
-- ARGV[1]  now in microseconds since the Unix epoch (clock = local), or the empty string to
--          read Redis TIME (clock = store: the gateways' clocks do not matter).
-- ARGV[5i-3 .. 5i+1]  policy i: algorithm name (fixed_window, sliding_window_log,
--          sliding_window_counter, token_bucket, leaky_bucket, gcra), limit, period (us),
--          burst, cost. The same quota bounds as tollgate-core are checked here again.
--
-- ARGV[5n+2] (optional): a floor in milliseconds for every PX. Only for tests that drive a
--          local clock at another pace than Redis' own (a key must not vanish in real time
--          before the test's virtual time reaches its idle instant). A key that outlives its
--          idle instant changes no decision, only memory.
--
-- Reply: 4 integers per policy, in KEYS order: allowed (1 or 0), remaining, reset_after (us),
--        retry_after (us; -1 when retrying can never help).
--
-- Why Lua and not MULTI/EXEC: a decision reads the state, computes and writes only when
-- every policy allows. MULTI cannot branch on what it read, and WATCH + retry loops under
-- contention (20 gateways hitting one hot client is the design's reference race). A script
-- runs atomically on the server in one round trip.
--
-- Why the order validate -> read -> decide -> write: Redis runs a script atomically but
-- does not roll it back. Every argument is checked and every key read before the first
-- write, so an error (a bad argument, a key of the wrong type) leaves nothing half charged.
-- Every write sets PX so a key vanishes when its state equals a fresh one.

local ALGORITHMS = {
  fixed_window = fixed_window,
  sliding_window_log = sliding_window_log,
  sliding_window_counter = sliding_window_counter,
  token_bucket = token_bucket,
  leaky_bucket = leaky_bucket,
  gcra = gcra,
}

local n = #KEYS
local ttl_floor = 0
if n == 0 or (#ARGV ~= 1 + 5 * n and #ARGV ~= 2 + 5 * n) then
  fail('expected 1 + 5 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
elseif #ARGV == 2 + 5 * n then
  ttl_floor = int(2 + 5 * n, 0, MAX_PERIOD, 'ttl floor')
end

-- 1. Validate every argument.
local now = read_now()

-- Policy i's arguments, checked: algorithm, limit, period, burst, interval, cost.
local function policy(i)
  local b = 5 * i - 3
  local name = ARGV[b]
  local alg = ALGORITHMS[name]
  if not alg then
    fail('ARGV[' .. b .. '] is not an algorithm: ' .. tostring(name))
  end
  local limit, p, burst, t = quota(b + 1, 'policy ' .. i .. ': ')
  if alg == sliding_window_log and limit > MAX_LOG_LIMIT then
    fail('policy ' .. i .. ': sliding_window_log limit exceeds ' .. MAX_LOG_LIMIT)
  end
  if alg == sliding_window_counter and limit * p > MAX_INT then
    fail('policy ' .. i .. ': sliding_window_counter needs limit x period <= 2^53')
  end
  return alg, limit, p, burst, t, int(b + 4, 0, MAX_INT, 'cost')
end

-- One policy (the common case): the same steps without the bookkeeping of several.
if n == 1 then
  local alg, limit, p, burst, t, cost = policy(1)
  local ok, remaining, reset, retry, value, idle_at =
    alg(redis.call('GET', KEYS[1]), now, limit, p, burst, t, cost)
  if ok then
    if cost > 0 then
      redis.call('SET', KEYS[1], value, 'PX', px(idle_at, now, ttl_floor))
    end
    return { 1, remaining, reset, retry }
  end
  return { 0, remaining, reset, retry }
end

local algs, limits, periods, bursts, intervals, costs = {}, {}, {}, {}, {}, {}
for i = 1, n do
  algs[i], limits[i], periods[i], bursts[i], intervals[i], costs[i] = policy(i)
end

-- 2. Read every key (one slot: MGET is valid in a cluster).
local raws = redis.call('MGET', unpack(KEYS))

-- 3. Decide every policy without writing.
local out, values, idles = {}, {}, {}
local all = true
for i = 1, n do
  local ok, remaining, reset, retry, value, idle_at =
    algs[i](raws[i], now, limits[i], periods[i], bursts[i], intervals[i], costs[i])
  if ok then
    out[4 * i - 3] = 1
  else
    out[4 * i - 3] = 0
    all = false
  end
  out[4 * i - 2], out[4 * i - 1], out[4 * i] = remaining, reset, retry
  values[i], idles[i] = value, idle_at
end

-- 4. Charge every policy, or none: a denied verdict reports the uncharged state of the
--    policies that would have allowed (a zero-cost query of each).
if all then
  for i = 1, n do
    if costs[i] > 0 then
      redis.call('SET', KEYS[i], values[i], 'PX', px(idles[i], now, ttl_floor))
    end
  end
else
  for i = 1, n do
    if out[4 * i - 3] == 1 and costs[i] > 0 then
      local _, remaining, reset =
        algs[i](raws[i], now, limits[i], periods[i], bursts[i], intervals[i], 0)
      out[4 * i - 2], out[4 * i - 1] = remaining, reset
    end
  end
end
return out
