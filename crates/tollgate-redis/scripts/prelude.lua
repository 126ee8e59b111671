-- prelude.lua: helpers shared by the algorithm files. The Rust side prepends the bounds
-- (MAX_LIMIT, MAX_PERIOD, MAX_BURST_SPAN, MAX_LOG_LIMIT, MAX_INT) generated from
-- tollgate-core's constants, so the script and the core can never disagree on them.
--
-- Numbers in Redis' Lua 5.1 are doubles. Every value here is an integer below 2^53 (the
-- quota bounds guarantee it), so +, -, * and comparisons are exact. Division is the one
-- operation that rounds: math.floor(a / b) is still exact for 0 <= a < 2^53 and b >= 1,
-- because a quotient k - r/b (r >= 1) is at least 1/b away from k while a double near
-- k = a/b is off by at most k * 2^-53 < 1/b.

local floor = math.floor
local byte = string.byte
local pack = struct.pack
local unpack_bin = struct.unpack

-- Milliseconds for PX so that a key written at `now` disappears at `idle_at` (rounded up to
-- the next millisecond, never early): from then on its state equals a fresh one.
local function ttl_ms(idle_at, now)
  local ms = floor((idle_at - now + 999) / 1000)
  if ms < 1 then
    return 1
  end
  return ms
end

-- A packed state: one tag byte, then `n` unsigned 7-byte big-endian integers (< 2^56, and
-- ours are < 2^53). Returns nil for a missing key or a value of another shape (another
-- algorithm's state after a policy changed algorithm): the caller starts fresh, as the core
-- does.
local function unpack_state(raw, tag, n)
  if raw and #raw == 1 + 7 * n and byte(raw, 1) == tag then
    if n == 2 then
      return unpack_bin('>I7I7', raw, 2)
    end
    return unpack_bin('>I7I7I7', raw, 2)
  end
  return nil
end
