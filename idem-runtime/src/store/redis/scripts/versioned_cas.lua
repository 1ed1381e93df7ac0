-- Compare-and-set of a versioned value: the script behind `Store::compare_and_set`
-- (one round trip, so no writer can slip in between the version check and the write).
--
-- KEYS[1]  the value's hash (fields: v value, n version)
-- ARGV[1]  expected version (0: absent)
-- ARGV[2]  the new value
-- ARGV[3]  ttl in ms, or 0 to keep the value without expiry
--
-- Replies: {1, new_version} written | {2} conflict | {0, reason} corrupt.
local r = redis.pcall('HGET', KEYS[1], 'n')
if type(r) == 'table' and r['err'] then
  return {0, 'not an idem versioned value (' .. r['err'] .. ')'}
end
local current = 0
if r then
  current = tonumber(r)
  if not current then
    return {0, 'version is not a number'}
  end
end
if current ~= tonumber(ARGV[1]) then
  return {2}
end
local version = current + 1
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'n', string.format('%.0f', version))
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('PERSIST', KEYS[1])
end
return {1, version}
