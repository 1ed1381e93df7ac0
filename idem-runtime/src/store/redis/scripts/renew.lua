-- Extends the lease of `owner`'s live claim (one round trip).
--
-- KEYS[1] record; ARGV[1] owner (16 bytes); ARGV[2] lease in ms (>= 1).
-- Replies 1 (renewed), 0 (lease lost), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
if not ld then
  -- Dedup and lock: the key's expiry is the lease, and the key exists.
  redis.call('PEXPIRE', rec, ARGV[2])
  return 1
end
-- A stepped or token claim keeps its lease deadline.
if ld <= now then
  return 0
end
local deadline = now + tonumber(ARGV[2])
-- The lease deadline: the last 15 bytes of a stepped claim, 30 from the end of a token
-- claim. SETRANGE keeps the key's expiry, which GT only ever pushes back: it also
-- covers the journal (stepped) or the token's deadline.
local at = n - 15
if k == 116 then
  at = n - 30
end
redis.call('SETRANGE', rec, at, string.format('%015d', deadline))
redis.call('PEXPIREAT', rec, string.format('%.0f', deadline), 'GT')
return 1
