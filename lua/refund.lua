-- refund.lua: give back what a previous successful check.lua take took,
-- because another subject's group denied the same request.
--
-- KEYS and ARGV as check.lua (algo, limit, period_ms, burst, cost per key).
-- Each existing bucket is refilled to now, credited cost (capped at burst)
-- and written back. A missing bucket is full already: nothing to do.
--
-- Returns the number of buckets credited.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function params(i)
  local b = (i - 1) * 5
  local p = {
    algo = ARGV[b + 1],
    limit = tonumber(ARGV[b + 2]),
    period_ms = tonumber(ARGV[b + 3]),
    burst = tonumber(ARGV[b + 4]),
    cost = tonumber(ARGV[b + 5]),
  }
  if not (p.limit and p.period_ms and p.burst and p.cost) then
    return redis.error_reply('ERR allot: non-numeric argument for key ' .. KEYS[i])
  end
  if p.limit <= 0 or p.period_ms <= 0 or p.burst < 0 or p.cost < 0 then
    return redis.error_reply('ERR allot: invalid limit, period, burst or cost for key ' .. KEYS[i])
  end
  if p.burst == 0 then
    p.burst = p.limit
  end
  -- Same rate and TTL maths as check.lua (see there).
  local whole = math.floor(p.period_ms / 1000)
  local secs = whole + ((p.period_ms - whole * 1000) * 1000000) / 1e9
  p.rate = p.limit / secs
  p.ttl_ms = math.ceil(p.burst / p.rate * 1000) + 1000
  return p
end

local algos = {}

algos.tb = {
  refund = function(key, p)
    local h = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens, ts = tonumber(h[1]), tonumber(h[2])
    if tokens == nil or ts == nil then
      return 0
    end
    local elapsed = now - ts
    if elapsed < 0 then
      elapsed = 0
    end
    tokens = math.min(p.burst, tokens + elapsed * p.rate / 1e6)
    if now > ts then
      ts = now
    end
    tokens = math.min(p.burst, tokens + p.cost)
    redis.call('HSET', key, 'tokens', tokens, 'ts', ts)
    redis.call('PEXPIRE', key, p.ttl_ms)
    return 1
  end,
}

local n = #KEYS
if #ARGV ~= n * 5 then
  return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end

-- Validate everything before writing anything.
local ps = {}
for i = 1, n do
  local p = params(i)
  if p.err then
    return p
  end
  if algos[p.algo] == nil then
    return redis.error_reply('ERR allot: unknown algorithm ' .. tostring(p.algo))
  end
  ps[i] = p
end

local credited = 0
for i = 1, n do
  credited = credited + algos[ps[i].algo].refund(KEYS[i], ps[i])
end
return credited
