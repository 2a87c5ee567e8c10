-- check.lua: all-or-nothing take over the keys of ONE subject, each key
-- with its own algorithm.
--
-- KEYS[i]  the key of one limit; all keys share a hash tag, so one slot.
--          Each algorithm keeps its whole state in its one key (a hash, or
--          a sorted set for the log), so the script touches only KEYS.
-- ARGV     5 values per key, in key order:
--          algo code, limit, period_ms, burst (0 = limit), cost.
--          Codes: tb (token bucket), gcra, swl (sliding window log),
--          swc (sliding window counter), fw (fixed window).
--
-- Phase 1 checks every key and writes nothing; phase 2 commits every key,
-- and only runs when every key admits its cost. A denial writes nothing,
-- so a denied request neither spends tokens nor extends any TTL, whatever
-- mix of algorithms the subject has.
--
-- Returns {allowed (1/0), then per key: remaining, retry_us, reset_us}:
--   remaining  whole tokens left after the take (without it if the group
--              was denied, as nothing was taken)
--   retry_us   0 if this key alone admits cost now, -1 if never
--              (cost > capacity), else microseconds until it would
--   reset_us   microseconds until the key is back to its fresh state
--              (bucket full, window or log empty)
--
-- The maths is the twin of package algorithm (Decide and the State types'
-- doc comments): same state, same formulas in the same order, so integer
-- maths agrees exactly and IEEE doubles agree bit for bit.

-- now, idiv, ceil_div, ttl_ms, fmt, ttl_arg, ttl_error, count, window_at,
-- extend_ttl, tb_rate, tb_ttl and refill come from common.lua, and params
-- and all_params from params.lua, which lua.go prepends.

-- read runs a read command on a key. A key of another Redis type means a
-- policy changed this limit's algorithm: it reads as missing (stale = true)
-- and commit replaces it, as the in-process store does.
local function read(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      return nil, true
    end
    error(r.err)
  end
  return r, false
end

-- Each algorithm has:
--   check(key, p)           read the state and decide; no writes.
--                           Returns ok and a state table for the others,
--                           whose ttl_ms is the TTL commit would set (the
--                           main loop checks it before any commit runs:
--                           a script never fails after writing).
--   commit(key, p, st)      write the state after taking p.cost, and the
--                           TTL st.ttl (ttl_ms as PEXPIRE's argument)
--                           after which the idle key is fresh again.
--   report(p, st, taken)    remaining, retry_us, reset_us; taken says
--                           whether the whole group was admitted, so a
--                           key that alone would pass still reports its
--                           untouched state when another key denied.
-- st.ok is set to check's answer before report runs.
local algos = {}

-- Token bucket: algorithm.BucketState.
algos.tb = {
  check = function(key, p)
    p.rate = tb_rate(p.limit, p.period_ms)
    local h, stale = read('HMGET', key, 'tokens', 'ts', 'rate', 'burst')
    local tokens, ts
    if h then
      tokens, ts = tonumber(h[1]), tonumber(h[2])
      -- A global limit's share, written by the region's coordinator
      -- (share.lua), overrides the numbers in ARGV, as in lease.lua.
      local r, b = tonumber(h[3]), tonumber(h[4])
      if r and r > 0 and b and b > 0 then
        p.rate, p.burst, p.shared = r, b, true
      end
    end
    if tokens == nil or ts == nil then
      tokens, ts = p.burst, now -- a missing bucket is full
    else
      tokens, ts = refill(tokens, ts, p.rate, p.burst)
    end
    return tokens >= p.cost, { tokens = tokens, ts = ts, stale = stale, ttl_ms = tb_ttl(p.burst, p.rate) }
  end,
  commit = function(key, p, st)
    if st.stale then
      redis.call('DEL', key)
    end
    -- Numbers passed to redis.call are formatted with 17 significant
    -- digits, so the stored float round-trips exactly.
    redis.call('HSET', key, 'tokens', st.tokens - p.cost, 'ts', fmt(st.ts))
    -- A shared bucket's TTL is the coordinator's (share TTL): only extend
    -- it, or an idle key would drop its share.
    if p.shared then
      extend_ttl(key, st.ttl)
    else
      redis.call('PEXPIRE', key, st.ttl)
    end
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

-- GCRA: algorithm.GCRAState. Integer maths: T = ceil(period/limit) us,
-- tau = burst * T (< 2^53, checked by algorithm.Spec.Validate).
algos.gcra = {
  check = function(key, p)
    local T = math.max(ceil_div(p.window, p.limit), 1)
    local h, stale = read('HGET', key, 'tat')
    local stored = tonumber(h)
    local tat = now
    if stored ~= nil and stored > now then
      tat = stored -- a clock that steps back leaves TAT ahead: never mints
    end
    local st = { T = T, tau = p.burst * T, tat = tat, stale = stale }
    st.ttl_ms = ttl_ms(st.tau)
    if p.cost > p.burst then
      return false, st
    end
    st.next = tat + p.cost * T
    return st.next - now <= st.tau, st
  end,
  commit = function(key, p, st)
    if st.stale then
      redis.call('DEL', key)
    end
    redis.call('HSET', key, 'tat', fmt(st.next))
    redis.call('PEXPIRE', key, st.ttl)
  end,
  report = function(p, st, taken)
    local retry = 0
    if p.cost > p.burst then
      retry = -1
    elseif not st.ok then
      retry = st.next - st.tau - now
    end
    local ahead = st.tat - now
    if taken then
      ahead = st.next - now
    end
    return idiv(math.max(st.tau - ahead, 0), st.T), retry, ahead
  end,
}

-- Sliding window log: algorithm.LogState. A sorted set, one member per
-- admitted token, scored by its timestamp; members are a zero-padded
-- sequence number (unique, and ordered like the scores, since timestamps
-- never go back), so the newest member tells the next one.
algos.swl = {
  check = function(key, p)
    local cut = now - p.window -- entries scored <= cut have left the window
    local n, stale = read('ZCOUNT', key, '(' .. fmt(cut), '+inf')
    local st = { n = n or 0, at = now, seq = 0, stale = stale, cut = cut }
    if not stale then
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if last[1] then
        local newest = tonumber(last[2])
        st.seq = tonumber(last[1]) + 1
        st.at = math.max(now, newest)
        if st.n > 0 then
          st.newest = newest
        end
      end
    end
    local ok = p.cost <= p.limit and st.n + p.cost <= p.limit
    if not ok and p.cost <= p.limit then
      -- The (n + cost - limit)-th oldest live entry must leave first.
      local k = st.n + p.cost - p.limit
      local e = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(cut), '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
      st.frees = tonumber(e[2]) + p.window
    end
    -- The newest entry after the commit sets when the log is empty again.
    local newest = st.newest
    if p.cost > 0 then
      newest = st.at
    end
    st.ttl_ms = ttl_ms(0)
    if newest ~= nil then
      st.ttl_ms = ttl_ms(newest + p.window - now)
    end
    return ok, st
  end,
  commit = function(key, p, st)
    if st.stale then
      redis.call('DEL', key)
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(st.cut))
    -- ZADD in batches: unpack() is bounded by the Lua C stack.
    local args, score = {}, fmt(st.at)
    for j = 0, p.cost - 1 do
      args[#args + 1] = score
      args[#args + 1] = string.format('%015.0f', st.seq + j)
      if #args >= 1000 or j == p.cost - 1 then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    redis.call('PEXPIRE', key, st.ttl)
  end,
  report = function(p, st, taken)
    local retry = 0
    if p.cost > p.limit then
      retry = -1
    elseif not st.ok then
      retry = st.frees - now
    end
    local reset = 0
    if st.newest ~= nil then
      reset = st.newest + p.window - now
    end
    if taken then
      if p.cost > 0 then
        reset = st.at + p.window - now
      end
      return p.limit - st.n - p.cost, retry, reset
    end
    return math.max(p.limit - st.n, 0), retry, reset
  end,
}

-- Sliding window counter: algorithm.CounterState.
algos.swc = {
  check = function(key, p)
    local w = p.window
    local h, stale = read('HMGET', key, 'swc_win', 'swc_curr', 'swc_prev')
    local win, curr, prev
    if h then
      win, curr, prev = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
    end
    local valid = win ~= nil and curr ~= nil and prev ~= nil
    local idx, e = window_at(w, valid and win or nil)
    if not valid or win < idx - 1 then
      curr, prev = 0, 0
    elseif win == idx - 1 then
      curr, prev = 0, curr
    end
    local est = curr + prev * ((w - e) / w)
    local st = { idx = idx, e = e, curr = curr, prev = prev, est = est, stale = stale, ttl_ms = ttl_ms(2 * w - e) }
    return p.cost <= p.limit and est + p.cost <= p.limit, st
  end,
  commit = function(key, p, st)
    if st.stale then
      redis.call('DEL', key)
    end
    redis.call('HSET', key, 'swc_win', fmt(st.idx), 'swc_curr', fmt(st.curr + p.cost), 'swc_prev', fmt(st.prev))
    redis.call('PEXPIRE', key, st.ttl)
  end,
  report = function(p, st, taken)
    local w, e = p.window, st.e
    local retry = 0
    if p.cost > p.limit then
      retry = -1
    elseif not st.ok then
      if st.curr + p.cost <= p.limit then
        -- Solve curr + prev * (w - e') / w = limit - cost for e'.
        local at = w - (p.limit - p.cost - st.curr) * w / st.prev
        retry = math.ceil(at - e)
      else
        -- Next window: curr becomes prev. Solve curr * (w - e') / w = limit - cost.
        local at = w - (p.limit - p.cost) * w / st.curr
        retry = math.ceil((w - e) + at)
      end
    end
    local curr, left = st.curr, math.max(math.floor(p.limit - st.est), 0)
    if taken then
      curr = curr + p.cost
      left = math.max(math.floor(p.limit - st.est - p.cost), 0)
    end
    local reset = 0
    if curr > 0 then
      reset = 2 * w - e
    elseif st.prev > 0 then
      reset = w - e
    end
    return left, retry, reset
  end,
}

-- Fixed window: algorithm.WindowState.
algos.fw = {
  check = function(key, p)
    local w = p.window
    local h, stale = read('HMGET', key, 'fw_win', 'fw_n', 'fw_rwin', 'fw_remote')
    local win, n, rwin, remote
    if h then
      win, n, rwin, remote = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
    end
    local valid = win ~= nil and n ~= nil
    local idx = window_at(w, valid and win or nil)
    if not valid or win ~= idx then
      n = 0
    end
    -- A global quota: the other regions' counts of this same window, as
    -- the coordinator last heard them (quota.lua). They count against
    -- the limit but are never written back by this script.
    if rwin ~= idx or remote == nil or remote < 0 then
      remote = 0
    end
    local st = { idx = idx, n = n, remote = remote, to_end = (idx + 1) * w - now, stale = stale }
    st.ttl_ms = ttl_ms(st.to_end)
    return p.cost <= p.limit and n + remote + p.cost <= p.limit, st
  end,
  commit = function(key, p, st)
    if st.stale then
      redis.call('DEL', key)
    end
    redis.call('HSET', key, 'fw_win', fmt(st.idx), 'fw_n', fmt(st.n + p.cost))
    redis.call('PEXPIRE', key, st.ttl)
  end,
  report = function(p, st, taken)
    local retry = 0
    if p.cost > p.limit then
      retry = -1
    elseif not st.ok then
      retry = st.to_end
    end
    local n, left = st.n, math.max(p.limit - st.n - st.remote, 0)
    if taken then
      n = n + p.cost
      left = math.max(p.limit - n - st.remote, 0)
    end
    local reset = 0
    if n > 0 then
      reset = st.to_end
    end
    return left, retry, reset
  end,
}

local n = #KEYS
-- Validate every key's arguments before reading any.
local ps, err = all_params(algos)
if err then
  return err
end

local states, allowed = {}, true
for i = 1, n do
  local ok, st = algos[ps[i].algo].check(KEYS[i], ps[i])
  -- Every TTL is known and in range before the first write.
  st.ttl = ttl_arg(st.ttl_ms)
  if not st.ttl then
    return ttl_error(KEYS[i], st.ttl_ms)
  end
  st.ok = ok
  allowed = allowed and ok
  states[i] = st
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
