-- One batch of `idem stats`: a SCAN step over this server's keys (never KEYS, so the
-- server is never blocked for long), and the state byte of each record found. Reads
-- only keys this server holds, so on a Cluster it runs on each primary in turn.
--
-- ARGV[1] cursor; ARGV[2] MATCH pattern; ARGV[3] COUNT hint.
-- Replies {next cursor, {name, state byte, name, state byte, ...}}.
local r = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3], 'TYPE', 'string')
local out = {}
local now
for _, name in ipairs(r[2]) do
  -- Records end with their hash tag; fence counters (`...}:fence`) and toolbox values
  -- (`...}:v`) do not.
  if string.sub(name, -1) == '}' then
    local head = redis.call('GETRANGE', name, 0, 2)
    local live = true
    if string.sub(head, 3, 3) == 's' and string.sub(head, 1, 1) == 'p' then
      -- A stepped record whose lease ended (released or abandoned) is kept only for its
      -- journal: no record to count. Its last 15 bytes are the lease deadline.
      if not now then
        local t = redis.call('TIME')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
      end
      local ld = tonumber(redis.call('GETRANGE', name, -15, -1))
      live = not ld or ld > now
    end
    if live then
      out[#out + 1] = name
      out[#out + 1] = string.sub(head, 1, 1)
    end
  end
end
return {r[1], out}
