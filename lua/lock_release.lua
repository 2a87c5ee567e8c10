-- lock_release.lua: give a coordinator lock up if the caller holds it, so
-- a standby takes over at once instead of after the TTL. common.lua
-- precedes it.
--
-- KEYS[1]  the lock key allot:coordinator:{<region>}
-- ARGV     this process's id
--
-- Returns 1 if the lock was released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
