-- The index's members with their recovery state (one round trip): for each, the
-- member, its due time, attempts, why it was parked (or false), and whether its owner
-- still holds it with a live lease, by the Redis clock.
-- KEYS[1] the namespace's recovery index; ARGV[1] how many at most; ARGV[2] the suffix
-- of a journal's name after its record's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local out = {}
for i = 1, #members, 2 do
  local rec = members[i]
  local j = redis.call('HMGET', rec .. ARGV[2], '\254', '\253', '\252')
  if j[1] then
    local v = redis.pcall('GET', rec)
    local held = 0
    if type(v) == 'string' and string.byte(v, 3) == 115 then
      local ld = tonumber(string.sub(v, #v - 14))
      if ld and ld > now then
        held = 1
      end
    end
    table.insert(out, {rec, math.max(now - tonumber(members[i + 1]), 0), tonumber(j[2] or '0'), j[3] or false, held})
  end
end
return out
