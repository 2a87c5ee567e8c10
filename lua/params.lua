-- params.lua: the ARGV layout check.lua and refund.lua share (5 values per
-- key: algorithm code, limit, period in ms, burst, cost). lua.go prepends
-- it, after common.lua, to those two scripts only.

-- params reads key i's arguments, or returns an error reply.
local function params(i)
  local b = (i - 1) * 5
  local p = {
    algo = ARGV[b + 1],
    limit = count(ARGV[b + 2]),
    period_ms = count(ARGV[b + 3]),
    burst = count(ARGV[b + 4]),
    cost = tonumber(ARGV[b + 5]),
  }
  -- The limit's numbers make the state, so they must be exact; a cost is
  -- only compared with them (a cost above the capacity is denied before
  -- any sum), so any cost >= 0 is fine, as in package algorithm.
  if not (p.limit and p.period_ms and p.burst) then
    return redis.error_reply('ERR allot: limit, period and burst must be whole numbers in [0, 2^53] for key ' .. KEYS[i])
  end
  if not (p.cost and p.cost >= 0) then
    return redis.error_reply('ERR allot: cost must be a number >= 0 for key ' .. KEYS[i])
  end
  if p.limit == 0 or p.period_ms == 0 then
    return redis.error_reply('ERR allot: limit and period must be positive for key ' .. KEYS[i])
  end
  if p.burst == 0 then
    p.burst = p.limit
  end
  p.window = p.period_ms * 1000
  return p
end

-- all_params reads and validates every key's arguments, so that a script
-- fails on them before it reads or writes anything: ps[i] for KEYS[i], or nil and
-- an error reply. algos holds the script's algorithms by code.
local function all_params(algos)
  local n = #KEYS
  if #ARGV ~= n * 5 then
    return nil, redis.error_reply('ERR allot: want 5 ARGV per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
  end
  local ps = {}
  for i = 1, n do
    local p = params(i)
    if p.err then
      return nil, p
    end
    if algos[p.algo] == nil then
      return nil, redis.error_reply('ERR allot: unknown algorithm ' .. tostring(p.algo))
    end
    ps[i] = p
  end
  return ps
end
