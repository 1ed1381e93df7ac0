-- The start of complete, release and renew (prepended to each when it is loaded): reads
-- the record, checks its shape, and returns 0 unless ARGV[1] (16 owner bytes) holds it
-- in progress. Leaves v (the record), n (its length), s, w, k (its state, waited flag and
-- kind bytes) and rec (KEYS[1]) to the script that follows.
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
