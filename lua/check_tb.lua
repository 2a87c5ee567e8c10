-- check_tb.lua: check.lua for a group whose keys are all token buckets,
-- the common case, with the same KEYS, ARGV and reply (see check.lua) and
-- the same maths, stored state and share override; region picks it when
-- every item of a call is a token bucket.
--
-- Speed is why it exists, and in a Redis script most of the cost beyond
-- the Redis commands is allocation: the body runs on every call, so each
-- local function is a new closure and each table a new object for the
-- Lua GC. So this script is self-contained and flat: it does not prepend
-- common.lua (12 closures), builds no per-key tables and calls no helper.
-- Redis calls: one TIME, one HMGET per key, then HSET and PEXPIRE per key
-- when taken (plus PTTL on a shared bucket).
--
-- Its maths is common.lua's tb_rate, refill and tb_ttl and check.lua's
-- token bucket, inlined and in the same order, so IEEE doubles agree bit
-- for bit: the parity tests of package region (TestParityFrozenClock
-- runs this script, TestParityMixedFrozen check.lua) hold both to
-- algorithm.BucketState.
--
-- As in check.lua, nothing is written before every key is known to admit
-- and every TTL is in range (common.lua, MAX_TTL_MS): a denied or failing
-- call writes nothing.

local n = #KEYS
if #ARGV ~= n * 5 then
  return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- s holds 7 values per key: tokens (refilled to now), ts, rate, burst,
-- cost, shared (true, false, or 'stale' for a key of another type, which
-- the commit replaces) and the TTL as PEXPIRE's argument.
local s, allowed = {}, true
if n == 1 then
  -- Sized by its constructor: a table filled from empty is reallocated
  -- as it grows (at 1, 2, 4 and 8 entries). With reply sized too, the
  -- one-key call costs Redis about 4 % less (docs/benchmarks.md).
  s = { false, false, false, false, false, false, false }
end
for i = 1, n do
  local b = (i - 1) * 5
  if ARGV[b + 1] ~= 'tb' then
    return redis.error_reply('ERR allot: check_tb.lua takes token buckets only, not ' .. tostring(ARGV[b + 1]) .. ' for key ' .. KEYS[i])
  end
  local limit, period_ms, burst, cost = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  if not (limit and period_ms and burst and cost) then
    return redis.error_reply('ERR allot: non-numeric argument for key ' .. KEYS[i])
  end
  if limit <= 0 or period_ms <= 0 or burst < 0 or cost < 0 then
    return redis.error_reply('ERR allot: invalid limit, period, burst or cost for key ' .. KEYS[i])
  end
  if burst == 0 then
    burst = limit
  end
  -- tb_rate: Limit / Period.Seconds(), as Go computes it.
  local whole = math.floor(period_ms / 1000)
  local rate = limit / (whole + ((period_ms - whole * 1000) * 1000000) / 1e9)
  local shared, tokens, ts = false, nil, nil
  local h = redis.pcall('HMGET', KEYS[i], 'tokens', 'ts', 'rate', 'burst')
  if h.err then
    -- A key of another type: the limit's algorithm changed (check.lua).
    if not string.find(h.err, 'WRONGTYPE', 1, true) then
      return h
    end
    shared = 'stale'
  else
    tokens, ts = tonumber(h[1]), tonumber(h[2])
    -- A global limit's share, written by the coordinator (share.lua).
    local r, bu = tonumber(h[3]), tonumber(h[4])
    if r and r > 0 and bu and bu > 0 then
      rate, burst, shared = r, bu, true
    end
  end
  if tokens == nil or ts == nil then
    tokens, ts = burst, now -- a missing bucket is full
  else
    -- refill: a clock that steps back must not mint or burn tokens.
    tokens = math.min(burst, tokens + math.max(now - ts, 0) * rate / 1e6)
    ts = math.max(ts, now)
  end
  -- tb_ttl and ttl_arg (common.lua).
  local ms = math.ceil(burst / rate * 1000) + 1000
  if not (ms >= 1 and ms <= 9007199254740) then
    return redis.error_reply('ERR allot: TTL ' .. tostring(ms) .. ' ms out of range [1, 9007199254740] for key ' .. KEYS[i] .. ' (limit numbers beyond algorithm.Spec.Validate)')
  end
  if tokens < cost then
    allowed = false
  end
  local j = (i - 1) * 7
  s[j + 1], s[j + 2], s[j + 3], s[j + 4], s[j + 5], s[j + 6], s[j + 7] = tokens, ts, rate, burst, cost, shared, string.format('%.0f', ms)
end

local reply
if n == 1 then
  reply = { allowed and 1 or 0, 0, 0, 0 } -- sized, as s above
else
  reply = { allowed and 1 or 0 }
end
for i = 1, n do
  local j = (i - 1) * 7
  local tokens, rate, burst, cost = s[j + 1], s[j + 3], s[j + 4], s[j + 5]
  local retry = 0
  if cost > burst then
    retry = -1
  elseif tokens < cost then
    retry = math.ceil((cost - tokens) / rate * 1e6)
  end
  if allowed then
    local key, shared, ttl = KEYS[i], s[j + 6], s[j + 7]
    tokens = tokens - cost
    if shared == 'stale' then
      redis.call('DEL', key)
    end
    -- Numbers go to Redis as %.17g or shortest round-trip strings: the
    -- float survives exactly; integers go as '%.0f' (see common.lua).
    redis.call('HSET', key, 'tokens', tokens, 'ts', string.format('%.0f', s[j + 2]))
    -- extend_ttl: a shared bucket keeps the coordinator's longer TTL.
    if shared ~= true or redis.call('PTTL', key) < tonumber(ttl) then
      redis.call('PEXPIRE', key, ttl)
    end
  end
  reply[3 * i - 1] = math.floor(tokens)
  reply[3 * i] = retry
  reply[3 * i + 1] = math.ceil((burst - tokens) / rate * 1e6)
end
return reply
