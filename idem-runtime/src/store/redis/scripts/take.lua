-- Takes a due recoverable call for one recovery attempt (one round trip), by the Redis
-- clock: an abandoned one (its stepped record's lease ended: released by a dropped
-- call, or run out) that is not parked has its attempt counted in the journal's field
-- 0xFD and its due time moved `backoff` ahead. One still held is moved to its lease
-- deadline; one finished, gone or not recoverable leaves the index.
--
-- KEYS[1] record; KEYS[2] its journal; KEYS[3] the namespace's recovery index;
-- ARGV[1] backoff in ms.
-- Replies {arguments, attempts} (taken), or nil.
local rec, journal, index = KEYS[1], KEYS[2], KEYS[3]
local v = redis.pcall('GET', rec)
if type(v) ~= 'string' or string.byte(v, 1) ~= 112 or string.byte(v, 3) ~= 115 then
  redis.call('ZREM', index, rec)
  return nil
end
local ld = tonumber(string.sub(v, #v - 14))
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if not ld then
  redis.call('ZREM', index, rec)
  return nil
end
if ld > now then
  redis.call('ZADD', index, ld, rec)
  return nil
end
local args = redis.call('HGET', journal, '\254')
if not args then
  redis.call('ZREM', index, rec)
  return nil
end
if redis.call('HEXISTS', journal, '\252') == 1 then
  return nil
end
local n = redis.call('HINCRBY', journal, '\253', 1)
redis.call('ZADD', index, now + tonumber(ARGV[1]), rec)
return {args, n}
