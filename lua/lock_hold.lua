-- lock_hold.lua: acquire or renew a region's active/standby coordinator
-- lock. common.lua precedes it.
--
-- KEYS[1]  the lock key allot:coordinator:{<region>}
-- ARGV     this process's id, ttl_ms
--
-- The holder renews with a compare-and-expire; anyone takes a free lock
-- with SET NX PX. Returns 1 if the caller holds the lock now, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
