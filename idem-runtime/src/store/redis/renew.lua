-- Extends the lease of `owner`'s live claim (one round trip).
--
-- KEYS[1] record; ARGV[1] owner; ARGV[2] lease in ms (>= 1).
-- Replies 1 (renewed), 0 (lease lost), or {0, reason} (corrupt).
if redis.replicate_commands then redis.replicate_commands() end

local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 'o', 'k', 'l', 't')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem record (' .. r['err'] .. ')'}
end
if r[1] ~= 'p' or r[2] ~= ARGV[1] then
  return 0
end
if r[3] ~= 't' then
  -- Dedup and lock: the key's expiry is the lease, and the key exists.
  redis.call('PEXPIRE', rec, ARGV[2])
  return 1
end
local ld, te = tonumber(r[4]), tonumber(r[5])
if not ld or not te then
  return {0, 'token claim without its deadlines'}
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
if ld <= now then
  return 0
end
local deadline = now + tonumber(ARGV[2])
redis.call('HSET', rec, 'l', string.format('%.0f', deadline))
redis.call('PEXPIREAT', rec, string.format('%.0f', math.max(te, deadline)))
return 1
