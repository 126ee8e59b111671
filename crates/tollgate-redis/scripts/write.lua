  -- write.lua: written out by the Rust side in check_one.lua and check_set.lua (at their
  -- `-- @write` line) for one charged policy: SET $KEY $VALUE, expiring at $IDLE.
  -- PX so that the key disappears at the idle instant (rounded up to the next millisecond,
  -- never early): from then on its state equals a fresh one. ttl.lua's px() computes the same
  -- for check.lua and lease.lua; calling it here cost ~1,000 instructions per call more
  -- (callgrind, GCRA: 49,600 and 49,200 against 48,200 and 48,300 inline). %d truncates,
  -- which for a positive quotient is the floor: no math.floor call; comparing the quotient
  -- with the integers 1 and ttl_floor gives what comparing its floor would.
  local ms = ($IDLE - now + 999) / 1000
  if ms < 1 then
    ms = 1
  end
  if ms < ttl_floor then
    ms = ttl_floor
  end
  -- GET turns SET's reply into a bulk string (nil for a new key): a status reply becomes a
  -- Lua table, which costs more (callgrind: -750 instructions per call).
  redis.call('SET', $KEY, $VALUE, 'PX', string.format('%d', ms), 'GET')
