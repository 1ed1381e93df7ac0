-- Tests one id against a Bloom filter: the script behind `Store::bloom_contains` (one
-- round trip, read only).
--
-- KEYS, ARGV as in bloom_insert.lua. No filter yet means no bit set.
--
-- Replies: 1 every bit is set (maybe seen) | 0 not (definitely new) | {0, reason} corrupt.
local meta = redis.call('TYPE', KEYS[1])['ok']
if meta == 'none' then
  return 0
elseif meta ~= 'string' then
  return {0, 'not an idem Bloom filter (a ' .. meta .. ')'}
end
for i = 2, #KEYS do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'string' then
    return {0, 'Bloom shard ' .. (i - 2) .. ' is missing or not a bitmap (' .. t .. ')'}
  end
end
for i = 1, #ARGV, 2 do
  if redis.call('GETBIT', KEYS[tonumber(ARGV[i])], ARGV[i + 1]) == 0 then
    return 0
  end
end
return 1
