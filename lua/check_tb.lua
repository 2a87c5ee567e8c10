-- check_tb.lua: check.lua for groups whose keys are all token buckets,
-- the common case, many groups per call.
--
-- KEYS are the keys of g groups, group after group. ARGV[1] is g,
-- ARGV[2 .. g+1] the number of keys of each group, then 5 values per key
-- in KEYS order, as check.lua takes them (algorithm code 'tb', limit,
-- period in ms, burst, cost). The reply has one element per group:
-- check.lua's reply for that group ({allowed, then remaining, retry_us,
-- reset_us per key}), or an error reply for that group alone.
--
-- It also takes check.lua's own layout (lone: ARGV[1] an algorithm code,
-- not a number): one group of all KEYS, answered with check.lua's reply
-- or error, unwrapped. A node sends a pipeline's only check so: for one
-- group the batch layout's wrapping costs Redis about a quarter more
-- (docs/benchmarks.md).
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
-- instead of one per check (docs/benchmarks.md).
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

local g, nk, a0 = tonumber(ARGV[1]), 0, 0
-- lone: check.lua's own layout (ARGV[1] an algorithm code, not a count),
-- one group of every key, answered with that group's reply or error
-- unwrapped: a pipeline's only check comes so, without the batch
-- layout's cost (docs/benchmarks.md).
local lone = g == nil
if lone then
  g, nk = 1, #KEYS
  if #ARGV ~= nk * 5 then
    return redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. nk .. ' keys')
  end
else
  if g < 1 or g ~= math.floor(g) or #ARGV < 1 + g then
    return redis.error_reply('ERR allot: ARGV[1] must be the number of groups, got ' .. tostring(ARGV[1]))
  end
  for x = 2, g + 1 do
    local m = tonumber(ARGV[x])
    if not m or m < 1 or m ~= math.floor(m) then
      return redis.error_reply('ERR allot: group ' .. (x - 1) .. ' has ' .. tostring(ARGV[x]) .. ' keys')
    end
    nk = nk + m
  end
  if nk ~= #KEYS or #ARGV ~= 1 + g + 5 * nk then
    return redis.error_reply('ERR allot: want ' .. nk .. ' keys and ' .. (1 + g + 5 * nk) .. ' ARGV for ' .. g .. ' groups, got ' .. #KEYS .. ' and ' .. #ARGV)
  end
  a0 = 1 + g
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Tables sized by their constructors where the size is known: a table
-- filled from empty is reallocated as it grows (at 1, 2, 4 and 8
-- entries), and for the common lone check that is most of the script's
-- allocation (docs/benchmarks.md). s is reused by every group.
local out
if g == 1 then
  out = { false }
else
  out = {}
end
local k0 = 0 -- the keys before this group (a0: its ARGV)
local s = { false, false, false, false, false, false, false }
for grp = 1, g do
  local n = nk
  if not lone then
    n = tonumber(ARGV[1 + grp])
  end
  -- s holds 7 values per key: tokens (refilled to now), ts, rate, burst,
  -- cost, shared (true, false, or 'stale' for a key of another type,
  -- which the commit replaces) and the TTL as PEXPIRE's argument.
  local allowed, err = true, nil
  for i = 1, n do
    local key, b = KEYS[k0 + i], a0 + (i - 1) * 5
    if ARGV[b + 1] ~= 'tb' then
      err = redis.error_reply('ERR allot: check_tb.lua takes token buckets only, not ' .. tostring(ARGV[b + 1]) .. ' for key ' .. key)
      break
    end
    local limit, period_ms, burst, cost = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    if not (limit and period_ms and burst and cost) then
      err = redis.error_reply('ERR allot: non-numeric argument for key ' .. key)
      break
    end
    if limit <= 0 or period_ms <= 0 or burst < 0 or cost < 0 then
      err = redis.error_reply('ERR allot: invalid limit, period, burst or cost for key ' .. key)
      break
    end
    if burst == 0 then
      burst = limit
    end
    -- tb_rate: Limit / Period.Seconds(), as Go computes it.
    local whole = math.floor(period_ms / 1000)
    local rate = limit / (whole + ((period_ms - whole * 1000) * 1000000) / 1e9)
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
      err = redis.error_reply('ERR allot: TTL ' .. tostring(ms) .. ' ms out of range [1, 9007199254740] for key ' .. key .. ' (limit numbers beyond algorithm.Spec.Validate)')
      break
    end
    if tokens < cost then
      allowed = false
    end
    local j = (i - 1) * 7
    s[j + 1], s[j + 2], s[j + 3], s[j + 4], s[j + 5], s[j + 6], s[j + 7] = tokens, ts, rate, burst, cost, shared, string.format('%.0f', ms)
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
    out[grp] = reply
  end
  k0, a0 = k0 + n, a0 + 5 * n
end
if lone then
  return out[1]
end
return out
