-- log_ranged.lua: a sliding log's value (sliding_window_log.lua's format: "S", base, then
-- 14-byte records of `at` and `cum`) read where it lies, for the drivers that decide and
-- settle a log in place (sliding_window_log_in_place.lua in check.lua, settle.lua).
--
-- log_open(key) reads its length (STRLEN), then a value of up to LOG_SMALL bytes whole (one
-- GET costs Redis less than a binary search of GETRANGEs) and a longer one's header and
-- newest record only; every other read is a GETRANGE of 7 or 14 bytes. A missing key, a
-- value of another shape (another algorithm's state) and a key of another type (pcall: not
-- ours; the next SET replaces it) read as an empty log.
local LOG_SMALL = 2048

local function log_open(key)
  local r = { key = key, raw = nil, n = 0, base = 0, newest = 0, total = 0 }
  local len = redis.pcall('STRLEN', key)
  if type(len) ~= 'number' or len < 22 or (len - 8) % 14 ~= 0 then
    return r
  end
  local n, head, tail = (len - 8) / 14, nil, nil
  if len <= LOG_SMALL then
    local raw = redis.call('GET', key)
    head, tail = raw, string.sub(raw, n * 14 - 5, n * 14 + 8)
    r.raw = raw
  else
    head = redis.call('GETRANGE', key, 0, 7)
  end
  if string.byte(head, 1) ~= 83 then
    r.raw = nil
    return r
  end
  if not tail then
    tail = redis.call('GETRANGE', key, n * 14 - 6, n * 14 + 7)
  end
  r.n, r.base = n, struct.unpack('>I7', head, 2)
  r.newest, r.total = struct.unpack('>I7I7', tail)
  return r
end

-- Record i's `at` (bytes i * 14 - 5 .. i * 14 + 1, from 1).
local function log_at(r, i)
  if r.raw then
    return (struct.unpack('>I7', r.raw, i * 14 - 5))
  end
  return (struct.unpack('>I7', redis.call('GETRANGE', r.key, i * 14 - 6, i * 14)))
end

-- Record i's `cum` (bytes i * 14 + 2 .. i * 14 + 8); the base for i = 0.
local function log_cum(r, i)
  if i == 0 then
    return r.base
  elseif r.raw then
    return (struct.unpack('>I7', r.raw, i * 14 + 2))
  end
  return (struct.unpack('>I7', redis.call('GETRANGE', r.key, i * 14 + 1, i * 14 + 7)))
end

-- The first record whose `at` is after `horizon` (n + 1 when none is): a binary search.
local function log_first(r, horizon)
  local lo, hi = 1, r.n
  while lo <= hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    if log_at(r, mid) > horizon then
      hi = mid - 1
    else
      lo = mid + 1
    end
  end
  return lo
end

-- The bytes of records i .. j (empty when j < i): one GETRANGE.
local function log_records(r, i, j)
  if j < i then
    return ''
  elseif r.raw then
    return string.sub(r.raw, i * 14 - 5, j * 14 + 8)
  end
  return redis.call('GETRANGE', r.key, i * 14 - 6, j * 14 + 7)
end

-- The window (now - p, now] of the log read as `r` (`now` at or after its newest record): its
-- first record (n + 1 when none is) and the total before that record.
local function log_window(r, now, p)
  local first = 1
  if now >= p then
    first = log_first(r, now - p)
  end
  if first > r.n then
    return first, r.total
  end
  return first, log_cum(r, first - 1)
end

-- The write that charges `units` at `now` (at or after the newest record) to the log read as
-- `r`, whose window (log_window) is `first` and `before`: { 'SET', value } for a log with no
-- record inside it (written anew) or whose expired records outnumber the live ones (the live
-- ones written anew without them: the dead prefix is cut), else { 'SETRANGE', offset, record }
-- (the newest record shares the instant: its total grows) or { 'APPEND', record }.
local function log_charge(r, first, before, now, units)
  local n = r.n
  if first > n then
    return { 'SET', struct.pack('>BI7I7I7', 83, 0, now, units) }
  end
  local record = struct.pack('>I7I7', now, r.total + units)
  -- The records kept before the new one: first .. last.
  local last = n
  if r.newest == now then
    last = n - 1
  end
  if first - 1 > last - first + 2 then
    return { 'SET', struct.pack('>BI7', 83, before) .. log_records(r, first, last) .. record }
  elseif last < n then
    return { 'SETRANGE', n * 14 - 6, record }
  end
  return { 'APPEND', record }
end

-- Applies `write` (log_charge's) to `key`, expiring in `ms` (PX; PEXPIRE after the others).
local function log_write(key, write, ms)
  if write[1] == 'SET' then
    redis.call('SET', key, write[2], 'PX', ms)
    return
  elseif write[1] == 'APPEND' then
    redis.call('APPEND', key, write[2])
  else
    redis.call('SETRANGE', key, write[2], write[3])
  end
  redis.call('PEXPIRE', key, ms)
end
