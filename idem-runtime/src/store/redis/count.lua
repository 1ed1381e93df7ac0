-- One batch of `idem stats`: a SCAN step over this server's keys (never KEYS, so the
-- server is never blocked for long), and the state byte of each record found. Reads
-- only keys this server holds, so on a Cluster it runs on each primary in turn.
--
-- ARGV[1] cursor; ARGV[2] MATCH pattern; ARGV[3] COUNT hint.
-- Replies {next cursor, {name, state byte, name, state byte, ...}}.
local r = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3], 'TYPE', 'string')
local out = {}
for _, name in ipairs(r[2]) do
  -- Records end with their hash tag; fence counters (`...}:fence`) and toolbox values
  -- (`...}:v`) do not.
  if string.sub(name, -1) == '}' then
    out[#out + 1] = name
    out[#out + 1] = redis.call('GETRANGE', name, 0, 0)
  end
end
return {r[1], out}
