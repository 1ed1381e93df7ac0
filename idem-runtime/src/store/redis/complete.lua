-- Completes a claim if `owner` still holds it with a live lease (one round trip).
--
-- KEYS[1] record; ARGV[1] owner; ARGV[2] value; ARGV[3] ttl in ms (>= 1); ARGV[4] channel.
-- Replies 1 (completed), 0 (not the holder), or {0, reason} (corrupt).
if redis.replicate_commands then redis.replicate_commands() end

local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 'o', 'k', 'w', 'f', 'l')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem record (' .. r['err'] .. ')'}
end
if r[1] ~= 'p' or r[2] ~= ARGV[1] then
  return 0
end
if r[3] == 't' then
  -- A token claim outlives its lease (the record lasts until the token's deadline),
  -- so its lease is checked against the deadline it keeps.
  local ld = tonumber(r[6])
  if not ld then
    return {0, 'token claim without a lease deadline'}
  end
  local tm = redis.call('TIME')
  if ld <= tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000) then
    return 0
  end
end
-- Rewritten whole, so no field of the claim (owner, lease, token deadline) survives.
redis.call('DEL', rec)
if r[5] then
  redis.call('HSET', rec, 's', 'c', 'v', ARGV[2], 'f', r[5])
else
  redis.call('HSET', rec, 's', 'c', 'v', ARGV[2])
end
redis.call('PEXPIRE', rec, ARGV[3])
if r[4] then
  redis.call('PUBLISH', ARGV[4], rec)
end
return 1
