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
-- Every key is read and its TTL computed before the first write, so a
-- failing call writes nothing.
--
-- Returns the whole tokens credited in total.

-- now, idiv, ceil_div, ttl_ms, fmt, ttl_arg, ttl_error, count, window_at,
-- extend_ttl, tb_rate, tb_ttl and refill come from common.lua, which
-- lua.go prepends.

local n = #KEYS
if #ARGV ~= n * 5 then
  return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end

local credited, writes = 0, {}
for i = 1, n do
  local b = (i - 1) * 5
  local limit, period_ms, burst = count(ARGV[b + 1]), count(ARGV[b + 2]), count(ARGV[b + 3])
  local unspent, age = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  if not (limit and period_ms and burst) then
    return redis.error_reply('ERR allot: limit, period and burst must be whole numbers in [0, 2^53] for key ' .. KEYS[i])
  end
  if not (unspent and age) then
    return redis.error_reply('ERR allot: non-numeric unspent or age for key ' .. KEYS[i])
  end
  if limit == 0 or period_ms == 0 or unspent < 0 or age < 0 then
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
    local ms = tb_ttl(burst, rate)
    local ttl = ttl_arg(ms)
    if not ttl then
      return ttl_error(KEYS[i], ms)
    end
    writes[#writes + 1] = { KEYS[i], tokens, fmt(ts), fmt(granted), ttl }
  end
end
for _, w in ipairs(writes) do
  redis.call('HSET', w[1], 'tokens', w[2], 'ts', w[3], 'granted', w[4])
  extend_ttl(w[1], w[5])
end
return math.floor(credited)
