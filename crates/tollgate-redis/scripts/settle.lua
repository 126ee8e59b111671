-- settle.lua: costs known later (ported from tollgate-core's settle.rs and the algorithms'
-- refund / owe / release / renew). Many keys in one call: a gateway coalesces the settles,
-- releases and renewals that wait for a connection into one script call.
--
-- KEYS     the state keys, one per item (any clients: one call runs on one server or slot).
-- ARGV[1]  now in microseconds since the epoch (clock = local), or '' to read Redis TIME.
-- ARGV[2]  a floor in milliseconds for PX (0: none), as in check.lua.
-- then per item, 7 arguments: algorithm, limit, period (us), burst (the quota, as check.lua),
--          units (the estimate charged, or the units held), at (the store's instant of the
--          charge, or of the hold's last renewal), real: the real cost (rate algorithms: a
--          refund below `units`, a debt above it; concurrency: a release), or -1 to renew a
--          concurrency hold, or -2 to give back `units` of a charge nothing recorded (Envoy's
--          negative hits; `at` is not read): token and leaky bucket and GCRA as their
--          refunds, the fixed window from the current window only, the sliding counter from
--          the current window then the previous, the sliding log from its newest live
--          entries, concurrency from its oldest live bucket (tollgate-core's
--          `Limit::give_back`).
--
-- Reply: per item, the units applied: refunded, charged as a debt, released, renewed or
-- given back (fewer than asked when the window charged has passed, the state refilled, the
-- debt bound was reached, the hold expired or the state held fewer); then the instant the
-- call ran at (Redis TIME with clock = store), which a renewed hold is now counted at: the
-- gateway keeps it to renew or release the hold next, as its own clock may differ.
--
-- Every argument is checked before the first write, so a refused call changes nothing.

local MAX_COUNT = 1125899906842624 -- 2^50, tollgate-core's settle::MAX_COUNT
local RENEW = -1
local GIVE_BACK = -2

local function max_level(unit)
  local m = floor(MAX_INT / unit)
  if m > MAX_COUNT then
    m = MAX_COUNT
  end
  return m
end

local function min(a, b)
  if a < b then
    return a
  end
  return b
end

local function unpack3(raw, tag)
  if raw and #raw == 15 and string.byte(raw, 1) == tag then
    local _, a, b = struct.unpack('>BI7I7', raw)
    return a, b
  end
  return nil
end

-- Each adjuster returns: the units applied, and the new raw value (false: delete) with its
-- idle instant, or nil when nothing changes.

local function token_bucket(raw, now, limit, p, burst, t, units, at, real)
  if real == GIVE_BACK then
    real = 0
  end
  local s, last = burst, 0
  if raw and #raw == 15 then
    local tag, a, b = struct.unpack('>BI7I7', raw)
    if tag == 84 then
      s, last = a, b
    elseif tag == 116 then
      s, last = -a, b
    end
  end
  if now < last then
    now = last
  end
  local n = floor((now - last) / t)
  if (s < burst and s or burst) + n >= burst then
    s, last = burst, now
  else
    s, last = s + n, last + n * t
  end
  local done
  if real < units then
    local room = burst - s
    done = min(units - real, room > 0 and room or 0)
    s = s + done
  else
    local low = burst - max_level(t)
    local room = s - low
    done = min(real - units, room > 0 and room or 0)
    s = s - done
  end
  if done == 0 then
    return 0
  end
  local value
  if s >= 0 then
    value = pack('>BI7I7', 84, s, last)
  else
    value = pack('>BI7I7', 116, -s, last)
  end
  return done, value, last + (burst - s) * t
end

local function leaky_bucket(raw, now, limit, p, burst, t, units, at, real)
  if real == GIVE_BACK then
    real = 0
  end
  local level, last = unpack3(raw, 76)
  if not level then
    level, last = 0, 0
  end
  if now < last then
    now = last
  end
  local drained = floor((now - last) / t)
  if drained >= level then
    level, last = 0, now
  else
    level, last = level - drained, last + drained * t
  end
  local done
  if real < units then
    done = min(units - real, level)
    level = level - done
  else
    local room = max_level(t) - level
    done = min(real - units, room > 0 and room or 0)
    level = level + done
  end
  if done == 0 then
    return 0
  end
  return done, pack('>BI7I7', 76, level, last), last + level * t
end

local function gcra(raw, now, limit, p, burst, t, units, at, real)
  if real == GIVE_BACK then
    real = 0
  end
  local tat = raw and tonumber(raw) or 0
  if real < units then
    if tat <= now then
      return 0
    end
    local new = tat - (units - real) * t
    if new < now then
      new = now
    end
    local done = math.ceil((tat - new) / t)
    return done, fmt('%d', new), new
  end
  if tat < now then
    tat = now
  end
  local room = max_level(t) * t - (tat - now)
  local done = min(real - units, room > 0 and floor(room / t) or 0)
  if done == 0 then
    return 0
  end
  tat = tat + done * t
  return done, fmt('%d', tat), tat
end

local function fixed_window(raw, now, limit, p, burst, t, units, at, real)
  local stored, count = unpack3(raw, 70)
  if not stored then
    stored, count = 0, 0
  end
  if now < stored then
    now = stored
  end
  local window = now - now % p
  if real == GIVE_BACK then
    at, real = now, 0
  end
  local done
  if real < units then
    if window ~= at - at % p or stored ~= window then
      return 0
    end
    done = min(units - real, count)
    count = count - done
  else
    if stored ~= window then
      count = 0
    end
    local room = MAX_COUNT - count
    done = min(real - units, room > 0 and room or 0)
    count = count + done
  end
  if done == 0 then
    return 0
  end
  return done, pack('>BI7I7', 70, window, count), window + p
end

local function sliding_window_counter(raw, now, limit, p, burst, t, units, at, real)
  local stored, current, previous = 0, 0, 0
  if raw and #raw == 22 and string.byte(raw, 1) == 67 then
    local _
    _, stored, current, previous = struct.unpack('>BI7I7I7', raw)
  end
  if now < stored then
    now = stored
  end
  local ws = now - now % p
  if ws ~= stored then
    if ws == stored + p then
      previous, current = current, 0
    else
      previous, current = 0, 0
    end
  end
  local done = 0
  if real == GIVE_BACK then
    done = min(units, current)
    current = current - done
    local more = min(units - done, previous)
    previous = previous - more
    done = done + more
  elseif real < units then
    local charged = at - at % p
    if charged == ws then
      done = min(units - real, current)
      current = current - done
    elseif charged + p == ws then
      done = min(units - real, previous)
      previous = previous - done
    end
  else
    local room = max_level(p) - current
    done = min(real - units, room > 0 and room or 0)
    current = current + done
  end
  if done == 0 then
    return 0
  end
  local idle = 0
  if current > 0 then
    idle = ws + 2 * p
  elseif previous > 0 then
    idle = ws + p
  end
  return done, pack('>BI7I7I7', 67, ws, current, previous), idle
end

-- The sliding log is settled where it lies (log_ranged.lua's reads and writes): a long log
-- (up to MAX_LOG_LIMIT records, 1.4 MB) read whole and rebuilt record by record cost Redis
-- 59 ms a settle at 100,000 records (docs/benchmarks.md). It writes itself and returns the
-- units applied. `t` is the call's instant (for PX), `now` the log's (clamped to its newest).
--
-- Costs: a debt appends a record or changes the newest (O(log n) reads); a give-back that
-- keeps the newest record changes it alone. A refund that keeps its record rewrites the totals
-- on the shorter side of it, a loop per record (a refund soon after its charge: the records
-- after it, few). A settle that removes a record writes the value anew (it cannot shrink in
-- place: a copy inside Redis, plus that loop for a record not the newest), dropping the dead
-- prefix: records at or before newest - p, which the core dropped when it charged, and which
-- a newest record removed would no longer keep out of the window (see
-- sliding_window_log_in_place.lua for why they stay until then). Measured at 100,000 records:
-- 3.4-3.6 ms a whole refund of the newest record, 24-33 ms one in the middle (docs/benchmarks.md).
local function sliding_window_log(key, t, p, units, at, real, ttl_floor)
  local r = log_open(key)
  local n, newest, total = r.n, r.newest, r.total
  local now = t
  if now < newest then
    now = newest
  end
  -- The dead prefix's last record (0: none), read only by a settle that needs it.
  local dead
  local function dead_end()
    if not dead then
      dead = 0
      if n > 0 and newest >= p then
        dead = log_first(r, newest - p) - 1
      end
    end
    return dead
  end
  -- The log without records k + 1 .. n (record k's total lowered by `less`), the dead prefix
  -- dropped: written anew, or deleted when no record is left or (as every adjuster's state)
  -- when it is fresh by the call's instant.
  local function cut_after(k, less)
    local dead = dead_end()
    local at_k = k > dead and log_at(r, k)
    if not at_k or at_k + p <= t then
      redis.call('DEL', key)
      return
    end
    local last = struct.pack('>I7I7', at_k, log_cum(r, k) - less)
    local value = struct.pack('>BI7', 83, log_cum(r, dead)) .. log_records(r, dead + 1, k - 1) ..
      last
    redis.call('SET', key, value, 'PX', px(at_k + p, t, ttl_floor))
  end
  -- Records i .. j re-packed with their totals moved by `by` (a loop per record: the cost).
  local function moved(i, j, by)
    local bytes, parts = log_records(r, i, j), {}
    for o = 1, #bytes, 14 do
      local a, c = struct.unpack('>I7I7', bytes, o)
      parts[#parts + 1] = struct.pack('>I7I7', a, c + by)
    end
    return table.concat(parts)
  end
  -- Record k's units lowered by `less` (with `drop`, all of them: the record goes). Either
  -- the totals after it go down (written over themselves, unless the record goes) or, when
  -- fewer records come before it, the totals before it and the base go up (the value written
  -- anew, the dead prefix dropped): a loop over the shorter side.
  local function lower(k, less, drop)
    local ms = px(newest + p, t, ttl_floor)
    local after = k + 1
    if not drop then
      after = k
    end
    -- The newest record is only ever lowered here (removed, it goes through cut_after): its
    -- side is the short one, and the dead prefix is not read.
    local dead = 0
    if k < n then
      dead = dead_end()
    end
    if k - 1 - dead < n - k then
      local value = struct.pack('>BI7', 83, log_cum(r, dead) + less) ..
        moved(dead + 1, k - 1, less) .. log_records(r, after, n)
      redis.call('SET', key, value, 'PX', ms)
    elseif drop then
      local value = struct.pack('>BI7', 83, log_cum(r, dead)) .. log_records(r, dead + 1, k - 1) ..
        moved(after, n, -less)
      redis.call('SET', key, value, 'PX', ms)
    else
      redis.call('SETRANGE', key, k * 14 - 6, moved(k, n, -less))
      redis.call('PEXPIRE', key, ms)
    end
  end
  if real == GIVE_BACK then
    -- The newest live records first; each emptied one goes, the first left with units stops.
    local first = 1
    if now >= p then
      first = log_first(r, now - p)
    end
    local done, k = 0, n
    while done < units and k >= first do
      local u = log_cum(r, k) - log_cum(r, k - 1)
      local take = min(units - done, u)
      done = done + take
      if take < u then
        if k == n then
          lower(n, take, false)
        else
          cut_after(k, take)
        end
        return done
      end
      k = k - 1
    end
    if done > 0 then
      cut_after(k, 0)
    end
    return done
  elseif real < units then
    -- A refund of the charge at `at`: nothing once it left the window, else from its record.
    if (now >= p and at <= now - p) or n == 0 then
      return 0
    end
    local k = log_first(r, at - 1)
    if k > n or log_at(r, k) ~= at then
      return 0
    end
    local u = log_cum(r, k) - log_cum(r, k - 1)
    local done = min(units - real, u)
    if done == u and k == n then
      cut_after(n - 1, 0)
    elseif done > 0 then
      lower(k, done, done == u)
    end
    return done
  end
  -- A debt, charged now (the expired records go, as a charge drops them).
  local first, before = log_window(r, now, p)
  local room = MAX_COUNT - (total - before)
  local done = min(real - units, room > 0 and room or 0)
  if done > 0 then
    log_write(key, log_charge(r, first, before, now, done), px(now + p, t, ttl_floor))
  end
  return done
end

local function concurrency(raw, now, limit, p, burst, t, units, at, real)
  local w = (p - p % 8) / 8
  if w < 1 then
    w = 1
  end
  local span = 2 * w + p
  local starts, counts = {}, {}
  if raw and #raw > 1 and (#raw - 1) % 14 == 0 and string.byte(raw, 1) == 72 then
    for i = 0, (#raw - 1) / 14 - 1 do
      local s, c = struct.unpack('>I7I7', raw, 2 + 14 * i)
      if c > 0 and s + span > now then
        starts[#starts + 1], counts[#counts + 1] = s, c
      end
    end
  end
  local b = at - at % w
  local done = 0
  if real == GIVE_BACK then
    -- The oldest live buckets first (they expire first anyway).
    local s2, c2 = {}, {}
    for i = 1, #starts do
      local take = min(units - done, counts[i])
      done = done + take
      if counts[i] > take then
        s2[#s2 + 1], c2[#c2 + 1] = starts[i], counts[i] - take
      end
    end
    starts, counts = s2, c2
  else
    for i = 1, #starts do
      if starts[i] == b then
        done = min(units, counts[i])
        counts[i] = counts[i] - done
        if counts[i] == 0 then
          table.remove(starts, i)
          table.remove(counts, i)
        end
        break
      end
    end
  end
  if done > 0 and real == RENEW then
    -- Renew: the units found move to the bucket of now.
    local nb, pos = now - now % w, #starts + 1
    for i = 1, #starts do
      if starts[i] >= nb then
        pos = i
        break
      end
    end
    if starts[pos] == nb then
      counts[pos] = counts[pos] + done
    else
      table.insert(starts, pos, nb)
      table.insert(counts, pos, done)
    end
  end
  if done == 0 then
    return 0
  end
  if #starts == 0 then
    return done, false, 0
  end
  local parts = { 'H' }
  for i = 1, #starts do
    parts[i + 1] = pack('>I7I7', starts[i], counts[i])
  end
  return done, table.concat(parts), starts[#starts] + span
end

local ADJUST = {
  token_bucket = token_bucket,
  leaky_bucket = leaky_bucket,
  gcra = gcra,
  fixed_window = fixed_window,
  sliding_window_counter = sliding_window_counter,
  sliding_window_log = sliding_window_log,
  concurrency = concurrency,
}

-- The keys, and how one is read (the across-slots variant, settle_script_across in
-- script.rs, replaces these two blocks: its keys follow the other arguments, and a key the
-- node does not serve is read as "elsewhere", that item answered with an error and unchanged).
local n = #KEYS
if n == 0 or #ARGV ~= 2 + 7 * n then
  fail('settle: expected 2 + 7 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local keys = KEYS
-- end of keys
local function read(key, cmd)
  return redis.call(cmd, key), false
end
-- end of read
local now = read_now()
local ttl_floor = int(2, 0, MAX_PERIOD, 'ttl floor')
local items = {}
for i = 1, n do
  local b = 3 + 7 * (i - 1)
  local adjust = ADJUST[ARGV[b]]
  if not adjust then
    fail('settle: ARGV[' .. b .. '] is not an algorithm')
  end
  local limit, p, burst, t = quota(b + 1, 'settle ' .. i .. ': ')
  local units = int(b + 4, 0, MAX_INT - 1, 'units')
  local at = int(b + 5, 0, MAX_INT - 1, 'at')
  local real = int(b + 6, GIVE_BACK, MAX_INT - 1, 'real')
  if real == RENEW and adjust ~= concurrency then
    fail('settle ' .. i .. ': only a concurrency hold is renewed')
  end
  items[i] = { adjust, limit, p, burst, t, units, at, real }
end
local out = {}
for i = 1, n do
  local it = items[i]
  -- A log is read where it lies (its adjuster's reads): only whether the node serves it here.
  local log = it[1] == sliding_window_log
  local raw, elsewhere = read(keys[i], log and 'EXISTS' or 'GET')
  if elsewhere then
    out[i] = redis.error_reply('TGELSEWHERE settle ' .. i .. ': a key is served by another node')
  elseif log then
    out[i] = sliding_window_log(keys[i], now, it[3], it[6], it[7], it[8], ttl_floor)
  else
    local done, value, idle = it[1](raw, now, it[2], it[3], it[4], it[5], it[6], it[7], it[8])
    if value == false or (value and idle <= now) then
      redis.call('DEL', keys[i])
    elseif value then
      redis.call('SET', keys[i], value, 'PX', px(idle, now, ttl_floor))
    end
    out[i] = done
  end
end
out[n + 1] = now
return out
