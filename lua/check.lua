-- check.lua: all-or-nothing take over the buckets of ONE subject.
--
-- KEYS[i]  bucket key; all keys share a hash tag, so one slot.
-- ARGV     5 values per key, in key order:
--          algo code ("tb"), limit, period_ms, burst (0 = limit), cost.
--
-- Phase 1 checks every key; phase 2 commits every key, and only runs when
-- every key admits its cost. A denial writes nothing, so a denied request
-- neither spends tokens nor extends any TTL.
--
-- Returns {allowed (1/0), then per key: remaining, retry_us, reset_us}:
--   remaining  whole tokens after the take (current tokens if the group
--              was denied, as nothing was taken)
--   retry_us   0 if this key alone admits cost now, -1 if never
--              (cost > burst), else microseconds until it would
--   reset_us   microseconds until the bucket is full
--
-- The maths is the twin of algorithm.BucketState (Refill, Check, TTL):
-- same state, same formulas in the same order, so the IEEE doubles agree.

-- Redis' own clock, so client clock skew cannot mint tokens. Microseconds
-- fit a double exactly (< 2^53).
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
  -- Go computes Limit / Period.Seconds(), and Seconds() is whole seconds
  -- plus nanoseconds/1e9. Doing the same keeps the rate bit-identical.
  local whole = math.floor(p.period_ms / 1000)
  local secs = whole + ((p.period_ms - whole * 1000) * 1000000) / 1e9
  p.rate = p.limit / secs
  p.ttl_ms = math.ceil(p.burst / p.rate * 1000) + 1000
  return p
end

-- Each algorithm has:
--   check(key, p)           read and refill the state, decide; no writes.
--                           Returns ok and a state table for the others.
--   commit(key, p, st)      write the state after taking p.cost.
--   report(p, st, taken)    remaining, retry_us, reset_us; taken says
--                           whether the whole group was admitted, so a
--                           key that alone would pass still reports its
--                           untouched tokens when another key denied.
-- New algorithms add an entry here.
local algos = {}

algos.tb = {
  check = function(key, p)
    local h = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens, ts = tonumber(h[1]), tonumber(h[2])
    if tokens == nil or ts == nil then
      tokens, ts = p.burst, now -- a missing bucket is full
    else
      local elapsed = now - ts
      if elapsed < 0 then
        elapsed = 0 -- a clock that steps back must not mint or burn tokens
      end
      tokens = math.min(p.burst, tokens + elapsed * p.rate / 1e6)
      if now > ts then
        ts = now
      end
    end
    return tokens >= p.cost, { tokens = tokens, ts = ts }
  end,
  commit = function(key, p, st)
    -- Numbers passed to redis.call are formatted with 17 significant
    -- digits, so the stored float round-trips exactly.
    redis.call('HSET', key, 'tokens', st.tokens - p.cost, 'ts', st.ts)
    redis.call('PEXPIRE', key, p.ttl_ms)
  end,
  report = function(p, st, taken)
    local retry = 0
    if p.cost > p.burst then
      retry = -1
    elseif st.tokens < p.cost then
      retry = math.ceil((p.cost - st.tokens) / p.rate * 1e6)
    end
    local left = st.tokens
    if taken then
      left = st.tokens - p.cost
    end
    return math.floor(left), retry, math.ceil((p.burst - left) / p.rate * 1e6)
  end,
}

local n = #KEYS
if #ARGV ~= n * 5 then
  return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end

local ps, states, allowed = {}, {}, true
for i = 1, n do
  local p = params(i)
  if p.err then
    return p
  end
  local a = algos[p.algo]
  if a == nil then
    return redis.error_reply('ERR allot: unknown algorithm ' .. tostring(p.algo))
  end
  local ok, st = a.check(KEYS[i], p)
  allowed = allowed and ok
  ps[i], states[i] = p, st
end

local reply = { allowed and 1 or 0 }
for i = 1, n do
  local a = algos[ps[i].algo]
  if allowed then
    a.commit(KEYS[i], ps[i], states[i])
  end
  local remaining, retry, reset = a.report(ps[i], states[i], allowed)
  reply[#reply + 1] = remaining
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
