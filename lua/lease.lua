-- lease.lua: lease tokens from the region buckets of ONE subject, for a
-- node that will spend them in memory (precision: leased).
--
-- KEYS[i]  bucket key (the exact path's key; all keys share a hash tag).
-- ARGV     5 values per key, in key order:
--          limit, period_ms, burst (0 = limit), need, want.
--            need  tokens that must be granted for the call to succeed
--                  (the cost of a waiting request; 0 for a background
--                  refill, which takes whatever is there up to want)
--            want  tokens asked for (>= need): the node's grant size
--
-- The bucket is the exact path's token bucket (fields tokens, ts). When the
-- hash holds 'rate' (tokens/s) and 'burst' (written by the multi-region
-- coordinator: the region's share of a global limit) those override the
-- policy numbers in ARGV.
--
-- All-or-nothing on need: if any key has fewer than its need tokens,
-- nothing is granted anywhere (a denial changes no tokens; it only adds
-- want to the 'wanted' counter of buckets that exist). Otherwise each key
-- grants min(want, floor(tokens)) (>= need) and counts it in 'granted'.
--
-- Returns {ok (1/0), then per key: granted, left, retry_us, burst, rate,
-- shared}:
--   granted   whole tokens granted (0 when ok is 0)
--   left      whole tokens left in the bucket after the grant
--   retry_us  0 if this key could give its need now, -1 if never
--             (need > burst), else microseconds until it could
--   burst     effective burst (policy or coordinator share)
--   rate      effective rate in tokens/s, as a string (may be fractional)
--   shared    1 while RLQS clients hold parts of the bucket (part.lua's
--             'parts' field), else 0: their use is charged after the
--             fact, so a node cannot see them in the tokens it finds
--
-- Every key is read and its new fields and TTL computed before the first
-- write, so a failing call writes nothing. 'granted' and 'wanted' are
-- summed here and written with the tokens in one HSET (not HINCRBY,
-- which can fail on overflow after the tokens were written).

-- now, idiv, ceil_div, ttl_ms, fmt, ttl_arg, ttl_error, count, window_at,
-- extend_ttl, tb_rate, tb_ttl and refill come from common.lua, which
-- lua.go prepends.

local n = #KEYS
if #ARGV ~= n * 5 then
  return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end

local function params(i)
  local b = (i - 1) * 5
  local p = {
    limit = count(ARGV[b + 1]),
    period_ms = count(ARGV[b + 2]),
    burst = count(ARGV[b + 3]),
    need = tonumber(ARGV[b + 4]),
    want = tonumber(ARGV[b + 5]),
  }
  if not (p.limit and p.period_ms and p.burst) then
    return nil, 'ERR allot: limit, period and burst must be whole numbers in [0, 2^53] for key ' .. KEYS[i]
  end
  -- Like a cost (params.lua), need and want are only compared and summed
  -- into counters: any number >= 0 will do.
  if not (p.need and p.want) then
    return nil, 'ERR allot: non-numeric need or want for key ' .. KEYS[i]
  end
  if p.limit == 0 or p.period_ms == 0 or p.need < 0 or p.want < p.need then
    return nil, 'ERR allot: invalid limit, period, burst, need or want for key ' .. KEYS[i]
  end
  if p.burst == 0 then
    p.burst = p.limit
  end
  -- Same rate maths as check.lua, so leased and exact agree on a bucket.
  p.rate = tb_rate(p.limit, p.period_ms)
  return p
end

local ps, st, reply = {}, {}, { 1 }
for i = 1, n do
  local p, err = params(i)
  if not p then
    return redis.error_reply(err)
  end
  local h = redis.call('HMGET', KEYS[i], 'tokens', 'ts', 'rate', 'burst', 'granted', 'wanted', 'parts')
  -- A coordinator share overrides the policy's numbers.
  local r, b = tonumber(h[3]), tonumber(h[4])
  if r and r > 0 then
    p.rate = r
  end
  if b and b > 0 then
    p.burst = b
  end
  local tokens, ts = tonumber(h[1]), tonumber(h[2])
  local exists = tokens ~= nil and ts ~= nil
  if not exists then
    tokens, ts = p.burst, now -- a missing bucket is full
  else
    tokens, ts = refill(tokens, ts, p.rate, p.burst)
  end
  local retry = 0
  if p.need > p.burst then
    retry = -1
    reply[1] = 0
  elseif tokens < p.need then
    retry = math.ceil((p.need - tokens) / p.rate * 1e6)
    reply[1] = 0
  end
  local ms = tb_ttl(p.burst, p.rate)
  local ttl = ttl_arg(ms)
  if not ttl then
    return ttl_error(KEYS[i], ms)
  end
  p.exists, p.ttl = exists, ttl
  ps[i], st[i] = p, { tokens = tokens, ts = ts, retry = retry, granted = tonumber(h[5]) or 0, wanted = tonumber(h[6]) or 0, shared = (tonumber(h[7]) or 0) > now }
end

for i = 1, n do
  local p, s = ps[i], st[i]
  local granted = 0
  if reply[1] == 1 then
    granted = math.min(p.want, math.floor(s.tokens))
    s.tokens = s.tokens - granted
    redis.call('HSET', KEYS[i], 'tokens', s.tokens, 'ts', fmt(s.ts),
      'granted', fmt(s.granted + granted), 'wanted', fmt(s.wanted + p.want))
    extend_ttl(KEYS[i], p.ttl)
  elseif p.exists then
    -- Record the demand a denial could not serve, without touching tokens
    -- or the TTL: the coordinator reads it as unmet demand.
    redis.call('HSET', KEYS[i], 'wanted', fmt(s.wanted + p.want))
  end
  reply[#reply + 1] = granted
  reply[#reply + 1] = math.floor(s.tokens)
  reply[#reply + 1] = s.retry
  reply[#reply + 1] = math.floor(p.burst)
  reply[#reply + 1] = tostring(p.rate)
  reply[#reply + 1] = s.shared and 1 or 0
end
return reply
