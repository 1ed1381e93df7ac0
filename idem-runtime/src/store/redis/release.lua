-- Gives a claim back if `owner` holds it: deletes the record, or returns a claimed token
-- to `Issued` with the token's remaining ttl (one round trip).
--
-- KEYS[1] record; ARGV[1] owner; ARGV[2] channel.
-- Replies 1 (released), 0 (not the holder), or {0, reason} (corrupt).
if redis.replicate_commands then redis.replicate_commands() end

local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 'o', 't', 'w', 'k')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem record (' .. r['err'] .. ')'}
end
if r[1] ~= 'p' or r[2] ~= ARGV[1] then
  return 0
end
local te = tonumber(r[3])
local now = 0
if r[5] == 't' and te then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
end
redis.call('DEL', rec)
if r[5] == 't' and te and te > now then
  redis.call('HSET', rec, 's', 'i', 't', r[3])
  redis.call('PEXPIREAT', rec, r[3])
end
if r[4] then
  redis.call('PUBLISH', ARGV[2], rec)
end
return 1
