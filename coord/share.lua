-- share.lua: set a region's share of a global limit on one bucket.
--
-- KEYS[1]  the bucket key rl:{<subject>}:<policy>:<limit>
-- ARGV     new rate (tokens/s), new burst, the rate and burst in force when
--          the hash holds no share yet, ttl_ms
--
-- The share changes at this instant and only from it on: the bucket is
-- first refilled at the OLD rate up to now (so a raise never credits the
-- past at the new rate), then capped at the new burst (so a shrink takes
-- effect at once), then the new numbers are stored. The refill is the
-- lease script's formula (tokens, ts in microseconds of Redis TIME).
-- A bucket with no tokens yet stays so: the lease script starts it full
-- at the share's burst, as any new bucket.
--
-- The TTL is only ever extended, so that a share outlives an idle bucket.
-- Returns 1.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'rate', 'burst')
local old_rate = tonumber(h[3]) or tonumber(ARGV[3])
local old_burst = tonumber(h[4]) or tonumber(ARGV[4])
local tokens, ts = tonumber(h[1]), tonumber(h[2])
if tokens and ts then
  local elapsed = now - ts
  if elapsed < 0 then
    elapsed = 0
  end
  tokens = math.min(old_burst, tokens + elapsed * old_rate / 1e6)
  tokens = math.min(tokens, burst)
  if now > ts then
    ts = now
  end
  redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', ts, 'rate', rate, 'burst', burst)
else
  redis.call('HSET', KEYS[1], 'rate', rate, 'burst', burst)
end
local ttl = tonumber(ARGV[5])
local pttl = redis.call('PTTL', KEYS[1])
if pttl < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
