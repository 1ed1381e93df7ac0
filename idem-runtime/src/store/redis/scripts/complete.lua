-- Completes a claim if `owner` still holds it with a live lease (one round trip).
--
-- KEYS[1] record; KEYS[2] its step journal, dropped with a stepped or token claim's
-- completion (a plain dedup claim has none); KEYS[3] (a recoverable call's only) its recovery index; ARGV[1] owner (16 bytes); ARGV[2] value;
-- ARGV[3] ttl in ms (>= 1); ARGV[4] channel.
-- Replies 1 (completed), 0 (not the holder), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
-- A stepped or token claim outlives its lease (the record lasts as long as its journal
-- or its token), so its lease is checked against the deadline it keeps.
if ld and ld <= now then
  return 0
end
-- Rewritten whole, so nothing of the claim (owner, lease, token deadline) survives.
if fp then
  redis.call('SET', rec, 'cf' .. fp .. ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', rec, 'c-' .. ARGV[2], 'PX', ARGV[3])
end
if ld then
  redis.call('DEL', KEYS[2])
  -- KEYS[3], given for a recoverable call only: its recovery index, which it leaves.
  if KEYS[3] then
    redis.call('ZREM', KEYS[3], rec)
  end
end
if w == 119 then
  redis.call('PUBLISH', ARGV[4], rec)
end
return 1
