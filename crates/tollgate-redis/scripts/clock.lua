-- clock.lua: written out by the Rust side in check_one.lua and check_set.lua (at their
-- `-- @clock` line), with the positions of the optional arguments `now` and PX floor filled
-- in. The driver declares `nargs`, `now` (nil) and `ttl_floor` (0) before it. now: from its
-- argument when the call has it and it is not empty, else Redis TIME (the default
-- clock = "store": every gateway agrees on time). PX floor: from its argument when present.
if nargs >= $NOW then
  local given = ARGV[$NOW]
  if given ~= '' then
    now = tonumber(given)
    if not now or now % 1 ~= 0 or now < 0 or now >= MAX_INT then
      return redis.error_reply('ERR tollgate: ARGV[$NOW] (now) must be an integer in ' ..
        '[0, 2^53) or empty')
    end
  end
  if nargs == $FLOOR then
    ttl_floor = tonumber(ARGV[$FLOOR])
    if not ttl_floor or ttl_floor % 1 ~= 0 or ttl_floor < 0 or ttl_floor > MAX_PERIOD then
      return redis.error_reply('ERR tollgate: ARGV[$FLOOR] (PX floor) must be an integer ' ..
        'number of milliseconds in [0, period bound]')
    end
  end
end
if not now then
  local time = redis.call('TIME')
  now = time[1] * 1000000 + time[2]
end
