-- share.lua: set a region's share of a global limit on one bucket (the
-- coordinator's phase-1 and phase-2 writes). common.lua precedes it.
--
-- KEYS[1]  the bucket key rl:{<subject>}:<policy>:<limit>
-- ARGV     new rate (tokens/s), new burst, the rate and burst in force when
--          the hash holds no share yet, ttl_ms
--
-- The share changes at this instant and only from it on: the bucket is
-- first refilled at the OLD rate up to now (common.lua's refill, the lease
-- and check scripts' own formula, so a raise never credits the past at
-- the new rate), then capped at the new burst (so a shrink takes effect at
-- once), then the new numbers are stored. A bucket with no tokens yet
-- stays so: the lease script starts it full at the share's burst, as any
-- new bucket.
--
-- The TTL is only ever extended, so that a share outlives an idle bucket.
-- Returns 1.
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'rate', 'burst')
local old_rate = tonumber(h[3]) or tonumber(ARGV[3])
local old_burst = tonumber(h[4]) or tonumber(ARGV[4])
local tokens, ts = tonumber(h[1]), tonumber(h[2])
if tokens and ts then
  tokens, ts = refill(tokens, ts, old_rate, old_burst)
  redis.call('HSET', KEYS[1], 'tokens', math.min(tokens, burst), 'ts', ts, 'rate', rate, 'burst', burst)
else
  redis.call('HSET', KEYS[1], 'rate', rate, 'burst', burst)
end
extend_ttl(KEYS[1], tonumber(ARGV[5]))
return 1
