-- The index's members due by the Redis clock (one round trip), the longest due first.
-- KEYS[1] the namespace's recovery index; ARGV[1] how many at most.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])
