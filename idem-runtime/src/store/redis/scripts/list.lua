-- The index's members with their recovery state (one round trip): for each, the
-- member, how long it has been due (ms, 0 if not yet), attempts, why it was parked (or
-- false), whether its owner still holds it with a live lease (1) and how many steps its
-- journal has, by the Redis clock.
-- KEYS[1] the namespace's recovery index; ARGV[1] how many at most; ARGV[2] the suffix
-- of a journal's name after its record's; ARGV[3] (optional) one record's name: only it.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local members
if ARGV[3] then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[3])
  members = {}
  if score then
    members = {ARGV[3], score}
  end
else
  members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
end
local out = {}
for i = 1, #members, 2 do
  local rec = members[i]
  local journal = rec .. ARGV[2]
  local j = redis.call('HMGET', journal, '\254', '\253', '\252', '\255')
  if j[1] then
    local v = redis.pcall('GET', rec)
    local held = 0
    if type(v) == 'string' and string.byte(v, 3) == 115 then
      local ld = tonumber(string.sub(v, #v - 14))
      if ld and ld > now then
        held = 1
      end
    end
    local reserved = 0
    for k = 1, 4 do
      if j[k] then
        reserved = reserved + 1
      end
    end
    local steps = redis.call('HLEN', journal) - reserved
    table.insert(out, {rec, math.max(now - tonumber(members[i + 1]), 0),
      tonumber(j[2] or '0'), j[3] or false, held, steps})
  end
end
return out
