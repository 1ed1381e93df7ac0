-- Gives a claim back if `owner` holds it: deletes the record, or returns a claimed token
-- to `Issued` with the token's remaining ttl (one round trip).
--
-- KEYS[1] record; ARGV[1] owner (16 bytes); ARGV[2] channel.
-- Replies 1 (released), 0 (not the holder), or {0, reason} (corrupt).
local rec = KEYS[1]
-- A deadline field: 15 decimal digits (ms by the Redis clock), else nil.
local function digits(x)
  if not string.find(x, '%D') then
    return tonumber(x)
  end
end
local v = redis.pcall('GET', rec)
if type(v) == 'table' then
  return {0, 'not an idem record (' .. tostring(v['err']) .. ')'}
end
if not v then
  return 0
end
-- The record's shape is checked before its owner, so garbage is reported, not ignored.
local s, w, k, n = string.sub(v, 1, 1), string.sub(v, 2, 2), string.sub(v, 3, 3), #v
if s == 'p' then
  if (w ~= '-' and w ~= 'w') or not (((k == 'd' or k == 'l') and (n == 19 or n == 35))
      or (k == 't' and (n == 49 or n == 65))) then
    return {0, 'malformed in-progress record'}
  end
elseif s == 'c' then
  if w ~= '-' and (w ~= 'f' or n < 18) then
    return {0, 'malformed completed record'}
  end
  return 0
elseif s == 'i' then
  if n ~= 2 or (w ~= '-' and w ~= 'w') then
    return {0, 'malformed issued token'}
  end
  return 0
else
  return {0, 'unknown record state'}
end
if string.sub(v, 4, 19) ~= ARGV[1] then
  return 0
end
if k == 't' then
  local te = digits(string.sub(v, n - 14))
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
if w == 'w' then
  redis.call('PUBLISH', ARGV[2], rec)
end
return 1
