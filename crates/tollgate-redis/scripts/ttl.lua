-- ttl.lua: the expiry of a written key, for the drivers of several policies and of leases
-- (check_one.lua computes it inline).

-- The PX argument (milliseconds, formatted with %d) for a key written at `now` so that it
-- disappears at `idle_at` (rounded up to the next millisecond, never early: from then on its
-- state equals a fresh one), and never before `ttl_floor` ms.
local function px(idle_at, now, ttl_floor)
  local ms = floor((idle_at - now + 999) / 1000)
  if ms < 1 then
    ms = 1
  end
  if ms < ttl_floor then
    ms = ttl_floor
  end
  return fmt('%d', ms)
end
