-- Completes a claim if `owner` still holds it with a live lease (one round trip).
--
-- KEYS[1] record; ARGV[1] owner (16 bytes); ARGV[2] value; ARGV[3] ttl in ms (>= 1);
-- ARGV[4] channel. Replies 1 (completed), 0 (not the holder), or {0, reason} (corrupt).
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
local fp
if k == 116 then
  -- A token claim outlives its lease (the record lasts until the token's deadline),
  -- so its lease is checked against the deadline it keeps.
  -- (15 decimal digits, ms by the Redis clock; no closure is made on the common path)
  local ld = string.sub(v, n - 29, n - 15)
  ld = not string.find(ld, '%D') and tonumber(ld)
  if not ld then
    return {0, 'token claim without a lease deadline'}
  end
  local t = redis.call('TIME')
  if ld <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return 0
  end
  if n == 65 then
    fp = string.sub(v, 20, 35)
  end
elseif n == 35 then
  fp = string.sub(v, 20, 35)
end
-- Rewritten whole, so nothing of the claim (owner, lease, token deadline) survives.
if fp then
  redis.call('SET', rec, 'cf' .. fp .. ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', rec, 'c-' .. ARGV[2], 'PX', ARGV[3])
end
if w == 119 then
  redis.call('PUBLISH', ARGV[4], rec)
end
return 1
