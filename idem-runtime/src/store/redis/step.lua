-- Journals one durable step if `owner` still holds the record with a live lease (one
-- round trip): the journal is a hash beside the record (same hash tag, one slot), one
-- field per step name, and expires `ttl` after its last write.
--
-- KEYS[1] record; KEYS[2] its journal; ARGV[1] owner (16 bytes); ARGV[2] step name;
-- ARGV[3] 'd' (done: ARGV[4] is the value) or 'i' (intent, no value); ARGV[5] ttl in ms.
-- Replies 1 (journaled), 0 (not the holder), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if k == 116 then
  -- A token claim outlives its lease: check the lease deadline it keeps.
  local ld = string.sub(v, n - 29, n - 15)
  ld = not string.find(ld, '%D') and tonumber(ld)
  if not ld then
    return {0, 'token claim without a lease deadline'}
  end
  if ld <= now then
    return 0
  end
elseif k ~= 100 then
  return {0, 'steps are journaled for dedup and token claims only'}
end
-- The entry: its kind, when (15 decimal digits, ms by the Redis clock), the value.
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. string.format('%015.0f', now) .. ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
