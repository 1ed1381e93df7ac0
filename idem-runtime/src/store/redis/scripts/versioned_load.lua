-- Reads a versioned value: the script behind `Store::load_versioned` (one round trip).
--
-- KEYS[1]  the value's hash (fields: v value, n version), beside the key's claim record
--
-- Replies: {1, value, version} | {2} absent | {0, reason} corrupt.
local r = redis.pcall('HMGET', KEYS[1], 'v', 'n')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem versioned value (' .. r['err'] .. ')'}
end
if not r[1] and not r[2] then
  return {2}
end
if not r[1] or not tonumber(r[2]) then
  return {0, 'versioned value without a value or a numeric version'}
end
return {1, r[1], tonumber(r[2])}
