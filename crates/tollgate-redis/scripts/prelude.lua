-- prelude.lua: helpers shared by the multi-policy and lease drivers. The Rust side prepends the bounds
-- (MAX_LIMIT, MAX_PERIOD, MAX_BURST_SPAN, MAX_LOG_LIMIT, MAX_INT) generated from
-- tollgate-core's constants, so the script and the core can never disagree on them.
--
-- Numbers in Redis' Lua 5.1 are doubles. Every value here is an integer below 2^53 (the
-- quota bounds guarantee it), so +, -, * and comparisons are exact. Division is the one
-- operation that rounds: math.floor(a / b) is still exact for 0 <= a < 2^53 and b >= 1,
-- because a quotient k - r/b (r >= 1) is at least 1/b away from k while a double near
-- k = a/b is off by at most k * 2^-53 < 1/b.

local floor = math.floor
local pack = struct.pack
-- Integers go to redis.call as strings formatted with %d here (Redis prints a Lua number
-- argument itself, with %.17g). The generated plan and batch scripts pass a write's PX as a
-- number instead: in the batch script that costs Redis less CPU, as it makes no Lua string
-- (about 2.5 % a plan, docs/benchmarks.md, thirty-seventh session); these drivers were not
-- measured so.
local fmt = string.format
