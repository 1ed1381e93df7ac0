-- Extends the lease of `owner`'s live claim (one round trip).
--
-- KEYS[1] record; ARGV[1] owner (16 bytes); ARGV[2] lease in ms (>= 1).
-- Replies 1 (renewed), 0 (lease lost), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
if k ~= 116 then
  -- Dedup and lock: the key's expiry is the lease, and the key exists.
  redis.call('PEXPIRE', rec, ARGV[2])
  return 1
end
-- Its two deadlines: 15 decimal digits each, ms by the Redis clock.
local ld, te = string.sub(v, n - 29, n - 15), string.sub(v, n - 14)
ld = not string.find(ld, '%D') and tonumber(ld)
te = not string.find(te, '%D') and tonumber(te)
if not ld or not te then
  return {0, 'token claim without its deadlines'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ld <= now then
  return 0
end
local deadline = now + tonumber(ARGV[2])
-- The lease deadline sits 30 bytes from the end; SETRANGE keeps the key's expiry.
redis.call('SETRANGE', rec, n - 30, string.format('%015.0f', deadline))
redis.call('PEXPIREAT', rec, string.format('%.0f', math.max(te, deadline)))
return 1
