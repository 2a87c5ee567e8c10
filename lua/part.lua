-- part.lua: one node's settlement of a region bucket's RLQS parts
-- (internal/rlqs): the usage its clients reported is charged to the
-- bucket, its clients' demands and parts are published, and every other
-- node's are read back, so that each node splits the bucket's rate among
-- all of its consumers by the same numbers.
--
-- KEYS[1]  the bucket key (the exact path's and the leases' token bucket).
-- KEYS[2]  the bucket's parts hash (same hash tag): one field per node,
--          'exp|at|spend|demand|held|...' (exp and at, the node's last
--          settlement, in µs of Redis TIME; spend, the tokens/s it charges
--          at until its next), and the field
--          '~lease' with the last measurement of the leases' use.
-- ARGV     limit, period_ms, burst (0 = limit), node, usage (tokens,
--          negative for a refund), ttl_ms, horizon_ms, hysteresis (a
--          fraction), then 3 values per consumer of this node:
--            demand  its offered rate, tokens/s
--            held    the part it holds now (sent, still live), tokens/s
--            share   its fair share of avail, in [0, 1]; -1 keeps held
--          The node sends every part granted as soon as this returns.
--
-- usage (tokens its clients admitted since the node's last settlement,
-- as the node estimates it between their reports and corrects with them)
-- is taken from the bucket after the fact, so the bucket may run into
-- debt: tokens go negative, down to -(burst + rate * horizon) at most
-- (what parts may spend beyond the bucket in one horizon; the floor keeps
-- an outage's reports from starving the bucket for long). A bucket in debt grants no lease and passes no check until it
-- has refilled past zero, as refill and the checks' 'tokens >= cost'
-- already do for any token count; the scripts' replies clamp what they
-- report as remaining at zero.
--
-- The parts the node may send sum, with every other node's live parts,
-- to at most avail, the rate the bucket can give over the next horizon:
-- rate + tokens / horizon, between 0 and rate + burst / horizon. A part
-- that shrinks is granted as asked (and recorded so: the node sends it
-- at once); those that grow share the room left under avail by every
-- part held in proportion to their growth, so parts already sent never
-- sum past it.
--
-- The leases' use (the bucket's 'granted' and 'wanted' counters, which
-- lease.lua keeps) is measured over at least a second: its rate and
-- whether some of what they asked for was not granted (unmet demand).
--
-- Returns {avail, rate, burst, tokens, lease_rate, lease_unmet, then a
-- part per consumer of this node, then the demands of every other node's
-- live consumers, by node name}: numbers as strings but burst, tokens
-- and lease_unmet.

-- now, fmt, ttl_arg, ttl_error, count, extend_ttl, tb_rate and tb_ttl
-- come from common.lua, which lua.go prepends.

if #ARGV < 8 or (#ARGV - 8) % 3 ~= 0 then
  return redis.error_reply('ERR allot: part.lua wants 8 ARGV and 3 per consumer, got ' .. #ARGV)
end
local hyst = tonumber(ARGV[8])
if not hyst or hyst < 0 or hyst > 1 then
  return redis.error_reply('ERR allot: hysteresis must be in [0, 1] for key ' .. KEYS[1])
end
local limit, period_ms, burst = count(ARGV[1]), count(ARGV[2]), count(ARGV[3])
local node, ttl, horizon = ARGV[4], count(ARGV[6]), count(ARGV[7])
-- usage may be negative: a refund of tokens charged ahead of a report
-- that showed fewer admitted.
local usage = tonumber(ARGV[5])
if usage and (usage ~= math.floor(usage) or math.abs(usage) > 9007199254740992) then
  usage = nil
end
if not (limit and period_ms and burst and usage and ttl and horizon) then
  return redis.error_reply('ERR allot: limit, period, burst, TTL and horizon must be whole numbers in [0, 2^53], usage in [-2^53, 2^53], for key ' .. KEYS[1])
end
if limit == 0 or period_ms == 0 or horizon == 0 or node == '' or string.find(node, '|', 1, true) or string.sub(node, 1, 1) == '~' then
  return redis.error_reply('ERR allot: invalid limit, period, horizon or node name for key ' .. KEYS[1])
end
local mine = {}
for i = 9, #ARGV, 3 do
  local d, h, f = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if not (d and h and f) or d < 0 or h < 0 or d ~= d or h ~= h or d == math.huge or h == math.huge or not (f == -1 or (f >= 0 and f <= 1)) then
    return redis.error_reply('ERR allot: a consumer\'s demand and held must be finite numbers >= 0, its share in [0, 1] or -1, for key ' .. KEYS[1])
  end
  mine[#mine + 1] = { d = d, h = h, f = f }
end
if burst == 0 then
  burst = limit
end
local rate = tb_rate(limit, period_ms)

local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'rate', 'burst', 'granted', 'wanted', 'parts')
-- A coordinator share overrides the policy's numbers, as in lease.lua.
local r, bb = tonumber(b[3]), tonumber(b[4])
if r and r > 0 then
  rate = r
end
if bb and bb > 0 then
  burst = bb
end
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil or ts == nil then
  tokens, ts = burst, now -- a missing bucket is full
end
-- The usage was spent over the time since the bucket was last written,
-- as it refilled, and every node charges its clients' once per horizon
-- at most for the time since its last settlement: tokens are kept up to
-- a horizon's refill past the burst, so that one node's charge does not
-- cap away the refill that pays for another's later charge (what the
-- others' clients spent meanwhile counts against avail below). Only the
-- burst counts towards avail; the scripts that refill (refill in
-- common.lua) cap the surplus at the burst. The debt floor is what parts
-- may spend beyond the bucket in one horizon.
local h_s = horizon / 1000
local slack = rate * h_s
tokens = math.max(math.min(burst + slack, tokens + math.max(now - ts, 0) * rate / 1e6 - usage), -(burst + slack))
ts = math.max(ts, now)
-- The bucket lives as long as the record: usage is charged as spent
-- since the bucket's last write, so a bucket that expired between two
-- settlements would be charged against no refill at all.
local bucket_ms = math.max(tb_ttl(burst, rate), ttl)
local bucket_ttl, parts_ttl = ttl_arg(bucket_ms), ttl_arg(ttl)
if not bucket_ttl then
  return ttl_error(KEYS[1], bucket_ms)
end
if not parts_ttl then
  return ttl_error(KEYS[2], ttl)
end
local shown = math.min(tokens, burst)

-- Every other node's live record; expired ones are dropped.
local all = redis.call('HGETALL', KEYS[2])
local others, names, dead = {}, {}, {}
local lease = nil
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if f == '~lease' then
    lease = v
  elseif f ~= node then
    local fields = {}
    for x in string.gmatch(v, '[^|]+') do
      fields[#fields + 1] = tonumber(x) or 0
    end
    if (fields[1] or 0) > now then
      others[f] = fields
      names[#names + 1] = f
    else
      dead[#dead + 1] = f
    end
  end
end
table.sort(names)

-- The leases' use, measured over at least a second.
local granted, wanted = tonumber(b[5]) or 0, tonumber(b[6]) or 0
local lrate, lunmet, l0 = 0, 0, nil
if lease then
  l0 = {}
  for x in string.gmatch(lease, '[^|]+') do
    l0[#l0 + 1] = tonumber(x) or 0
  end
  lrate, lunmet = l0[4] or 0, l0[5] or 0
end
local write_lease = nil
if not l0 or now - l0[1] >= 1000000 then
  if l0 then
    local dt = math.max(now - l0[1], 1) / 1e6
    local dg, dw = math.max(granted - l0[2], 0), math.max(wanted - l0[3], 0)
    lrate = dg / dt
    lunmet = (dw > dg) and 1 or 0
  end
  write_lease = table.concat({ fmt(now), fmt(granted), fmt(wanted), string.format('%.17g', lrate), lunmet }, '|')
end

-- A debt is repaid by whoever spent past their part: the leases take in
-- real time what the bucket holds, so while they are active they are
-- the ones a debt holds back, and the parts split the rate; without
-- them, the parts shrink until it is repaid.
-- Every other node charges its clients at its settlements for the time
-- since its last: what they are taken to have spent since (at the rate
-- it recorded, 'spend', for a horizon at most) is not charged yet, but
-- counts here, so that every node splits by the same tokens whatever the
-- phase of its settlements against the others'.
local held_tokens = tokens
for _, f in ipairs(names) do
  local fs = others[f]
  held_tokens = held_tokens - (fs[3] or 0) * math.min(math.max(now - (fs[2] or now), 0), horizon * 1000) / 1e6
end
if held_tokens < 0 and (lrate > 0 or lunmet == 1) then
  held_tokens = 0
end
local avail = math.min(math.max(rate + held_tokens / h_s, 0), rate + burst / h_s)

-- Each consumer's fair part is its share of avail as it is now; within
-- the hysteresis of what it holds, it keeps that (its strategy is sent
-- again unchanged), as it does with a share of -1 (a stream that ended,
-- whose part stays reserved until its assignment's TTL).
for _, c in ipairs(mine) do
  local w = c.f * avail
  if c.f < 0 or (c.h > 0 and math.abs(w - c.h) <= hyst * c.h) then
    w = c.h
  end
  c.w = w
end


local room = avail
for _, f in ipairs(names) do
  local fs = others[f]
  for i = 5, #fs, 2 do
    room = room - fs[i]
  end
end
-- This node's parts that shrink are sent as soon as this returns: what
-- they give up is room now.
for _, c in ipairs(mine) do
  room = room - math.min(c.h, c.w)
end
-- Growth shares the room in proportion to what each consumer asks more.
local grow = 0
for _, c in ipairs(mine) do
  grow = grow + math.max(c.w - c.h, 0)
end
local scale = 1
if grow > room then
  scale = math.max(room, 0) / grow
end
local grants, record, spend = {}, {}, 0
for i, c in ipairs(mine) do
  local g = c.w
  if c.w > c.h then
    g = c.h + (c.w - c.h) * scale
  end
  grants[i] = g
  -- What the client spends at until the next settlement: its new part,
  -- or its demand if smaller (internal/rlqs charges the same).
  spend = spend + math.min(g, c.d)
  record[#record + 1] = string.format('%.17g', c.d)
  record[#record + 1] = string.format('%.17g', g)
end
record = table.concat({ fmt(now + ttl * 1000), fmt(now), string.format('%.17g', spend), table.concat(record, '|') }, '|')

-- Writes, after every check above.
if #mine > 0 then
  -- Until when this bucket has parts (µs of Redis TIME): lease.lua tells
  -- its nodes, so that none takes the bucket as its own alone.
  redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', fmt(ts), 'parts', fmt(math.max(tonumber(b[7]) or 0, now + ttl * 1000)))
else
  redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', fmt(ts))
end
extend_ttl(KEYS[1], bucket_ttl)
if #dead > 0 then
  redis.call('HDEL', KEYS[2], unpack(dead))
end
if #mine > 0 then
  redis.call('HSET', KEYS[2], node, record)
else
  redis.call('HDEL', KEYS[2], node)
end
if write_lease then
  redis.call('HSET', KEYS[2], '~lease', write_lease)
end
extend_ttl(KEYS[2], parts_ttl)

local reply = { string.format('%.17g', avail), string.format('%.17g', rate), math.floor(burst), math.floor(shown), string.format('%.17g', lrate), lunmet }
for _, g in ipairs(grants) do
  reply[#reply + 1] = string.format('%.17g', g)
end
for _, f in ipairs(names) do
  local fs = others[f]
  for i = 4, #fs, 2 do
    reply[#reply + 1] = string.format('%.17g', fs[i])
  end
end
return reply
