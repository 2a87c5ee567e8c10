-- refund.lua: give back what a previous successful check.lua take took,
-- because another subject's group denied the same request.
--
-- KEYS and ARGV as check.lua (algo, limit, period_ms, burst, cost per key).
-- Each key is credited cost as its algorithm allows (algorithm.Refund; the
-- State types' doc comments say what is exact):
--   tb    refill to now, add cost (capped at burst); refreshes the TTL
--   gcra  move TAT back by cost*T, not before now; refreshes the TTL
--   swl   remove the cost newest entries
--   swc   subtract cost from this window's count, the rest from the last
--   fw    subtract cost, if the window is still the current one
-- A missing key is fresh already: nothing to do, nothing created.
--
-- Every key is read and its writes planned first; the writes run only once
-- every plan is in range, so a failing refund writes nothing.
--
-- Returns the number of keys credited.

-- now, idiv, ceil_div, ttl_ms, fmt, ttl_arg, ttl_error, count, window_at,
-- extend_ttl, tb_rate, tb_ttl and refill come from common.lua, and params
-- and all_params from params.lua, which lua.go prepends.

-- A key of another type (the limit's algorithm changed since the take)
-- has nothing of this take to give back: it reads as missing.
local function read(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      return nil
    end
    error(r.err)
  end
  return r
end

-- Each algorithm reads its key and returns the function that writes the
-- credit, nil if there is nothing to credit, or nil and an error reply.
local algos = {}

algos.tb = function(key, p)
  -- Same rate and TTL maths as check.lua (see there).
  local rate, burst = tb_rate(p.limit, p.period_ms), p.burst
  local h = read('HMGET', key, 'tokens', 'ts', 'rate', 'burst')
  if h == nil then
    return nil
  end
  local tokens, ts = tonumber(h[1]), tonumber(h[2])
  if tokens == nil or ts == nil then
    return nil
  end
  -- A coordinator's share overrides ARGV (see check.lua).
  local r, b = tonumber(h[3]), tonumber(h[4])
  local shared = r and r > 0 and b and b > 0
  if shared then
    rate, burst = r, b
  end
  tokens, ts = refill(tokens, ts, rate, burst)
  tokens = math.min(burst, tokens + p.cost)
  local ms = tb_ttl(burst, rate)
  local ttl = ttl_arg(ms)
  if not ttl then
    return nil, ttl_error(key, ms)
  end
  return function()
    redis.call('HSET', key, 'tokens', tokens, 'ts', fmt(ts))
    if shared then
      extend_ttl(key, ttl)
    else
      redis.call('PEXPIRE', key, ttl)
    end
  end
end

algos.gcra = function(key, p)
  local tat = tonumber(read('HGET', key, 'tat'))
  if tat == nil then
    return nil
  end
  local T = math.max(ceil_div(p.window, p.limit), 1)
  -- Capping cost at burst changes nothing (TAT is never more than
  -- burst*T ahead) and mirrors the Go overflow guard.
  tat = math.max(tat - math.min(p.cost, p.burst) * T, now)
  local ms = ttl_ms(p.burst * T)
  local ttl = ttl_arg(ms)
  if not ttl then
    return nil, ttl_error(key, ms)
  end
  return function()
    redis.call('HSET', key, 'tat', fmt(tat))
    redis.call('PEXPIRE', key, ttl)
  end
end

algos.swl = function(key, p)
  local n = read('ZCARD', key)
  if n == nil or n == 0 then
    return nil
  end
  return function()
    if p.cost > 0 then
      redis.call('ZPOPMAX', key, fmt(math.min(p.cost, n)))
    end
  end
end

algos.swc = function(key, p)
  local h = read('HMGET', key, 'swc_win', 'swc_curr', 'swc_prev')
  if h == nil then
    return nil
  end
  local win, curr, prev = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
  if win == nil or curr == nil or prev == nil then
    return nil
  end
  local idx = window_at(p.window, win)
  if win < idx - 1 then
    curr, prev = 0, 0
  elseif win == idx - 1 then
    curr, prev = 0, curr
  end
  local from_curr = math.min(curr, p.cost)
  curr = curr - from_curr
  prev = prev - math.min(prev, p.cost - from_curr)
  return function()
    redis.call('HSET', key, 'swc_win', fmt(idx), 'swc_curr', fmt(curr), 'swc_prev', fmt(prev))
  end
end

algos.fw = function(key, p)
  local h = read('HMGET', key, 'fw_win', 'fw_n')
  if h == nil then
    return nil
  end
  local win, n = tonumber(h[1]), tonumber(h[2])
  if win == nil or n == nil or win ~= window_at(p.window, win) then
    return nil
  end
  return function()
    redis.call('HSET', key, 'fw_n', fmt(n - math.min(n, p.cost)))
  end
end

-- Validate everything, then plan every key, before writing anything.
local ps, err = all_params(algos)
if err then
  return err
end

local writes = {}
for i = 1, #KEYS do
  local w, e = algos[ps[i].algo](KEYS[i], ps[i])
  if e then
    return e
  end
  writes[#writes + 1] = w
end
for _, w in ipairs(writes) do
  w()
end
return #writes
