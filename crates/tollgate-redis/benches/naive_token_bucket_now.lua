-- naive_token_bucket_now.lua: naive_token_bucket.lua with the caller's clock, NOT used by
-- tollgate: the same HMGET + HSET + PEXPIRE with floats, but now (seconds, a float) comes
-- from ARGV[4] instead of Redis TIME, as many published versions take it. `cargo xtask bench`
-- compares it with tollgate's script under clock = local.
--
-- KEYS[1]  the bucket
-- ARGV[1]  capacity (tokens)
-- ARGV[2]  refill rate (tokens per second, a float)
-- ARGV[3]  cost
-- ARGV[4]  now (seconds since the epoch, a float)
-- Reply: { allowed (1/0), tokens left (floored) }
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', key, 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', key, math.ceil((capacity - tokens) / rate * 1000))
return { allowed, math.floor(tokens) }
