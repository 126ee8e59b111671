-- packed.lua: reading the packed states of every algorithm but GCRA (whose state is one
-- decimal integer, so its single-policy script goes without this file: Redis runs a
-- script's whole chunk on every call, definitions included).

local byte = string.byte
local unpack_bin = struct.unpack

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
