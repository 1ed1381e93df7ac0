-- Completes a claim if `owner` still holds it with a live lease (one round trip).
--
-- KEYS[1] record; KEYS[2] its step journal, dropped with the completion; ARGV[1] owner (16 bytes); ARGV[2] value; ARGV[3] ttl in ms (>= 1);
-- ARGV[4] channel. Replies 1 (completed), 0 (not the holder), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
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
redis.call('DEL', KEYS[2])
if w == 119 then
  redis.call('PUBLISH', ARGV[4], rec)
end
return 1
