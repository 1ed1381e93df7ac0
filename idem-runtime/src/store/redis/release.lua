-- Gives a claim back if `owner` holds it: deletes the record, or returns a claimed token
-- to `Issued` with the token's remaining ttl (one round trip).
--
-- KEYS[1] record; ARGV[1] owner (16 bytes); ARGV[2] channel.
-- Replies 1 (released), 0 (not the holder), or {0, reason} (corrupt).
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
if k == 116 then
  -- (15 decimal digits, ms by the Redis clock)
  local te = string.sub(v, n - 14)
  te = not string.find(te, '%D') and tonumber(te)
  if not te then
    return {0, 'token claim without its deadlines'}
  end
  local t = redis.call('TIME')
  if te > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    redis.call('SET', rec, 'i-', 'PXAT', string.format('%.0f', te))
  else
    redis.call('DEL', rec)
  end
else
  redis.call('DEL', rec)
end
if w == 119 then
  redis.call('PUBLISH', ARGV[2], rec)
end
return 1
