-- The start of complete, release, renew and step (prepended to each when it is loaded):
-- reads the record, checks its shape, and returns 0 unless ARGV[1] (16 owner bytes)
-- holds it in progress. Leaves to the script that follows: rec (KEYS[1]), v (the
-- record), n (its length), s, w, k (its state, waited flag and kind bytes), fp (the
-- claim's fingerprint or nil), and for a claim that keeps its lease deadline (stepped
-- and token claims) ld (that deadline) and now (ms by the Redis clock), else nil: the
-- script decides what a lease that ended means for it.
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
-- 108 'l', 115 's', 116 't'.
local s, w, k = string.byte(v, 1, 3)
local n = #v
if s == 112 then
  if (w ~= 45 and w ~= 119) or not (((k == 100 or k == 108) and (n == 19 or n == 35))
      or (k == 115 and (n == 34 or n == 50)) or (k == 116 and (n == 49 or n == 65))) then
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
local fp, ld, now
if n == 35 or n == 50 or n == 65 then
  fp = string.sub(v, 20, 35)
end
if k == 115 or k == 116 then
  -- 15 decimal digits, ms by the Redis clock: the last field of a stepped claim, the
  -- one before the token's deadline in a token claim.
  if k == 115 then
    ld = string.sub(v, n - 14)
  else
    ld = string.sub(v, n - 29, n - 15)
  end
  -- (Arithmetic makes the number, here and from the clock below: see mod.rs.)
  ld = not string.find(ld, '%D') and ld + 0
  if not ld then
    return {0, 'claim without its lease deadline'}
  end
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
