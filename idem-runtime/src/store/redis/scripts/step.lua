-- Journals one durable step if `owner` still holds the record with a live lease (one
-- round trip): the journal is a hash beside the record (same hash tag, one slot), one
-- field per step name, and lives at least `ttl` after each write. The field named by the
-- single byte 0xFF (never a step name: those are UTF-8) keeps the fingerprint of the
-- last claim with one that wrote a step, so a claim of another payload is refused.
--
-- A dedup claim's first step makes its record a stepped one (kind 's'): the lease
-- deadline moves into the record, and the key lives as long as the journal, so a
-- released or abandoned record still meets the next claim, which checks the payload.
--
-- A write that finds less than `ttl` left of the journal sets its expiry, and the
-- record's, to the lease deadline plus `ttl` (later than before, never earlier): every
-- later step within that lease finds enough left and writes no expiry (two writes fewer
-- per step; one read instead). A renewal moves the deadline on; the first step past the
-- old one sets the expiry again.
--
-- KEYS[1] record; KEYS[2] its journal; ARGV[1] owner (16 bytes); ARGV[2] step name;
-- ARGV[3] 'd' (done: ARGV[4] is the value) or 'i' (intent, no value); ARGV[5] ttl in ms.
-- Replies 1 (journaled), 0 (not the holder), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
if k == 100 then
  local left = redis.call('PTTL', rec)
  if left < 0 then
    return {0, 'dedup claim without an expiry'}
  end
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
  ld = now + left
  -- A plain dedup claim has no journal of its own: whatever is there was left by an
  -- older idem that did not keep the record, and was never read by this claim.
  redis.call('DEL', KEYS[2])
  -- Its expiry stays the lease's until the end of the script moves it past the journal's.
  redis.call('SET', rec, 'p' .. string.char(w) .. 's' .. string.sub(v, 4)
    .. string.format('%015d', ld), 'KEEPTTL')
elseif not ld then
  return {0, 'steps are journaled for dedup and token claims only'}
elseif ld <= now then
  return 0
end
-- What is left of the journal's life (-2: none yet, as after the DEL above).
local left = -2
if k ~= 100 then
  left = redis.call('PTTL', KEYS[2])
end
-- The entry: its kind, when (15 decimal digits, ms by the Redis clock), the value.
local entry = ARGV[3] .. string.format('%015d', now) .. ARGV[4]
if fp then
  redis.call('HSET', KEYS[2], ARGV[2], entry, '\255', fp)
else
  redis.call('HSET', KEYS[2], ARGV[2], entry)
end
local ttl = ARGV[5] + 0
if left < ttl then
  local life = ld - now + ttl
  redis.call('PEXPIRE', KEYS[2], life)
  if k ~= 116 then
    -- A stepped dedup record lives as long as its journal: its expiry is set after the
    -- journal's, from the same server clock, so it is never the earlier of the two.
    redis.call('PEXPIRE', rec, life, 'GT')
  end
end
return 1
