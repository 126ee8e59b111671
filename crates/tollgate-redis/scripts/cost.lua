-- cost.lua: written out by the Rust side in check_one.lua and check_set.lua (at their
-- `-- @cost` line), with the position of the policy's cost argument filled in. The driver
-- declares `nargs` and `cost` (1) before it; a call without arguments charges 1.
if nargs > 0 then
  -- A cost of 1 is nearly every call: comparing interned strings is cheaper than parsing.
  local given = ARGV[$COST]
  if given ~= '1' then
    cost = tonumber(given)
    if not cost or cost % 1 ~= 0 or cost < 0 or cost > MAX_INT then
      return redis.error_reply('ERR tollgate: ARGV[$COST] (cost) must be an integer in ' ..
        '[0, 2^53]')
    end
  end
end
