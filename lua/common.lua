-- common.lua: what the scripts of this package share. Redis scripts
-- cannot load modules, so lua.go and coord.go prepend this file to every
-- script but check_tb.lua (which inlines what it needs): each still runs
-- as one script.

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

-- A script must never fail after its first write (it would leave a half
-- update, e.g. tokens debited on a key that never expires): each computes
-- its TTLs, and every other argument of its writes, before writing, and
-- returns an error instead if one is out of range.
--
-- MAX_TTL_MS is the largest TTL a script sets: 2^53 µs in ms, so it is an
-- exact integer, PEXPIRE (which adds now in ms) cannot overflow, and a Go
-- time.Duration holds it. algorithm.Spec.Validate keeps valid specs 4x
-- below it (algorithm/bounds.go); this catches whatever bypassed that.
local MAX_TTL_MS = 9007199254740

-- ttl_arg is a TTL in ms as PEXPIRE's argument, or nil if out of range.
-- Integers go to redis.call as '%.0f' strings: Redis formats a Lua number
-- as %.17g (7.0) or its shortest form (7.2+), either of which can give
-- '1e+17' or '1e+08', which PEXPIRE rejects.
local function ttl_arg(ms)
  if ms >= 1 and ms <= MAX_TTL_MS then -- false for NaN too
    return fmt(ms)
  end
  return nil
end

-- ttl_error is the error reply for a TTL ttl_arg refused.
local function ttl_error(key, ms)
  return redis.error_reply('ERR allot: TTL ' .. tostring(ms) .. ' ms out of range [1, ' .. MAX_TTL_MS .. '] for key ' .. key .. ' (limit numbers beyond algorithm.Spec.Validate)')
end

-- count is ARGV string s as a whole number in [0, 2^53], or nil: the Go
-- side sends only int64s, and only those the scripts compute exactly.
local function count(s)
  local x = tonumber(s)
  if x and x >= 0 and x <= 9007199254740992 and x == math.floor(x) then
    return x
  end
  return nil
end

-- extend_ttl sets the key's TTL to ms (a ttl_arg string) unless it already
-- lives longer: the coordinator's share.lua may have set a longer TTL to
-- keep the region's share, and shortening it would drop the share while
-- the key idles. (PEXPIRE ... GT would never set a TTL on a key that has
-- none.)
local function extend_ttl(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
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

-- tb_ttl is a token bucket's TTL in ms: the time to refill from empty
-- plus the grace second (algorithm.Spec.TTL).
local function tb_ttl(burst, rate)
  return math.ceil(burst / rate * 1000) + 1000
end

-- refill is a token bucket's tokens and timestamp at now, from tokens
-- stored at ts. A clock that steps back must not mint or burn tokens.
local function refill(tokens, ts, rate, burst)
  local elapsed = math.max(now - ts, 0)
  return math.min(burst, tokens + elapsed * rate / 1e6), math.max(ts, now)
end
