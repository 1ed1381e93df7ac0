-- Inserts one id into a Bloom filter: the script behind `Store::bloom_insert` (one round
-- trip: the k bits are tested and set together, so of concurrent inserts of one new id
-- exactly one hears "new").
--
-- KEYS[1]  the filter's meta key (see bloom_create.lua)
-- KEYS[2...] the shards holding the id's bits
-- ARGV     pairs: index into KEYS of the shard, bit offset in that shard
--
-- Replies: 1 every bit was set already (maybe seen) | 0 at least one was not (new) |
--          -1 no filter yet (the client creates it, then inserts again) |
--          {0, reason} corrupt.
local meta = redis.call('TYPE', KEYS[1])['ok']
if meta == 'none' then
  return -1
elseif meta ~= 'string' then
  return {0, 'not an idem Bloom filter (a ' .. meta .. ')'}
end
for i = 2, #KEYS do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'string' then
    -- A shard evicted or replaced: the filter can no longer say "definitely new".
    return {0, 'Bloom shard ' .. (i - 2) .. ' is missing or not a bitmap (' .. t .. ')'}
  end
end
local all = 1
for i = 1, #ARGV, 2 do
  if redis.call('SETBIT', KEYS[tonumber(ARGV[i])], ARGV[i + 1], 1) == 0 then
    all = 0
  end
end
return all
