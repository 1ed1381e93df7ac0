-- Removes a record whoever holds it (one round trip), and wakes its waiters so they
-- claim again at once. A lock's fence counter is kept: fences must keep growing.
--
-- KEYS[1] the record; KEYS[2] its step journal, removed too; ARGV[1] the notification
-- channel. Replies 1 (a record was removed) or 0 (none; a stepped record whose lease
-- ended is kept only for its journal, so it counts as none).
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
-- Bytes as numbers: 112 'p', 115 's'. The lease deadline is a stepped record's last
-- 15 bytes (ms by the Redis clock).
if string.byte(v, 1) == 112 and string.byte(v, 3) == 115 then
  local ld = tonumber(string.sub(v, -15))
  local t = redis.call('TIME')
  if ld and ld <= t[1] * 1000 + math.floor(t[2] / 1000) then
    return 0
  end
end
return 1
