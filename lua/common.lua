-- common.lua: what every script of this package shares. Redis scripts
-- cannot load modules, so lua.go prepends this file to each of check.lua,
-- refund.lua, lease.lua and return.lua: each still runs as one script.

-- Redis' own clock, so client clock skew cannot mint tokens. Microseconds
-- fit a double exactly (< 2^53).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- idiv is floor(a / b) for integer-valued doubles below 2^53, corrected
-- for the rounding of the float division, so it equals Go's integer maths.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  return -idiv(-a, b)
end

-- The TTL in ms for a key needed us more microseconds, plus a grace second
-- (algorithm.ttlMicros).
local function ttl_ms(us)
  return ceil_div(math.max(us, 0), 1000) + 1000
end

-- An integer as its exact decimal: tostring() keeps only 14 digits.
local function fmt(n)
  return string.format('%.0f', n)
end

-- The window of now (algorithm.windowAt): index and time elapsed in it. A
-- stored window later than now's (the clock stepped back) stays current,
-- at its start, so counts are never forgotten early.
local function window_at(w, stored)
  local idx = idiv(now, w)
  if stored ~= nil and stored > idx then
    return stored, 0
  end
  return idx, now - idx * w
end

-- extend_ttl sets the key's TTL to ms unless it already lives longer: the
-- coordinator's share.lua may have set a longer TTL to keep the region's
-- share, and shortening it would drop the share while the key idles.
-- (PEXPIRE ... GT would never set a TTL on a key that has none.)
local function extend_ttl(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- tb_rate is a token bucket's tokens per second as Go computes it: Limit /
-- Period.Seconds(), and Seconds() is whole seconds plus nanoseconds/1e9.
-- Doing the same keeps the scripts and package algorithm bit-identical.
local function tb_rate(limit, period_ms)
  local whole = math.floor(period_ms / 1000)
  return limit / (whole + ((period_ms - whole * 1000) * 1000000) / 1e9)
end

-- refill is a token bucket's tokens and timestamp at now, from tokens
-- stored at ts. A clock that steps back must not mint or burn tokens.
local function refill(tokens, ts, rate, burst)
  local elapsed = math.max(now - ts, 0)
  return math.min(burst, tokens + elapsed * rate / 1e6), math.max(ts, now)
end
