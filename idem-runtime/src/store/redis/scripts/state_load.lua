-- Reads a state record's state: the script behind `Store::load_state` (one round trip).
--
-- KEYS[1]  the state record (see transition.lua)
--
-- Replies: {1, state} | {2} no state | {0, reason} corrupt.
local r = redis.pcall('HGET', KEYS[1], 's')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem state record (' .. r['err'] .. ')'}
end
if not r then
  return {2}
end
return {1, r}
