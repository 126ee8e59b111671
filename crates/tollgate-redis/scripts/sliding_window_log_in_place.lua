-- sliding_window_log_in_place.lua: the sliding log decided where it lies, for check.lua.
-- The same decision as sliding_window_log.lua (and tollgate-core's), on the same value, but
-- the value is never moved whole: a long log (up to MAX_LOG_LIMIT records, 1.4 MB) read whole
-- by every request costs Redis milliseconds a request (docs/operations.md, "Redis: a long
-- `sliding_window_log`"), which one client's traffic turns into a stall for every client.
--
-- log_in_place(key, now, limit, p, cost) returns ok, remaining, reset, retry and, when ok and
-- cost > 0, the write { 'SET', value } or { 'APPEND', record } or { 'SETRANGE', offset,
-- record } and the idle instant; check.lua applies the write (with PX, or PEXPIRE after
-- APPEND and SETRANGE) only when the whole plan is charged.
--
-- Reads: log_ranged.lua's (a short value whole, a long one by GETRANGEs of 7 or 14 bytes:
-- the header, the newest record, and each step of the binary searches).
--
-- Writes: a new record is appended (or the newest record rewritten in place when the request
-- shares its instant). The expired records stay where they are, as a dead prefix, until they
-- outnumber the live ones: then the live records are written anew without them (the base
-- moved past them), a copy of O(live) paid once per at least as many appended records. So
-- a value holds at most about twice the live records, and a request costs O(log n) reads of
-- a few bytes plus, over time, O(1) of copying, where sliding_window_log.lua rewrites the
-- whole value on every admission.
--
-- Why a dead prefix decides the same: every record of the dead prefix has `at` at or before
-- newest - p (newest: the newest record's instant, the last charge's `now`), and a decision
-- clamps `now` to at least newest, so its horizon (now - p) is past every dead record: they
-- are never counted, as the core, which drops them when it charges, never counts them. A
-- settle that removes the newest record drops the dead prefix first (settle.lua), so the
-- clamp it loosens cannot bring one back.
--
-- log_ranged.lua comes first: log_open, log_at, log_cum, log_window, log_charge.
local function log_in_place(key, now, limit, p, cost)
  local r = log_open(key)
  local n, newest, total = r.n, r.newest, r.total
  if now < newest then
    now = newest
  end
  local first, before = log_window(r, now, p)
  local in_window = total - before
  local ok, remaining, reset, retry, write, idle_at = false, 0, 0, -1, nil, nil
  if limit > in_window then
    remaining = limit - in_window
  end
  if in_window > 0 then
    reset = newest + p - now
  end
  if cost <= limit and in_window + cost <= limit then
    ok, remaining = true, limit - in_window - cost
    if cost > 0 then
      reset, idle_at = p, now + p
      write = log_charge(r, first, before, now, cost)
    end
  elseif cost <= limit then
    -- Drop the oldest live records until the request fits: the last one dropped decides.
    local excess, lo, hi = in_window + cost - limit, first, n
    while lo <= hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      if log_cum(r, mid) - before >= excess then
        hi = mid - 1
      else
        lo = mid + 1
      end
    end
    retry = log_at(r, lo) + p - now
  end
  return ok, remaining, reset, retry, write, idle_at
end
