-- Claims a record: the one script behind every `Store::claim` (one round trip).
--
-- KEYS[1]  the record (a hash), KEYS[2] its lock fence counter (same hash tag, one slot)
-- ARGV[1]  claim kind: 'd' dedup, 'l' lock, 't' token
-- ARGV[2]  owner, 32 hex digits
-- ARGV[3]  lease in ms (>= 1)
-- ARGV[4]  fingerprint (16 raw bytes) or '' for none
-- ARGV[5]  ttl of the fence counter in ms
-- ARGV[6]  notification channel
--
-- Record fields: s state ('p' in progress, 'c' completed, 'i' issued token), k kind of the
-- in-progress claim, o owner, f fingerprint, v completed value, w '1' once somebody
-- waited on it; for tokens only, t the token's deadline and l the claim's lease deadline
-- (ms, Redis clock). A dedup or lock claim needs no deadline in the record: its key's
-- own PEXPIRE is the lease, so while the key exists the lease is live.
--
-- Replies: {1, fence} claimed | {2, retry_ms, fingerprint} busy |
--          {3, value, fingerprint} completed | {4} missing token | {0, reason} corrupt.
if redis.replicate_commands then redis.replicate_commands() end

local rec = KEYS[1]
local kind, owner, lease, fp = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local r = redis.pcall('HMGET', rec, 's', 'o', 'l', 't', 'f', 'v', 'k', 'w')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem record (' .. r['err'] .. ')'}
end
local s, o, l, t, f, v, k, w = r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]

if f and #f ~= 16 then
  return {0, 'fingerprint has ' .. #f .. ' bytes, expected 16'}
end

-- The Redis clock, read only on the paths that need it (tokens, a new fence counter).
local tm, now
local function clock()
  if not now then
    tm = redis.call('TIME')
    now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  end
  return now
end
-- Numbers go to Redis as integers, never in exponent notation.
local function int(x) return string.format('%.0f', x) end

local function fresh(stale)
  if stale then
    redis.call('DEL', rec)
  end
  if kind == 't' then
    return {4}
  end
  local fence = 0
  if kind == 'l' then
    -- Strictly increasing per key even after the counter expires: a new counter starts
    -- at the Redis clock in microseconds, above anything an INCR could have reached.
    local c = redis.pcall('INCR', KEYS[2])
    if type(c) == 'table' and c['err'] then
      return {0, 'fence counter is not an integer'}
    end
    if c == 1 then
      clock()
      local seed = tm[1] .. string.sub('000000' .. tm[2], -6)
      redis.call('SET', KEYS[2], seed)
      fence = tonumber(seed)
    else
      fence = c
    end
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
  if fp ~= '' then
    redis.call('HSET', rec, 's', 'p', 'k', kind, 'o', owner, 'f', fp)
  else
    redis.call('HSET', rec, 's', 'p', 'k', kind, 'o', owner)
  end
  redis.call('PEXPIRE', rec, lease)
  return {1, fence}
end

local function take_token(texp)
  local deadline = clock() + lease
  redis.call('HSET', rec, 's', 'p', 'k', 't', 'o', owner, 'l', int(deadline))
  if fp ~= '' then
    redis.call('HSET', rec, 'f', fp)
  elseif f then
    redis.call('HDEL', rec, 'f')
  end
  redis.call('PEXPIREAT', rec, int(math.max(texp, deadline)))
  if w then
    redis.call('HDEL', rec, 'w')
    redis.call('PUBLISH', ARGV[6], rec)
  end
  return {1, 0}
end

local function busy(left)
  if not w then
    redis.call('HSET', rec, 'w', '1')
  end
  return {2, math.max(left, 0), f}
end

if not s then
  if redis.call('EXISTS', rec) == 1 then
    return {0, 'record has no state'}
  end
  return fresh(false)
elseif s == 'p' then
  if not o or (k ~= 'd' and k ~= 'l' and k ~= 't') then
    return {0, 'malformed in-progress record'}
  end
  if k ~= 't' then
    -- The key's expiry is the lease: it exists, so the lease is live.
    return busy(redis.call('PTTL', rec))
  end
  local ld, te = tonumber(l), tonumber(t)
  if not ld or not te then
    return {0, 'token claim without its deadlines'}
  end
  local left = ld - clock()
  if left > 0 or kind ~= 't' then
    return busy(left)
  end
  if te <= now then
    return fresh(true)
  end
  return take_token(te)
elseif s == 'i' then
  local te = tonumber(t)
  if not te then
    return {0, 'issued token without a deadline'}
  end
  if te <= clock() then
    return fresh(true)
  end
  if kind ~= 't' then
    return busy(te - now)
  end
  return take_token(te)
elseif s == 'c' then
  if not v then
    return {0, 'completed record without a value'}
  end
  return {3, v, f}
end
return {0, 'unknown record state'}
