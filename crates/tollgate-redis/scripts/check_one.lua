-- check_one.lua: the driver for a request matched by ONE policy, the common case. The Rust
-- side builds one script per policy shape (algorithm, limit, period, burst): the bounds, then
--   local limit, p, burst, t = <integers>
--   local REPLY_BASE, REPLY_RESET_BOUND = <integers>
-- then this file, with that algorithm's decision body written out in place of the
-- `@decide` line below, and cost.lua, clock.lua and write.lua at `@cost`, `@clock` and
-- `@write`. The quota is a constant of the script, checked in Rust by
-- tollgate-core (and against the Lua bounds) when the script is built, so a call carries and
-- validates only what changes per request. Requests with several policies use check.lua,
-- which takes the quotas as arguments and runs the same bodies as functions.
--
-- The decision body contract (every scripts/<algorithm>.lua is one):
--   reads   raw (the state key's value, false when missing), now (us), limit, p (period, us),
--           burst, t (emission interval, us), cost; it never assigns them (a body that clamps
--           a clock that went back does so on a local copy of now);
--   sets    ok, remaining, reset (reset_after, us), retry (retry_after, us; -1: never), and,
--           when ok and cost > 0, value (the new state) and idle_at (the instant the state
--           equals a fresh one again).
-- A body is one block without return or break: the same text runs inline here and inside
-- a function in check.lua and lease.lua.
--
-- Why so lean: this script's cost inside Redis is the ceiling of every gateway sharing it,
-- and Redis charges per argument (a Lua string and a table slot each), per conversion
-- (tonumber parses twice; a number passed to redis.call is printed with %.17g), per closure,
-- per global lookup, and per table reply (several thousand instructions each; measured with
-- callgrind, see docs/benchmarks.md). So: no helper functions and no closures at all (the
-- body is inline), at most three arguments, integers passed to SET as strings formatted with
-- %d, an integer reply in the common case.
--
-- KEYS[1]  the state of the policy: <prefix>:{<client>}:<policy>.
-- ARGV[1]  optional: cost, an integer in [0, 2^53]; absent = 1 (the common call has no
--          argument at all).
-- ARGV[2]  optional: now in microseconds since the epoch; absent or '' = Redis TIME.
-- ARGV[3]  optional: PX floor in milliseconds (tests that drive a local clock).
-- Reply:   allowed: the integer reset_after * REPLY_BASE + remaining when the quota's bounds
--          let it fit below 2^53, else a packed string, struct '>BI7I7': 1, remaining,
--          reset_after. Denied: struct '>BI7I7I7': 0, remaining, reset_after (us),
--          retry_after + 1 (us; 0: retrying never helps).
--
-- Why Lua, and why decide before writing: see check.lua. Here the only write is the last
-- command, after every argument was checked and the key was read.

-- Errors are returned, not raised: no `fail` closure to build on every call.
local keys, nargs = KEYS, #ARGV
local key = keys[1]
if #keys ~= 1 or nargs > 3 then
  return redis.error_reply('ERR tollgate: expected 1 key and 0 to 3 arguments (cost, now, ' ..
    'PX floor), got ' .. #keys .. ' keys and ' .. nargs .. ' arguments')
end
local cost, now, ttl_floor = 1, nil, 0
-- @cost
-- @clock

local raw = redis.call('GET', key)
local ok, remaining, reset, retry, value, idle_at
do
-- @decide
end
if not ok then
  return struct.pack('>BI7I7I7', 0, remaining, reset, retry + 1)
end
if cost > 0 then
-- @write
end
-- An integer is the cheapest reply: reset_after * REPLY_BASE + remaining, when the Rust side
-- proved at build time that every value fits below 2^53 (REPLY_BASE = 0 otherwise).
if remaining < REPLY_BASE and reset < REPLY_RESET_BOUND then
  return reset * REPLY_BASE + remaining
end
return struct.pack('>BI7I7', 1, remaining, reset)
