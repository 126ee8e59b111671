-- ttl.lua: the expiry of a written key, for the drivers of several policies and of leases
-- (check_one.lua computes it inline).

-- Milliseconds for PX so that a key written at `now` disappears at `idle_at` (rounded up to
-- the next millisecond, never early): from then on its state equals a fresh one.
local function ttl_ms(idle_at, now)
  local ms = floor((idle_at - now + 999) / 1000)
  if ms < 1 then
    return 1
  end
  return ms
end
