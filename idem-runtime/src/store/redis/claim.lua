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
-- in-progress claim, o owner, l lease deadline (ms, Redis clock), t token deadline (ms),
-- f fingerprint, v completed value, w '1' once somebody waited on it.
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
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
-- Numbers go to Redis as integers, never in exponent notation.
local function int(x) return string.format('%.0f', x) end

if f and #f ~= 16 then
  return {0, 'fingerprint has ' .. #f .. ' bytes, expected 16'}
end

local function hold(k2, deadline)
  redis.call('HSET', rec, 's', 'p', 'k', k2, 'o', owner, 'l', int(deadline))
  if fp ~= '' then
    redis.call('HSET', rec, 'f', fp)
  elseif f then
    redis.call('HDEL', rec, 'f')
  end
end

local function fresh()
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
      local seed = tm[1] .. string.sub('000000' .. tm[2], -6)
      redis.call('SET', KEYS[2], seed)
      fence = tonumber(seed)
    else
      fence = c
    end
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
  redis.call('DEL', rec)
  hold(kind, now + lease)
  redis.call('PEXPIRE', rec, lease)
  return {1, fence}
end

local function take_token(texp)
  hold('t', now + lease)
  redis.call('PEXPIREAT', rec, int(math.max(texp, now + lease)))
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
  return fresh()
elseif s == 'p' then
  local ld = tonumber(l)
  if not o or not ld or (k ~= 'd' and k ~= 'l' and k ~= 't') then
    return {0, 'malformed in-progress record'}
  end
  local left = ld - now
  if left > 0 or (k == 't' and kind ~= 't') then
    return busy(left)
  end
  if k ~= 't' then
    -- A lapsed dedup or lock lease (its PEXPIRE is due this very millisecond).
    return fresh()
  end
  local te = tonumber(t)
  if not te then
    return {0, 'token claim without a token deadline'}
  end
  if te <= now then
    redis.call('DEL', rec)
    return {4}
  end
  return take_token(te)
elseif s == 'i' then
  local te = tonumber(t)
  if not te then
    return {0, 'issued token without a deadline'}
  end
  if te <= now then
    redis.call('DEL', rec)
    return fresh()
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
