-- Gives a claim back if `owner` holds it: deletes the record, or returns a claimed token
-- to `Issued` with the token's remaining ttl (one round trip).
--
-- KEYS[1] record; ARGV[1] owner (16 bytes); ARGV[2] channel.
-- Replies 1 (released), 0 (not the holder), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
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
