-- Extends the lease of `owner`'s live claim (one round trip).
--
-- KEYS[1] record; ARGV[1] owner (16 bytes); ARGV[2] lease in ms (>= 1).
-- Replies 1 (renewed), 0 (lease lost), or {0, reason} (corrupt).
local rec = KEYS[1]
local v = redis.pcall('GET', rec)
if type(v) == 'table' then
  return {0, 'not an idem record (' .. tostring(v['err']) .. ')'}
end
if not v then
  return 0
end
-- The record's shape is checked before its owner, so garbage is reported, not ignored.
-- Bytes as numbers: 112 'p', 99 'c', 105 'i', 45 '-', 119 'w', 102 'f', 100 'd',
-- 108 'l', 116 't'.
local s, w, k = string.byte(v, 1, 3)
local n = #v
if s == 112 then
  if (w ~= 45 and w ~= 119) or not (((k == 100 or k == 108) and (n == 19 or n == 35))
      or (k == 116 and (n == 49 or n == 65))) then
    return {0, 'malformed in-progress record'}
  end
elseif s == 99 then
  if w ~= 45 and (w ~= 102 or n < 18) then
    return {0, 'malformed completed record'}
  end
  return 0
elseif s == 105 then
  if n ~= 2 or (w ~= 45 and w ~= 119) then
    return {0, 'malformed issued token'}
  end
  return 0
else
  return {0, 'unknown record state'}
end
if string.sub(v, 4, 19) ~= ARGV[1] then
  return 0
end
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
