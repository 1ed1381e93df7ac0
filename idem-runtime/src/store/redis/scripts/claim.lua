-- Claims a record when the caller's native command could not: the script behind a lock
-- acquisition, a token claim, and a dedup claim that found something other than nothing
-- or a completed record (one round trip). Records are strings; see mod.rs for the layout.
--
-- KEYS[1]  the record; KEYS[2] (same hash tag, one slot): for a lock its fence counter,
--          else its step journal
-- ARGV[1]  the in-progress record to write: 'p' '-' kind owner(16) [fingerprint(16)],
--          kind 'd' dedup, 'l' lock or 't' token; a token claim gets its two deadlines
--          appended here, a dedup claim that takes a stepped record its lease deadline
-- ARGV[2]  lease in ms (>= 1)
-- ARGV[3]  a lock: ttl of a new fence counter in ms; else the notification channel
--
-- Replies: fence (an integer: claimed; 0 but for a lock) | {1, {journal as HGETALL
--          gives it}} claimed, with the journal of earlier attempts | {2, retry_ms, fingerprint} busy
--          | {3, record} completed (the caller parses the record) | {4} missing token
--          | {5, fingerprint} not claimed: the journal was written for another payload
--          | {0, reason} corrupt.
-- A recoverable dedup claim (see recovery.rs) also has KEYS[3] (the namespace's
-- recovery index), ARGV[4] (the call's arguments) and ARGV[5] (their ttl in ms): the
-- record it takes is stepped at once (it outlives its lease, for a recoverer to find),
-- its journal keeps the arguments under the field 0xFE, and the index gets the record
-- at its lease deadline.
local rec, claim, lease = KEYS[1], ARGV[1], ARGV[2]
-- Bytes as numbers: 112 'p', 99 'c', 105 'i', 45 '-', 119 'w', 100 'd', 108 'l',
-- 115 's', 116 't'.
local kind = string.byte(claim, 3)

local v
if kind == 108 then
  -- The common case in one command: the key is free (no reply: set). Otherwise the
  -- reply is what holds the key, read in the same step. (Inline, as every step before
  -- the busy path is: a local function is a closure made anew on each call.)
  v = redis.pcall('SET', rec, claim, 'NX', 'GET', 'PX', lease)
  if not v then
    -- Fences are strictly increasing per key even after the counter expires: a new
    -- counter starts at the Redis clock in microseconds, above anything an INCR could
    -- have reached (at most one per microsecond since the old one started). So the
    -- counter's expiry is set when it starts and never pushed back: it only bounds
    -- memory, and the common path is one INCR.
    local c = redis.pcall('INCR', KEYS[2])
    if type(c) ~= 'number' then
      redis.call('DEL', rec)
      return {0, 'fence counter is not an integer'}
    end
    if c == 1 then
      local t = redis.call('TIME')
      local seed = t[1] .. string.sub('000000' .. t[2], -6)
      redis.call('SET', KEYS[2], seed, 'PX', ARGV[3])
      return tonumber(seed)
    end
    return c
  end
else
  v = redis.pcall('GET', rec)
end
if type(v) == 'table' then
  return {0, 'not an idem record (' .. tostring(v['err']) .. ')'}
end
if not v then
  if kind == 116 then
    return {4}
  end
  if ARGV[4] then
    -- A recoverable claim of a free key (its record would have a journal otherwise).
    local t = redis.call('TIME')
    local now = t[1] * 1000 + math.floor(t[2] / 1000)
    local ld = now + tonumber(lease)
    redis.call('SET', rec, 'p-s' .. string.sub(claim, 4) .. string.format('%015d', ld),
      'PXAT', string.format('%.0f', math.max(ld, now + tonumber(ARGV[5]))))
    redis.call('DEL', KEYS[2])
    if #claim == 35 then
      redis.call('HSET', KEYS[2], '\254', ARGV[4], '\255', string.sub(claim, 20, 35))
    else
      redis.call('HSET', KEYS[2], '\254', ARGV[4])
    end
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
    redis.call('ZADD', KEYS[3], ld, rec)
    return 0
  end
  -- A dedup claim whose record vanished since its SET NX GET (a lock never gets here:
  -- its SET NX GET has just set the key). A stepped record lives as long as its
  -- journal, so there is no journal to resume either.
  redis.call('SET', rec, claim, 'PX', lease)
  return 0
end

local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- Marks the record as waited on (keeping its expiry), so whoever ends it publishes.
local function busy(w, left, fp)
  if w ~= 119 then
    redis.call('SETRANGE', rec, 1, 'w')
  end
  return {2, math.max(left, 0), fp}
end

-- The fingerprint of the journal, if it was written for another payload than the
-- claim's: then nothing may be claimed (both must have a fingerprint). The journal keeps
-- it under the field named by the single byte 0xFF, never a step name (see step.lua).
local function other_payload()
  if #claim ~= 35 then
    return nil
  end
  local theirs = redis.call('HGET', KEYS[2], '\255')
  if theirs and theirs ~= string.sub(claim, 20, 35) then
    return theirs
  end
end

-- The journal of earlier attempts, as the claim's reply.
local function claimed()
  local j = redis.call('HGETALL', KEYS[2])
  if #j > 0 then
    return {1, j}
  end
  return 0
end

local function take_token(w, te, now)
  local theirs = other_payload()
  if theirs then
    return {5, theirs}
  end
  local ld = now + tonumber(lease)
  redis.call('SET', rec, claim .. string.format('%015d%015d', ld, te),
    'PXAT', string.format('%.0f', math.max(ld, te)))
  if w == 119 then
    redis.call('PUBLISH', ARGV[3], rec)
  end
  return claimed()
end

-- A dedup claim takes a stepped record whose lease ended (released, or abandoned):
-- unless its journal belongs to another payload, the record becomes the caller's, still
-- stepped, and the key keeps living at least as long as the journal.
local function take_stepped(w, now)
  local theirs = other_payload()
  if theirs then
    return {5, theirs}
  end
  local ld = now + tonumber(lease)
  local left = redis.call('PTTL', rec)
  if ARGV[4] then
    -- Recoverable: the arguments are this claim's, the record and journal live at
    -- least their ttl, and the index has the record at its new lease deadline. A
    -- parked call taken by a caller is in flight again.
    left = math.max(left, tonumber(ARGV[5]))
    redis.call('HSET', KEYS[2], '\254', ARGV[4])
    redis.call('HDEL', KEYS[2], '\252')
    if redis.call('PTTL', KEYS[2]) < left then
      redis.call('PEXPIRE', KEYS[2], left)
    end
    redis.call('ZADD', KEYS[3], ld, rec)
  end
  redis.call('SET', rec, 'p-s' .. string.sub(claim, 4) .. string.format('%015d', ld),
    'PXAT', string.format('%.0f', math.max(ld, now + left)))
  if w == 119 then
    redis.call('PUBLISH', ARGV[3], rec)
  end
  return claimed()
end

-- A deadline field: 15 decimal digits (ms by the Redis clock), else nil.
local function digits(x)
  if not string.find(x, '%D') then
    return tonumber(x)
  end
end

local s, w, k = string.byte(v, 1, 3)
local n = #v
if s == 99 then
  -- The caller parses (and checks) a completed record, as after its own SET NX GET.
  return {3, v}
elseif s == 112 then
  if w ~= 45 and w ~= 119 then
    return {0, 'malformed in-progress record'}
  end
  if k == 100 or k == 108 then
    if n ~= 19 and n ~= 35 then
      return {0, 'malformed in-progress record'}
    end
    -- The key's expiry is the lease: it exists, so the lease is live.
    local fp
    if n == 35 then
      fp = string.sub(v, 20, 35)
    end
    return busy(w, redis.call('PTTL', rec), fp)
  elseif k == 116 then
    if n ~= 49 and n ~= 65 then
      return {0, 'malformed in-progress record'}
    end
    local ld, te = digits(string.sub(v, n - 29, n - 15)), digits(string.sub(v, n - 14))
    if not ld or not te then
      return {0, 'token claim without its deadlines'}
    end
    local fp
    if n == 65 then
      fp = string.sub(v, 20, 35)
    end
    local now = now_ms()
    if ld > now or kind ~= 116 then
      return busy(w, ld - now, fp)
    end
    if te <= now then
      redis.call('DEL', rec)
      return {4}
    end
    return take_token(w, te, now)
  elseif k == 115 then
    if n ~= 34 and n ~= 50 then
      return {0, 'malformed in-progress record'}
    end
    local ld = digits(string.sub(v, n - 14))
    if not ld then
      return {0, 'claim without its lease deadline'}
    end
    local fp
    if n == 50 then
      fp = string.sub(v, 20, 35)
    end
    local now = now_ms()
    if ld > now then
      return busy(w, ld - now, fp)
    end
    if kind == 100 then
      return take_stepped(w, now)
    end
    -- A token or lock claim under a dedup record's name cannot be made through the
    -- runtime (their scopes differ). A lapsed dedup claim is no token; to a lock it
    -- is held until its journal expires.
    if kind == 116 then
      return {4}
    end
    return busy(w, redis.call('PTTL', rec), nil)
  end
  return {0, 'malformed in-progress record'}
elseif s == 105 then
  if n ~= 2 or (w ~= 45 and w ~= 119) then
    return {0, 'malformed issued token'}
  end
  -- The token's deadline is the key's own expiry.
  local left = redis.call('PTTL', rec)
  if left < 0 then
    return {0, 'issued token without an expiry'}
  end
  if kind ~= 116 then
    return busy(w, left, nil)
  end
  local now = now_ms()
  return take_token(w, now + left, now)
end
return {0, 'unknown record state'}
