-- Reads a record for an operator, changing nothing (one round trip): the record, the
-- key's remaining life, a lock's fence counter and the Redis clock, in one atomic step.
--
-- KEYS[1] the record; KEYS[2] its fence counter (same hash tag, one slot).
-- Replies {1} (no record) | {2, record, pttl_ms, fence or '', now_ms} | {0, reason}.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  return {0, 'not an idem record (' .. tostring(v['err']) .. ')'}
end
if not v then
  return {1}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local fence = redis.pcall('GET', KEYS[2])
if type(fence) ~= 'string' then
  fence = ''
end
return {2, v, redis.call('PTTL', KEYS[1]), fence, string.format('%.0f', now)}
