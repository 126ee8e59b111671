-- naive_token_bucket.lua: the baseline `cargo xtask bench` (section redis) compares against,
-- NOT used by tollgate. A token bucket the way it is commonly written: a hash with a float token count
-- and a float timestamp, HMGET + HSET + PEXPIRE on every call, refill in floating point.
--
-- KEYS[1]  the bucket
-- ARGV[1]  capacity (tokens)
-- ARGV[2]  refill rate (tokens per second, a float)
-- ARGV[3]  cost
-- Reply: { allowed (1/0), tokens left (floored) }
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
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
