local args = cjson.decode(ARGV[1])
local out = {}
for i = 1, #args, 7 do
  local first = ''
  if args[i] ~= '' then
    first = redis.call('GET', args[i])
    if not first then
      redis.call('SET', args[i], args[i + 1])
      first = ''
    end
  end
  local seen = {}
  if args[i + 2] ~= '' then
    seen = redis.call('SUNION', args[i + 3], args[i + 4], args[i + 5], args[i + 6])
    for b = 3, 6 do redis.call('SADD', args[i + b], args[i + 2]) end
  end
  out[#out + 1] = {first, seen}
end
return cjson.encode(out)
