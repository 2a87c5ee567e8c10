-- quota.lua: store the other regions' count of a global quota (a fixed
-- window with scope: global) in this region's bucket. common.lua
-- precedes it.
--
-- KEYS[1]  the bucket key rl:{<subject>}:<policy>:<limit>
-- ARGV     window number (floor(time / period)), the other regions'
--          summed count in it, period_ms
--
-- check.lua's fixed window adds fw_remote to its own count while
-- fw_rwin is the current window. The numbers only rise: a newer window
-- replaces an older one, and within one window a smaller count (a late or
-- reordered write) is ignored. The TTL is only extended, to the end of
-- the window plus a grace second (check.lua's own TTL for the window).
-- Returns 1 if the bucket changed, else 0.
local win, used, period_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not (win and used and period_ms) or used < 0 or period_ms <= 0 then
  return redis.error_reply('ERR allot: quota.lua wants window, used, period_ms')
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return 0 -- another algorithm's state: the policy changed; leave it
end
local h = redis.call('HMGET', KEYS[1], 'fw_rwin', 'fw_remote')
local rwin, cur = tonumber(h[1]), tonumber(h[2])
if rwin and (rwin > win or (rwin == win and cur and cur >= used)) then
  return 0
end
local to_end = (win + 1) * period_ms * 1000 - now
if to_end <= 0 then
  return 0 -- the window is over here
end
redis.call('HSET', KEYS[1], 'fw_rwin', fmt(win), 'fw_remote', fmt(used))
extend_ttl(KEYS[1], ttl_ms(to_end))
return 1
