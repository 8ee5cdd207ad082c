
local writer, epoch, ns = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local marker = redis.call('GET', KEYS[1])
if marker ~= ARGV[4] then return {0, marker} end
local blob, counts, lengths = ARGV[5], cjson.decode(ARGV[6]), cjson.decode(ARGV[7])
local pos, at = 1, 0
local function take(n)
  local out = {}
  for i = 1, n do
    at = at + 1
    local stop = pos + lengths[at]
    out[i] = string.sub(blob, pos, stop - 1)
    pos = stop
  end
  return out
end
-- batches[i]: domain, held, jmax, imax, lines, rows (key, packed row, ...), robots (origin, record, ...), named
local batches = {}
for i = 1, #counts, 5 do
  local head = take(3)
  batches[#batches + 1] = {head[1], counts[i], head[2], head[3], take(counts[i + 2]), take(2 * counts[i + 3]),
    take(2 * counts[i + 4]), counts[i + 1]}
end
local refused, vanished, plan = {}, {}, {}
for i, b in ipairs(batches) do
  local fkey = ns .. ':{d:' .. b[1] .. '}:fence'
  local fence = redis.call('HMGET', fkey, 'owner', 'epoch')
  if fence[2] then
    local fenced = tonumber(fence[2])
    if fenced > epoch or (fenced == epoch and fence[1] ~= writer) then
      refused[#refused + 1] = b[1]
      refused[#refused + 1] = fence[1] or ''
      refused[#refused + 1] = fence[2]
    else
      plan[i] = epoch > fenced and fkey or ''
    end
  else
    if b[2] == 1 then vanished[#vanished + 1] = b[1] end
    plan[i] = fkey
  end
end
if #vanished > 0 then return {2, vanished} end
local pat = '^([^\031]*)\031([^\031]*)\031([^\031]*)\031([^\031]*)\031()'
local function chunked(cmd, key, list)
  local total = 0
  for s = 1, #list, 4000 do
    total = total + redis.call(cmd, key, unpack(list, s, math.min(s + 3999, #list)))
  end
  return total
end
local function hmget(key, fields)
  local out = {}
  for s = 1, #fields, 4000 do
    local r = redis.call('HMGET', key, unpack(fields, s, math.min(s + 3999, #fields)))
    for _, v in ipairs(r) do out[#out + 1] = v end
  end
  return out
end
local function counters(key, deltas)
  for f, n in pairs(deltas) do
    if n ~= 0 and redis.call('HINCRBY', key, f, n) <= 0 then redis.call('HDEL', key, f) end
  end
end
for i, b in ipairs(batches) do
  local fkey = plan[i]
  if fkey then
    if fkey ~= '' then redis.call('HSET', fkey, 'owner', writer, 'epoch', ARGV[2]) end
    local d = ns .. ':{d:' .. b[1] .. '}:'
    local lines, rows, robots = b[5], b[6], b[7]
    if #lines > 0 then
      if b[8] ~= 1 then redis.call('SADD', d .. 'writers', writer) end
      local scored = {}
      for n, line in ipairs(lines) do
        scored[2 * n - 1] = 0
        scored[2 * n] = line
      end
      chunked('ZADD', d .. 'j:' .. writer, scored)
    end
    if b[3] ~= '' or b[4] ~= '' then
      local cur = redis.call('HMGET', d .. 'meta', 'jmax', 'imax')
      local set = {}
      if b[3] ~= '' and (not cur[1] or b[3] > cur[1]) then set[#set + 1] = 'jmax'; set[#set + 1] = b[3] end
      if b[4] ~= '' and (not cur[2] or b[4] > cur[2]) then set[#set + 1] = 'imax'; set[#set + 1] = b[4] end
      if #set > 0 then redis.call('HSET', d .. 'meta', unpack(set)) end
    end
    if #rows > 0 then
      local keys = {}
      for n = 1, #rows, 2 do keys[#keys + 1] = rows[n] end
      local olds = hmget(d .. 'items', keys)
      local states, sched, rem, add = {}, {}, {}, {}
      for n, key in ipairs(keys) do
        local value = rows[2 * n]
        local ns_, nh, no, nf, rest = string.match(value, pat)
        local old = olds[n]
        if old then
          local os, oh, oo, of = string.match(old, pat)
          states[os] = (states[os] or 0) - 1
          if os == 'scheduled' then
            local q = rem[oh]
            if not q then q = {}; rem[oh] = q end
            q[#q + 1] = oo .. ':' .. key
          end
          if of ~= nf then
            value = ns_ .. '\031' .. nh .. '\031' .. no .. '\031' .. of .. '\031' .. string.sub(value, rest)
            rows[2 * n] = value
          end
        end
        states[ns_] = (states[ns_] or 0) + 1
        if ns_ == 'scheduled' then
          local q = add[nh]
          if not q then q = {}; add[nh] = q end
          q[#q + 1] = 0
          q[#q + 1] = no .. ':' .. key
        end
      end
      chunked('HSET', d .. 'items', rows)
      for h, members in pairs(rem) do
        sched[h] = (sched[h] or 0) - chunked('ZREM', d .. 'q:' .. h, members)
      end
      for h, members in pairs(add) do
        sched[h] = (sched[h] or 0) + chunked('ZADD', d .. 'q:' .. h, members)
      end
      counters(d .. 'states', states)
      counters(d .. 'sched', sched)
    end
    if #robots > 0 then
      local origins = {}
      for n = 1, #robots, 2 do origins[#origins + 1] = robots[n] end
      local olds = hmget(d .. 'robots', origins)
      for n, old in ipairs(olds) do
        if old then
          local value = robots[2 * n]
          local of = string.match(old, '^([^\031]*)\031')
          local nf, rest = string.match(value, '^([^\031]*)\031()')
          if of ~= nf then robots[2 * n] = of .. '\031' .. string.sub(value, rest) end
        end
      end
      chunked('HSET', d .. 'robots', robots)
    end
  end
end
return {1, refused}
