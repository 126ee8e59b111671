-- check_set.lua: the driver for a request matched by SEVERAL policies (2 to 8; more use
-- check.lua). Like check_one.lua, the Rust side builds one script per policy set (the shapes
-- (algorithm, limit, period, burst) of its policies, in the request's order), with every
-- quota a constant and every algorithm's decision body written out inline (the body contract
-- is in check_one.lua). Sections start at `-- @<name>` lines; Rust assembles them:
--   head                once, with $N the number of policies ($N1, $N2: N + 1, N + 2);
--   policy              once per policy $I, with its quota ($LIMIT, $PERIOD, $BURST, $T) and
--                       its body in place of `-- @decide`;
--   decided             once: `if denied == 0 then`;
--   commit              once per policy;
--   else                once;
--   uncharged           once per policy (its body again, with cost 0);
--   reply               once, with $FORMAT and $VALUES (four per policy).
--
-- KEYS[1..N]   the policies' state keys (one client: one Redis Cluster slot).
-- ARGV         either nothing (every cost 1, Redis TIME), or: costs 1..N, then optionally now
--              (us; '' = Redis TIME), then optionally a PX floor in milliseconds.
-- Reply:       N x struct '>BI7I7I7': allowed (1/0), remaining, reset_after (us),
--              retry_after + 1 (us; 0: allowed, or retrying never helps). All or nothing: when
--              one policy denies, nothing is written, and the policies that would have allowed
--              report their state uncharged (their body runs again with cost 0).
--
-- Every argument is checked and every key read (one MGET) before the first write.

-- @head
local keys, nargs = KEYS, #ARGV
if #keys ~= $N or (nargs ~= 0 and nargs < $N) or nargs > $N2 then
  return redis.error_reply('ERR tollgate: expected $N keys and 0, $N, $N1 or $N2 ' ..
    'arguments (costs, now, PX floor), got ' .. #keys .. ' keys and ' .. nargs .. ' arguments')
end
local now, ttl_floor, denied = nil, 0, 0
-- @clock
local raws = redis.call('MGET', unpack(keys))

-- @policy
local ok_$I, remaining_$I, reset_$I, retry_$I, value_$I, idle_$I, cost_$I
do
  local cost = 1
-- @cost
  local raw, limit, p, burst, t = raws[$I], $LIMIT, $PERIOD, $BURST, $T
  local ok, remaining, reset, retry, value, idle_at
  do
-- @decide
  end
  if not ok then
    denied = denied + 1
  end
  ok_$I, remaining_$I, reset_$I, retry_$I, value_$I, idle_$I, cost_$I =
    ok, remaining, reset, retry, value, idle_at, cost
end

-- @decided
if denied == 0 then

-- @commit
  if cost_$I > 0 then
-- @write
  end

-- @else
else

-- @uncharged
  if ok_$I and cost_$I > 0 then
    local raw, cost, limit, p, burst, t = raws[$I], 0, $LIMIT, $PERIOD, $BURST, $T
    local ok, remaining, reset, retry, value, idle_at
    do
-- @decide
    end
    remaining_$I, reset_$I = remaining, reset
  end

-- @reply
end
return struct.pack('$FORMAT', $VALUES)
