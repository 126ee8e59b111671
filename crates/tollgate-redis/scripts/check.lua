-- check.lua: the generic plan script, for plans the generated scripts do not serve (more
-- rules than a generated script inlines, past the bound on generated scripts, or with a
-- sliding log longer than script.rs's IN_PLACE_LOG_LIMIT; see src/script.rs). The Rust side
-- runs it as one script: bounds, prelude.lua, ttl.lua, args.lua, the algorithm files as
-- functions, log_ranged.lua, sliding_window_log_in_place.lua, then this file.
--
-- KEYS[i]  the state of rule i: <prefix>:{<client>}:<rule>.
-- ARGV[1]  now in microseconds since the Unix epoch (clock = local), or the empty string to
--          read Redis TIME (clock = store: the gateways' clocks do not matter).
-- ARGV[6i-4 .. 6i+1]  rule i: algorithm name (fixed_window, sliding_window_log,
--          sliding_window_counter, token_bucket, leaky_bucket, gcra), limit, period (us),
--          burst, cost, mode (0: enforced, 1: shadow, 2: quota). The quota bounds of tollgate-core are
--          checked here again.
-- ARGV[6n+2] (optional): a floor in milliseconds for every PX (tests that drive a local clock
--          at another pace than Redis' own; a key that outlives its idle instant changes no
--          decision, only memory).
--
-- Reply: the format of every tollgate script, struct '>I7' .. n x 'BI7I7I7': now (us), then
--        per rule allowed (1/0), remaining, reset_after (us), retry_after + 1 (us; 0: allowed,
--        or retrying never helps). The plan is allowed when every enforced rule allows; then
--        every rule that allowed is charged, else none is (shadow rules never deny; quota rules
--        deny only when every quota rule of the plan denies).
--
-- Why Lua and not MULTI/EXEC: a decision reads the state, computes and writes only when
-- every rule allows. MULTI cannot branch on what it read, and WATCH + retry loops collapse
-- under contention (20 gateways hitting one hot client is the design's reference race).
--
-- Why validate -> read -> decide -> write: Redis runs a script atomically but does not roll
-- it back. Every argument is checked and every key read before the first write, so an error
-- leaves nothing half charged. Every write sets PX so a key vanishes when its state equals a
-- fresh one.

local ALGORITHMS = {
  fixed_window = fixed_window,
  sliding_window_log = sliding_window_log,
  sliding_window_counter = sliding_window_counter,
  token_bucket = token_bucket,
  leaky_bucket = leaky_bucket,
  gcra = gcra,
  concurrency = concurrency,
}

local n = #KEYS
local ttl_floor = 0
if n == 0 or (#ARGV ~= 1 + 6 * n and #ARGV ~= 2 + 6 * n) then
  fail('expected 1 + 6 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
elseif #ARGV == 2 + 6 * n then
  ttl_floor = int(2 + 6 * n, 0, MAX_PERIOD, 'ttl floor')
end

-- 1. Validate every argument.
local now = read_now()

-- Rule i's arguments, checked: algorithm, limit, period, burst, interval, cost, shadow.
local function rule(i)
  local b = 6 * i - 4
  local name = ARGV[b]
  local alg = ALGORITHMS[name]
  if not alg then
    fail('ARGV[' .. b .. '] is not an algorithm: ' .. tostring(name))
  end
  local limit, p, burst, t = quota(b + 1, 'rule ' .. i .. ': ')
  if alg == sliding_window_log and limit > MAX_LOG_LIMIT then
    fail('rule ' .. i .. ': sliding_window_log limit exceeds ' .. MAX_LOG_LIMIT)
  end
  if alg == sliding_window_counter and limit * p > MAX_INT then
    fail('rule ' .. i .. ': sliding_window_counter needs limit x period <= 2^53')
  end
  return alg, limit, p, burst, t, int(b + 4, 0, MAX_INT, 'cost'), int(b + 5, 0, 2, 'mode')
end

local algs, limits, periods, bursts, intervals, costs, modes = {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  algs[i], limits[i], periods[i], bursts[i], intervals[i], costs[i], modes[i] = rule(i)
end

-- 2. Read every key (one slot: MGET is valid in a cluster) but the sliding logs': a log is
--    decided where it lies (sliding_window_log_in_place.lua), never read whole.
local raws, reads, at = {}, {}, {}
for i = 1, n do
  if algs[i] ~= sliding_window_log then
    local j = #reads + 1
    reads[j], at[j] = KEYS[i], i
  end
end
if #reads > 0 then
  local got = redis.call('MGET', unpack(reads))
  for j = 1, #reads do
    raws[at[j]] = got[j]
  end
end

-- Rule i decided at cost `cost`: a log in place, any other rule on its value.
local function decide(i, cost)
  if algs[i] == sliding_window_log then
    return log_in_place(KEYS[i], now, limits[i], periods[i], cost)
  end
  return algs[i](raws[i], now, limits[i], periods[i], bursts[i], intervals[i], cost)
end

-- 3. Decide every rule without writing.
local oks, remainings, resets, retries, values, idles = {}, {}, {}, {}, {}, {}
local all, quotas, quota_oks = true, 0, 0
for i = 1, n do
  oks[i], remainings[i], resets[i], retries[i], values[i], idles[i] = decide(i, costs[i])
  if modes[i] == 2 then
    quotas = quotas + 1
    if oks[i] then
      quota_oks = quota_oks + 1
    end
  elseif not oks[i] and modes[i] == 0 then
    all = false
  end
end
if quotas > 0 and quota_oks == 0 then
  all = false
end

-- 4. Charge every rule that allowed, or none: a denied plan reports the uncharged state of the
--    rules that would have allowed (a zero-cost query of each).
if all then
  for i = 1, n do
    if oks[i] and costs[i] > 0 then
      local ms = px(idles[i], now, ttl_floor)
      if algs[i] == sliding_window_log then
        log_write(KEYS[i], values[i], ms)
      else
        redis.call('SET', KEYS[i], values[i], 'PX', ms)
      end
    end
  end
else
  for i = 1, n do
    if oks[i] and costs[i] > 0 then
      local _, remaining, reset = decide(i, 0)
      remainings[i], resets[i] = remaining, reset
    end
  end
end
local out = { pack('>I7', now) }
for i = 1, n do
  out[i + 1] = pack('>BI7I7I7', oks[i] and 1 or 0, remainings[i], resets[i], retries[i] + 1)
end
return table.concat(out)
