-- Parks a recoverable call (one round trip): its journal keeps why under the field
-- 0xFC, and the index keeps it at a score no due time reaches, so it is listed and
-- never taken again.
--
-- KEYS[1] record; KEYS[2] its journal; KEYS[3] the namespace's recovery index;
-- ARGV[1] why. Replies 1 (parked) or 0 (no arguments any more: the call finished).
if redis.call('HEXISTS', KEYS[2], '\254') == 0 then
  redis.call('ZREM', KEYS[3], KEYS[1])
  return 0
end
redis.call('HSET', KEYS[2], '\252', ARGV[1])
redis.call('ZADD', KEYS[3], 9e15, KEYS[1])
return 1
