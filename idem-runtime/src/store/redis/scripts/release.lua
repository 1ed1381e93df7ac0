-- Gives a claim back if `owner` holds it (one round trip): deletes a plain dedup or lock
-- record, returns a claimed token to `Issued` with the token's remaining ttl, and keeps
-- a stepped record for its journal, its lease ended.
--
-- KEYS[1] record; KEYS[2] its journal; KEYS[3] the namespace's recovery index;
-- ARGV[1] owner (16 bytes); ARGV[2] channel; ARGV[3] what the release is: '-' a plain
-- call's (no recovery data to touch), 'r' a recoverable call's after an `Err` (its
-- arguments and index entry go: not recovered), 'a' a dropped recoverable call's (it
-- stays, due now).
-- A stepped release always answers 1 once past the owner check: the call is over.
-- Replies 1 (released), 0 (not the holder), or {0, reason} (corrupt).
-- Runs after held.lua: `v` is a record in progress held by ARGV[1].
if k == 115 then
  -- A stepped record whose lease ran out is free already, maybe taken over next.
  if ld <= now then
    return 0
  end
  -- Its lease deadline becomes all zeros (released, where a lease that ran out keeps
  -- its deadline), nobody waits any more, and the key keeps its expiry: that of the
  -- journal, so a claim meets the record and checks the journal's payload.
  redis.call('SET', rec, 'p-s' .. string.sub(v, 4, n - 15) .. '000000000000000', 'KEEPTTL')
  if ARGV[3] == 'a' then
    if redis.call('HEXISTS', KEYS[2], '\254') == 1 then
      redis.call('ZADD', KEYS[3], now, rec)
    end
  elseif ARGV[3] == 'r' then
    redis.call('HDEL', KEYS[2], '\254', '\253', '\252')
    redis.call('ZREM', KEYS[3], rec)
  end
elseif k == 116 then
  -- (15 decimal digits, ms by the Redis clock)
  local te = string.sub(v, n - 14)
  te = not string.find(te, '%D') and tonumber(te)
  if not te then
    return {0, 'token claim without its deadlines'}
  end
  if te > now then
    redis.call('SET', rec, 'i-', 'PXAT', string.format('%.0f', te))
  else
    redis.call('DEL', rec)
  end
else
  redis.call('DEL', rec)
end
if w == 119 then
  redis.call('PUBLISH', ARGV[2], rec)
end
return 1
