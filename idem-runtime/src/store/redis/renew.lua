-- Extends the lease of `owner`'s live claim (one round trip).
--
-- KEYS[1] record; ARGV[1] owner; ARGV[2] lease in ms (>= 1).
-- Replies 1 (renewed), 0 (lease lost), or {0, reason} (corrupt).
if redis.replicate_commands then redis.replicate_commands() end

local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 'o', 'l', 't', 'k')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem record (' .. r['err'] .. ')'}
end
if r[1] ~= 'p' or r[2] ~= ARGV[1] then
  return 0
end
local ld = tonumber(r[3])
if not ld then
  return {0, 'malformed in-progress record'}
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
if ld <= now then
  return 0
end
local lease = tonumber(ARGV[2])
redis.call('HSET', rec, 'l', string.format('%.0f', now + lease))
local te = tonumber(r[4])
if r[5] == 't' and te then
  redis.call('PEXPIREAT', rec, string.format('%.0f', math.max(te, now + lease)))
else
  redis.call('PEXPIRE', rec, lease)
end
return 1
