-- Creates a Bloom filter's bitmap: all its shards at once, empty, with one deadline.
-- Run by the client when an insert found no filter (once per filter lifetime); a no-op
-- if another client created it meanwhile.
--
-- KEYS[1]  the filter's meta key (a string: the size in bits)
-- KEYS[2...] every shard of the bitmap, in order (same hash tag: one slot)
-- ARGV[1]  ttl in ms from now, or 0 for none
-- ARGV[2]  size in bits
-- ARGV[3...] each shard's size in bits
--
-- Shards are at most 1 MiB - 64 bytes, so each allocation fills a 1 MiB allocator class
-- (the whole bitmap then costs its size, not the next size class of one huge string)
-- and no single key is large. All keys get the same absolute deadline, so the filter
-- expires as a whole: a reader never sees some shards gone and others not.
--
-- Replies: 1 created | 0 it existed already.
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local ttl = tonumber(ARGV[1])
local deadline = 0
if ttl > 0 then
  local tm = redis.call('TIME')
  deadline = tm[1] * 1000 + math.floor(tm[2] / 1000) + ttl
end
for i = 2, #KEYS do
  -- Leftovers of an earlier generation of this filter are not part of the new one.
  redis.call('DEL', KEYS[i])
  redis.call('SETBIT', KEYS[i], tonumber(ARGV[i + 1]) - 1, 0)
  if deadline > 0 then
    redis.call('PEXPIREAT', KEYS[i], string.format('%.0f', deadline))
  end
end
redis.call('SET', KEYS[1], ARGV[2])
if deadline > 0 then
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', deadline))
end
return 1
