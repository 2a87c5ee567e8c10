-- return.lua: give back tokens a node leased (lease.lua) and did not spend,
-- when it shuts down or a quiet key's lease is dropped early.
--
-- KEYS[i]  bucket key.
-- ARGV     5 values per key: limit, period_ms, burst (0 = limit),
--          unspent, age_us.
--            unspent  tokens the node held and will never spend
--            age_us   how long ago (node clock, from before the lease
--                     call was sent, so never shorter than the true age)
--                     the lease that held them was asked for
--
-- The credit is max(0, unspent - rate * age): a returned token re-enters
-- the bucket only for what the bucket has not already refilled since the
-- grant. This is what keeps the overshoot bound (ARCHITECTURE.md, "The
-- overshoot bound") free of the number of nodes: without the decay a
-- return would restart a token's lease life (see the proof there). The credit is capped at the burst, and
-- 'granted' is lowered by unspent (it then counts tokens really used or
-- lost). A missing bucket is full already: nothing to do.
--
-- Returns the whole tokens credited in total.

-- now, idiv, ceil_div, ttl_ms, fmt, window_at, extend_ttl, tb_rate and
-- refill come from common.lua, which lua.go prepends.

local n = #KEYS
if #ARGV ~= n * 5 then
  return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end

local credited = 0
for i = 1, n do
  local b = (i - 1) * 5
  local limit, period_ms, burst = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local unspent, age = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  if not (limit and period_ms and burst and unspent and age) then
    return redis.error_reply('ERR allot: non-numeric argument for key ' .. KEYS[i])
  end
  if limit <= 0 or period_ms <= 0 or burst < 0 or unspent < 0 or age < 0 then
    return redis.error_reply('ERR allot: invalid limit, period, burst, unspent or age for key ' .. KEYS[i])
  end
  if burst == 0 then
    burst = limit
  end
  local rate = tb_rate(limit, period_ms)
  local h = redis.call('HMGET', KEYS[i], 'tokens', 'ts', 'rate', 'burst', 'granted')
  local r, bb = tonumber(h[3]), tonumber(h[4])
  if r and r > 0 then
    rate = r
  end
  if bb and bb > 0 then
    burst = bb
  end
  local tokens, ts = tonumber(h[1]), tonumber(h[2])
  if tokens ~= nil and ts ~= nil and unspent > 0 then
    tokens, ts = refill(tokens, ts, rate, burst)
    local credit = math.max(0, unspent - rate * age / 1e6)
    local before = tokens
    tokens = math.min(burst, tokens + credit)
    credited = credited + (tokens - before)
    local granted = math.max(0, (tonumber(h[5]) or 0) - unspent)
    redis.call('HSET', KEYS[i], 'tokens', tokens, 'ts', ts, 'granted', granted)
    extend_ttl(KEYS[i], math.ceil(burst / rate * 1000) + 1000)
  end
end
return math.floor(credited)
