-- check_tb.lua: check.lua for groups whose keys are all token buckets,
-- the common case, many groups per call.
--
-- KEYS are the keys of g groups, group after group. ARGV (laid out by
-- lua.AppendCheckTB):
--   ARGV[1]   g, the number of groups
--   ARGV[2]   s, the number of distinct specs the call's keys use
--   then 4 values per spec: algorithm code ('tb'), limit, period in ms,
--             burst
--   then per group: its number of keys n, then per key its spec's index
--             (1 .. s) and its cost
-- The reply has one element per group: check.lua's reply for that group
-- ({allowed, then remaining, retry_us, reset_us per key}), or an error
-- reply for that group alone (a bad spec fails every group using it).
--
-- It also takes check.lua's own layout (lone: ARGV[1] an algorithm code,
-- not a number): one group of all KEYS, answered with check.lua's reply
-- or error, unwrapped. A node sends a pipeline's only check so: for one
-- group the batch layout's wrapping costs Redis about a quarter more
-- (docs/performance.md, "Token-bucket script").
--
-- Why a spec table: the checks that share a call are mostly of a few
-- policies, and a spec's four values, their checks, its rate and its TTL
-- were parsed and computed once per key before; per key the call now
-- carries two values instead of five (docs/performance.md, "Token-bucket
-- script").
--
-- Each group is taken all-or-nothing, as check.lua takes it: nothing of
-- a group is written before every key of it is known to admit and every
-- TTL is in range. Groups are independent and are run in order, each
-- read, decided and written before the next is read, so two groups on
-- one key see each other's takes as two calls would. One TIME serves the
-- whole call: its groups are decided at one instant.
--
-- Why many groups per call: a node sends the checks that queue for one
-- shard while its pipelines are in flight (package region) as one call,
-- so that Redis parses, looks up and enters one script per round trip
-- instead of one per check (docs/performance.md, "Token-bucket script").
--
-- Speed is why this script exists beside check.lua, and in a Redis
-- script most of the cost beyond the Redis commands is allocation: the
-- body runs on every call, so each local function is a new closure and
-- each table a new object for the Lua GC. So it is self-contained and
-- flat: it does not prepend common.lua (12 closures) and calls no helper.
-- Redis calls: one TIME, one HMGET per key, then HSET and PEXPIRE per key
-- when taken (plus PTTL on a shared bucket).
--
-- Its maths is common.lua's tb_rate, refill and tb_ttl and check.lua's
-- token bucket, inlined and in the same order, so IEEE doubles agree bit
-- for bit: the parity tests of package region (TestParityFrozenClock
-- runs this script, TestParityMixedFrozen check.lua) hold both to
-- algorithm.BucketState.

local TTL_MAX = 9007199254740
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- lone: check.lua's own layout (ARGV[1] an algorithm code, not a count),
-- read as one group whose every key has a spec of its own: spec i is
-- ARGV[5i-4 .. 5i-1], key i's cost ARGV[5i].
local g = tonumber(ARGV[1])
local lone = g == nil
local nk, ns, base, stride = 0, 0, 0, 5
if lone then
  g, nk, ns = 1, #KEYS, #KEYS
  if #ARGV ~= nk * 5 then
    return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. nk .. ' keys')
  end
else
  ns, base, stride = tonumber(ARGV[2]), 2, 4
  if g < 1 or g ~= math.floor(g) or not ns or ns < 0 or ns ~= math.floor(ns) or #ARGV < 2 + 4 * ns + g then
    return redis.error_reply('ERR allot: ARGV[1] and ARGV[2] must be the numbers of groups and specs, got ' .. tostring(ARGV[1]) .. ' and ' .. tostring(ARGV[2]))
  end
  local a = 2 + 4 * ns
  for grp = 1, g do
    local m = tonumber(ARGV[a + 1])
    if not m or m < 1 or m ~= math.floor(m) then
      return redis.error_reply('ERR allot: group ' .. grp .. ' has ' .. tostring(ARGV[a + 1]) .. ' keys')
    end
    a = a + 1 + 2 * m
    nk = nk + m
  end
  if nk ~= #KEYS or #ARGV ~= a then
    return redis.error_reply('ERR allot: want ' .. nk .. ' keys and ' .. a .. ' ARGV for ' .. g .. ' groups and ' .. ns .. ' specs, got ' .. #KEYS .. ' and ' .. #ARGV)
  end
end

-- Each spec checked and computed once. sp holds 4 values per spec: rate,
-- burst, the TTL as PEXPIRE's argument, and false; or, for a spec that
-- fails, the text after and before the key in its keys' error (slots 3
-- and 4).
local sp
if ns == 1 then
  sp = { false, false, false, false }
else
  sp = {}
end
for x = 1, ns do
  local b, q = base + (x - 1) * stride, 4 * x
  local code, limit, period_ms, burst = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  sp[q - 3], sp[q - 2], sp[q - 1], sp[q] = false, false, '', false
  if code ~= 'tb' then
    sp[q] = 'ERR allot: check_tb.lua takes token buckets only, not ' .. tostring(code) .. ' for key '
  elseif not (limit and period_ms and burst) then
    sp[q] = 'ERR allot: non-numeric argument for key '
  elseif limit <= 0 or period_ms <= 0 or burst < 0 then
    sp[q] = 'ERR allot: invalid limit, period, burst or cost for key '
  else
    if burst == 0 then
      burst = limit
    end
    -- tb_rate: Limit / Period.Seconds(), as Go computes it.
    local whole = math.floor(period_ms / 1000)
    local rate = limit / (whole + ((period_ms - whole * 1000) * 1000000) / 1e9)
    -- tb_ttl and ttl_arg (common.lua).
    local ms = math.ceil(burst / rate * 1000) + 1000
    if ms >= 1 and ms <= TTL_MAX then
      sp[q - 3], sp[q - 2], sp[q - 1] = rate, burst, string.format('%.0f', ms)
    else
      sp[q - 1], sp[q] = ' (limit numbers beyond algorithm.Spec.Validate)', 'ERR allot: TTL ' .. tostring(ms) .. ' ms out of range [1, ' .. TTL_MAX .. '] for key '
    end
  end
end

-- ts as HSET's argument: most buckets are stamped with now, formatted
-- once ('%.0f' of now, digit for digit).
local nowarg = t[1] .. string.format('%06d', tonumber(t[2]))

-- Tables sized by their constructors where the size is known: a table
-- filled from empty is reallocated as it grows (at 1, 2, 4 and 8
-- entries), and for the common lone check that is most of the script's
-- allocation (docs/performance.md, "Token-bucket script"). s is reused by every group.
local out
if g == 1 then
  out = { false }
else
  out = {}
end
local k0, a = 0, 3 + 4 * ns -- the keys before this group; its ARGV (batch layout)
local s = { false, false, false, false, false, false, false }
for grp = 1, g do
  local n = nk
  if not lone then
    n = tonumber(ARGV[a])
  end
  -- s holds 7 values per key: tokens (refilled to now), ts, rate, burst,
  -- cost, shared (true, false, or 'stale' for a key of another type,
  -- which the commit replaces) and the TTL as PEXPIRE's argument.
  local allowed, err = true, nil
  for i = 1, n do
    local key, x, cost = KEYS[k0 + i], i, nil
    if lone then
      cost = tonumber(ARGV[5 * i])
    else
      x, cost = tonumber(ARGV[a + 2 * i - 1]), tonumber(ARGV[a + 2 * i])
      if not x or x < 1 or x > ns or x ~= math.floor(x) then
        err = redis.error_reply('ERR allot: no spec ' .. tostring(ARGV[a + 2 * i - 1]) .. ' for key ' .. key)
        break
      end
    end
    local q = 4 * x
    if sp[q] then
      err = redis.error_reply(sp[q] .. key .. sp[q - 1])
      break
    end
    if not cost then
      err = redis.error_reply('ERR allot: non-numeric argument for key ' .. key)
      break
    end
    if cost < 0 then
      err = redis.error_reply('ERR allot: invalid limit, period, burst or cost for key ' .. key)
      break
    end
    local rate, burst, ttl = sp[q - 3], sp[q - 2], sp[q - 1]
    local shared, tokens, ts = false, nil, nil
    local h = redis.pcall('HMGET', key, 'tokens', 'ts', 'rate', 'burst')
    if h.err then
      -- A key of another type: the limit's algorithm changed (check.lua).
      if not string.find(h.err, 'WRONGTYPE', 1, true) then
        err = h
        break
      end
      shared = 'stale'
    else
      tokens, ts = tonumber(h[1]), tonumber(h[2])
      -- A global limit's share, written by the coordinator (share.lua):
      -- its own rate and burst, so its own TTL.
      local r, bu = tonumber(h[3]), tonumber(h[4])
      if r and r > 0 and bu and bu > 0 then
        rate, burst, shared = r, bu, true
        local ms = math.ceil(burst / rate * 1000) + 1000
        if not (ms >= 1 and ms <= TTL_MAX) then
          err = redis.error_reply('ERR allot: TTL ' .. tostring(ms) .. ' ms out of range [1, ' .. TTL_MAX .. '] for key ' .. key .. ' (limit numbers beyond algorithm.Spec.Validate)')
          break
        end
        ttl = string.format('%.0f', ms)
      end
    end
    if tokens == nil or ts == nil then
      tokens, ts = burst, now -- a missing bucket is full
    else
      -- refill: a clock that steps back must not mint or burn tokens.
      tokens = math.min(burst, tokens + math.max(now - ts, 0) * rate / 1e6)
      ts = math.max(ts, now)
    end
    if tokens < cost then
      allowed = false
    end
    local j = (i - 1) * 7
    s[j + 1], s[j + 2], s[j + 3], s[j + 4], s[j + 5], s[j + 6], s[j + 7] = tokens, ts, rate, burst, cost, shared, ttl
  end
  if err then
    out[grp] = err
  else
    local reply
    if n == 1 then
      reply = { allowed and 1 or 0, 0, 0, 0 }
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
        local key, shared, ttl = KEYS[k0 + i], s[j + 6], s[j + 7]
        tokens = tokens - cost
        if shared == 'stale' then
          redis.call('DEL', key)
        end
        -- Numbers go to Redis as %.17g or shortest round-trip strings:
        -- the float survives exactly; integers go as '%.0f' (common.lua).
        local tsarg = nowarg
        if s[j + 2] ~= now then
          tsarg = string.format('%.0f', s[j + 2])
        end
        redis.call('HSET', key, 'tokens', tokens, 'ts', tsarg)
        -- extend_ttl: a shared bucket keeps the coordinator's longer TTL.
        if shared ~= true or redis.call('PTTL', key) < tonumber(ttl) then
          redis.call('PEXPIRE', key, ttl)
        end
      end
      reply[3 * i - 1] = math.floor(tokens)
      reply[3 * i] = retry
      reply[3 * i + 1] = math.ceil((burst - tokens) / rate * 1e6)
    end
    out[grp] = reply
  end
  k0 = k0 + n
  if not lone then
    a = a + 1 + 2 * n
  end
end
if lone then
  return out[1]
end
return out
