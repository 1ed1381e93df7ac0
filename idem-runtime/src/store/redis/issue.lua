-- Records an `Issued` token unless a record exists (one round trip). The deadline is kept
-- in the record so that a released token claim gets back exactly its remaining ttl.
--
-- KEYS[1] record; ARGV[1] ttl in ms (>= 1). Replies 1 (issued) or 0 (exists).
if redis.replicate_commands then redis.replicate_commands() end

local rec = KEYS[1]
if redis.call('EXISTS', rec) == 1 then
  return 0
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
redis.call('HSET', rec, 's', 'i', 't', string.format('%.0f', now + tonumber(ARGV[1])))
redis.call('PEXPIRE', rec, ARGV[1])
return 1
