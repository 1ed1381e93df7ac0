-- A state-machine move: the script behind `Store::transition` (one round trip: the
-- state check and the write cannot be separated by another mover).
--
-- KEYS[1]  the state record, a hash: s state, p target of a held move, o its owner,
--          l its lease deadline (ms, Redis clock)
-- ARGV[1]  target state
-- ARGV[2]  '1' if a key with no state may move to the target (an initial state)
-- ARGV[3]  owner (32 hex digits) to hold the move for, or '' to perform it now
-- ARGV[4]  hold lease in ms
-- ARGV[5]  ttl of the record after the move in ms, or 0 for none
-- ARGV[6...] the states allowed to move to the target
--
-- Replies: {1, from} moved | {2, from} held | {3} already there |
--          {4, held_to, retry_ms} another owner's hold is live | {5, current} refused |
--          {0, reason} corrupt. `from`/`current` is nil for "no state".
if redis.replicate_commands then redis.replicate_commands() end

local rec, to = KEYS[1], ARGV[1]
local r = redis.pcall('HMGET', rec, 's', 'p', 'o', 'l')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem state record (' .. r['err'] .. ')'}
end
local s, p, l = r[1], r[2], r[4]
local tm = redis.call('TIME')
local now = tm[1] * 1000 + math.floor(tm[2] / 1000)
local function int(x) return string.format('%.0f', x) end

if s == to then
  return {3}
end
if p then
  local deadline = tonumber(l)
  if not deadline then
    return {0, 'held move without a lease deadline'}
  end
  if deadline > now then
    return {4, p, int(deadline - now)}
  end
end
local allowed = false
if s then
  for i = 6, #ARGV do
    if ARGV[i] == s then allowed = true break end
  end
else
  allowed = ARGV[2] == '1'
end
if not allowed then
  return {5, s}
end

local owner, lease, ttl = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if owner == '' then
  redis.call('HSET', rec, 's', to)
  redis.call('HDEL', rec, 'p', 'o', 'l')
  if ttl > 0 then
    redis.call('PEXPIRE', rec, ttl)
  else
    redis.call('PERSIST', rec)
  end
  return {1, s}
end
redis.call('HSET', rec, 'p', to, 'o', owner, 'l', int(now + lease))
-- The record outlives the hold, so the owner's commit finds it.
local pttl = redis.call('PTTL', rec)
if not s or (pttl >= 0 and pttl < lease) then
  redis.call('PEXPIRE', rec, lease)
end
return {2, s}
