-- concurrency.lua: requests in flight, ported from tollgate-core's algorithms/concurrency.rs.
--
-- A decision body (the contract is in script.rs): `limit` is the most units held at once and
-- `p` is hold_ttl. Holds are counted in buckets of width w = floor(p / 8) (at least 1 us), by
-- the instant they were taken or last renewed; a bucket starting at s is dropped at
-- s + 2w + p, so a holder that dies (stops renewing) frees its holds after hold_ttl, and no
-- per-request record exists that could leak. Releases and renewals are `settle.lua`'s.
--
-- State: one string key, "H" then per live bucket its start and count (7 bytes each,
-- big-endian), oldest first. Missing (or another algorithm's value) is nothing held. The key
-- expires when its newest bucket does.
--
local w = p - p % 8
w = w / 8
if w < 1 then
  w = 1
end
local span = 2 * w + p
local starts, counts, held = {}, {}, 0
if raw and #raw > 1 and (#raw - 1) % 14 == 0 and string.byte(raw, 1) == 72 then
  for i = 0, (#raw - 1) / 14 - 1 do
    local s, c = struct.unpack('>I7I7', raw, 2 + 14 * i)
    if c > 0 and s + span > now then
      starts[#starts + 1], counts[#counts + 1] = s, c
      held = held + c
    end
  end
end
ok, remaining, reset, retry = false, 0, 0, -1
if limit > held then
  remaining = limit - held
end
if held > 0 then
  reset = starts[#starts] + span - now
  if reset > 1000000 then
    reset = 1000000
  end
end
if cost <= limit and held + cost <= limit then
  ok, remaining = true, limit - held - cost
  if cost > 0 then
    local b = now - now % w
    local at = #starts + 1
    for i = 1, #starts do
      if starts[i] >= b then
        at = i
        break
      end
    end
    if starts[at] == b then
      counts[at] = counts[at] + cost
    else
      table.insert(starts, at, b)
      table.insert(counts, at, cost)
    end
    local parts = { 'H' }
    for i = 1, #starts do
      parts[i + 1] = struct.pack('>I7I7', starts[i], counts[i])
    end
    value = table.concat(parts)
    idle_at = starts[#starts] + span
    reset = idle_at - now
    if reset > 1000000 then
      reset = 1000000
    end
  end
elseif cost <= limit then
  local need, at = held + cost - limit, now
  for i = 1, #starts do
    at = starts[i] + span
    if counts[i] >= need then
      break
    end
    need = need - counts[i]
  end
  retry = at - now
  if retry > 1000000 then
    retry = 1000000
  end
  if retry < 1 then
    retry = 1
  end
end
