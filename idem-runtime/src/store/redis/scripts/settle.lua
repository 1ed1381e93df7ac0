-- Commits, aborts or renews a held state-machine move: the script behind
-- `Store::settle_transition` (one round trip).
--
-- KEYS[1]  the state record (see transition.lua)
-- ARGV[1]  owner, 32 hex digits
-- ARGV[2]  'c' commit, 'a' abort, 'r' renew
-- ARGV[3]  commit: ttl of the record in ms (0: none); renew: the new lease in ms
--
-- Replies: 1 settled | 0 the owner holds no move here | {0, reason} corrupt.
if redis.replicate_commands then redis.replicate_commands() end

local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 'p', 'o')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem state record (' .. r['err'] .. ')'}
end
local s, p, o = r[1], r[2], r[3]
if not p or o ~= ARGV[1] then
  return 0
end
local action, ms = ARGV[2], tonumber(ARGV[3])
if action == 'c' then
  redis.call('HSET', rec, 's', p)
  redis.call('HDEL', rec, 'p', 'o', 'l')
  if ms > 0 then
    redis.call('PEXPIRE', rec, ms)
  else
    redis.call('PERSIST', rec)
  end
elseif action == 'a' then
  if s then
    redis.call('HDEL', rec, 'p', 'o', 'l')
  else
    -- Nothing was ever entered: the key goes back to having no record.
    redis.call('DEL', rec)
  end
else
  local tm = redis.call('TIME')
  local now = tm[1] * 1000 + math.floor(tm[2] / 1000)
  redis.call('HSET', rec, 'l', string.format('%.0f', now + ms))
  local pttl = redis.call('PTTL', rec)
  if not s or (pttl >= 0 and pttl < ms) then
    redis.call('PEXPIRE', rec, ms)
  end
end
return 1
