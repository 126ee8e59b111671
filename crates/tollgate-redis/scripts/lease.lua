-- lease.lua: the driver of `sync = "lease"`. A gateway takes a lease of units from one
-- policy's shared state in one call, spends them locally without calling Redis, and gives
-- back what it did not spend when the lease expires (in the same call that takes the next
-- lease, or a last call at shutdown). Units are charged to the shared state when they are
-- leased, before they are used, so the shared count never exceeds the limit.
--
-- Supported: the algorithms whose state is a count of units that a give-back can decrement
-- exactly: token_bucket, leaky_bucket, gcra (one unit = one emission interval) and
-- fixed_window (a give-back counts only inside the window it was taken from). The sliding
-- algorithms are not: a sliding log would have to forget the timestamps of units never
-- used, and the sliding counter's weighted previous window cannot be decremented exactly.
--
-- KEYS[1]  the state of the policy: <prefix>:{<client>}:<policy> (as check.lua).
-- ARGV[1]  now in microseconds since the epoch (clock = local), or '' to read Redis TIME.
-- ARGV[2]  algorithm name: token_bucket, leaky_bucket, gcra or fixed_window.
-- ARGV[3]  limit, ARGV[4] period (us), ARGV[5] burst (the same bounds as check.lua).
-- ARGV[6]  want: the most units to take (0: take nothing, only give back).
-- ARGV[7]  need: the fewest units worth taking (1 <= need <= want, or 0 with want = 0).
--          When fewer are available nothing is taken and retry_after says when `need`
--          would be.
-- ARGV[8]  give back: unused units of the previous lease.
-- ARGV[9]  the window the given-back units were taken in (fixed_window; 0 otherwise).
-- ARGV[10] (optional) a floor in milliseconds for PX, as in check.lua (tests that drive a
--          local clock at another pace than Redis' own).
--
-- Reply: granted, remaining (after the grant), reset_after (us), retry_after (us; -1 when
--        nothing was denied or `need` can never be met), window (the fixed window the grant
--        belongs to, 0 otherwise), window_end_after (us until that window ends; 0 otherwise).
--
-- Why Lua: give back, measure what is available and take, atomically, in one round trip.
-- Validation and the read come before the first write, as in check.lua.

local LEASABLE = {
  token_bucket = token_bucket,
  leaky_bucket = leaky_bucket,
  gcra = gcra,
  fixed_window = fixed_window,
}

if #KEYS ~= 1 or (#ARGV ~= 9 and #ARGV ~= 10) then
  fail('expected 1 key and 9 arguments')
end
local ttl_floor = 0
if #ARGV == 10 then
  ttl_floor = int(10, 0, MAX_PERIOD, 'ttl floor')
end
local now = read_now()
local name = ARGV[2]
local alg = LEASABLE[name]
if not alg then
  fail('lease: algorithm ' .. tostring(name) .. ' cannot be leased')
end
local limit, p, burst, t = quota(3, 'lease: ')
local want = int(6, 0, MAX_LIMIT, 'want')
local need = int(7, 0, MAX_LIMIT, 'need')
if (want == 0 and need ~= 0) or (want > 0 and (need < 1 or need > want)) then
  fail('need must be in [1, want] (or 0 with want = 0)')
end
local back = int(8, 0, MAX_LIMIT, 'give back')
local back_window = int(9, 0, MAX_INT - 1, 'give-back window')

local raw = redis.call('GET', KEYS[1])

-- 1. Give back: the state as if the unused units had never been taken. Returns the new raw
--    value (nil: fresh) and its idle instant.
local function give_back(raw)
  if name == 'gcra' then
    local tat = tonumber(raw) or 0
    tat = tat - back * t
    if tat <= now then
      return nil, 0
    end
    return tat, tat
  elseif name == 'token_bucket' or name == 'leaky_bucket' then
    local tag = (name == 'token_bucket') and 84 or 76
    local a, last = unpack_state(raw, tag, 2)
    if not a then
      return raw, 0
    end
    if now < last then
      now = last
    end
    local n = floor((now - last) / t)
    -- Work with the level (units in use): burst - tokens for the token bucket.
    local level = (name == 'token_bucket') and (burst - (a < burst and a or burst)) or a
    if n >= level then
      return nil, 0
    end
    level, last = level - n, last + n * t
    level = level - back
    if level <= 0 then
      return nil, 0
    end
    local first = (name == 'token_bucket') and (burst - level) or level
    return pack('>BI7I7', tag, first, last), last + level * t
  else
    local start, count = unpack_state(raw, 70, 2)
    if not start or start ~= back_window or now - now % p ~= start then
      return raw, 0
    end
    count = count - back
    if count <= 0 then
      return nil, 0
    end
    return pack('>BI7I7', 70, start, count), start + p
  end
end

local changed = false
if back > 0 and raw then
  raw = give_back(raw)
  changed = true
end

-- 2. Measure what is available now (a zero-cost query) and take up to `want`.
local _, available, reset = alg(raw, now, limit, p, burst, t, 0)
local window, window_end_after = 0, 0
if name == 'fixed_window' then
  window = now - now % p
  window_end_after = window + p - now
end
local granted = 0
local retry = -1
local value, idle_at
if want > 0 then
  local take = want < available and want or available
  if take >= need then
    local ok, remaining, reset_after
    ok, remaining, reset_after, _, value, idle_at = alg(raw, now, limit, p, burst, t, take)
    if ok then
      granted, available, reset = take, remaining, reset_after
    end
  else
    local _, _, _, r = alg(raw, now, limit, p, burst, t, need)
    retry = r
  end
end

-- 3. Write: the grant (which includes the give-back), or the give-back alone.
if granted > 0 then
  redis.call('SET', KEYS[1], value, 'PX', px(idle_at, now, ttl_floor))
elseif changed then
  if raw then
    local _, _, r = alg(raw, now, limit, p, burst, t, 0)
    redis.call('SET', KEYS[1], raw, 'PX', px(now + r, now, ttl_floor))
  else
    redis.call('DEL', KEYS[1])
  end
end
return {granted, available, reset, retry, window, window_end_after}
