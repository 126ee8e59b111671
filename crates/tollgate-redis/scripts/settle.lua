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

local function sliding_window_log(raw, now, limit, p, burst, t, units, at, real)
  local n, before = 0, 0
  if raw and #raw >= 8 and (#raw - 8) % 14 == 0 and string.byte(raw, 1) == 83 then
    n = (#raw - 8) / 14
    before = struct.unpack('>I7', raw, 2)
  end
  local ats, us = {}, {}
  local prev = before
  for i = 1, n do
    local a, total = struct.unpack('>I7I7', raw, i * 14 - 5)
    ats[i], us[i] = a, total - prev
    prev = total
  end
  local newest = n > 0 and ats[n] or 0
  if now < newest then
    now = newest
  end
  local done = 0
  if real == GIVE_BACK then
    -- The newest live entries first; one pass per entry at most.
    while done < units and #ats > 0 and not (now >= p and ats[#ats] <= now - p) do
      local take = min(units - done, us[#us])
      us[#us] = us[#us] - take
      done = done + take
      if us[#us] > 0 then
        break
      end
      ats[#ats], us[#us] = nil, nil
    end
  elseif real < units then
    if now >= p and at <= now - p then
      return 0
    end
    for i = 1, n do
      if ats[i] == at then
        done = min(units - real, us[i])
        us[i] = us[i] - done
        if us[i] == 0 then
          table.remove(ats, i)
          table.remove(us, i)
        end
        break
      end
    end
  else
    -- The expired records go first (as a charge drops them), then the debt is logged now.
    local first, live = 1, 0
    while first <= #ats and now >= p and ats[first] <= now - p do
      before = before + us[first]
      first = first + 1
    end
    local a2, u2 = {}, {}
    for i = first, #ats do
      a2[#a2 + 1], u2[#u2 + 1] = ats[i], us[i]
      live = live + us[i]
    end
    ats, us = a2, u2
    local room = MAX_COUNT - live
    done = min(real - units, room > 0 and room or 0)
    if done > 0 then
      if #ats > 0 and ats[#ats] == now then
        us[#us] = us[#us] + done
      else
        ats[#ats + 1], us[#us + 1] = now, done
      end
    end
  end
  if done == 0 then
    return 0
  end
  if #ats == 0 then
    return done, false, 0
  end
  local parts, total = { pack('>BI7', 83, before) }, before
  for i = 1, #ats do
    total = total + us[i]
    parts[i + 1] = pack('>I7I7', ats[i], total)
  end
  return done, table.concat(parts), ats[#ats] + p
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
local function read(key)
  return redis.call('GET', key), false
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
  local raw, elsewhere = read(keys[i])
  if elsewhere then
    out[i] = redis.error_reply('TGELSEWHERE settle ' .. i .. ': a key is served by another node')
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
