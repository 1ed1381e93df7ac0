-- Removes a record whoever holds it (one round trip), and wakes its waiters so they
-- claim again at once. A lock's fence counter is kept: fences must keep growing.
--
-- KEYS[1] the record; KEYS[2] its step journal, removed too; ARGV[1] the notification
-- channel. Replies 1 (a record was removed) or 0.
redis.call('DEL', KEYS[2])
local v = redis.pcall('GETDEL', KEYS[1])
if type(v) == 'table' then
  -- Not a string: not an idem record, but still what the operator named; remove it.
  return redis.call('DEL', KEYS[1])
end
if not v then
  return 0
end
-- Whoever waited marked the record (second byte 'w'); tell them it is gone.
if string.byte(v, 2) == 119 then
  redis.call('PUBLISH', ARGV[1], KEYS[1])
end
return 1
