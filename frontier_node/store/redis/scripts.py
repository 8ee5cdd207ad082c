"""The Lua scripts of the Redis store, and running them: loaded once, called by digest, reloaded on NOSCRIPT.

Every script touches the keys of one domain only (one Cluster slot, see codec.DomainKeys), so a script call is
atomic in a single server and in a Cluster alike. A restarted or failed-over server forgets loaded scripts:
a call answered NOSCRIPT loads them again (on every primary of a Cluster) and is sent once more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from redis.exceptions import NoScriptError

from frontier_node.store.redis.codec import text

Call = tuple[list[str], list[object]]
"""KEYS and ARGV of one script call."""

# KEYS: 1 fence, 2 items, 3 domain meta, 4 states, 5 sched, 6 robots, 7 journal of the line writer, 8 writers,
# 9.. backlogs of the batch's hosts (declared for Cluster routing; all in the same slot).
# ARGV: 1 writer, 2 epoch, 3 backlog key prefix, 4 line writer, 5 jmax, 6 imax, 7 JSON array of the lines,
# 8 JSON array of key, packed row, key, ..., 9 JSON array of origin, packed record, ... (three arguments rather
# than thousands: redis-py packs each argument in Python, and that was the bulk of a flush's time).
# jmax and imax go to the domain meta when not empty and above what it holds; the store sends jmax empty (max_seqs
# reads the journals' last lines) and imax only when it grew, but older nodes' calls are still applied alike.
WRITE_LUA: Final = r"""
local writer, epoch = ARGV[1], tonumber(ARGV[2])
local fence = redis.call('HMGET', KEYS[1], 'owner', 'epoch')
if fence[2] then
  local fenced = tonumber(fence[2])
  if fenced > epoch or (fenced == epoch and fence[1] ~= writer) then
    return {0, fence[1] or '', fence[2]}
  end
  if epoch > fenced then redis.call('HSET', KEYS[1], 'owner', writer, 'epoch', ARGV[2]) end
else
  redis.call('HSET', KEYS[1], 'owner', writer, 'epoch', ARGV[2])
end
local qprefix = ARGV[3]
local lines, rows, robots = cjson.decode(ARGV[7]), cjson.decode(ARGV[8]), cjson.decode(ARGV[9])
if #lines > 0 then
  redis.call('SADD', KEYS[8], ARGV[4])
  for s = 1, #lines, 4000 do
    local chunk = {}
    for n = s, math.min(s + 3999, #lines) do
      chunk[#chunk + 1] = 0
      chunk[#chunk + 1] = lines[n]
    end
    redis.call('ZADD', KEYS[7], unpack(chunk))
  end
end
for f, v in pairs({jmax = ARGV[5], imax = ARGV[6]}) do
  if v ~= '' then
    local cur = redis.call('HGET', KEYS[3], f)
    if not cur or v > cur then redis.call('HSET', KEYS[3], f, v) end
  end
end
local pat = '^([^\031]*)\031([^\031]*)\031([^\031]*)\031([^\031]*)\031()'
for i = 1, #rows, 2 do
  local key, value = rows[i], rows[i + 1]
  local ns, nh, no, nf, rest = string.match(value, pat)
  local old = redis.call('HGET', KEYS[2], key)
  if old then
    local os, oh, oo, of = string.match(old, pat)
    if redis.call('HINCRBY', KEYS[4], os, -1) <= 0 then redis.call('HDEL', KEYS[4], os) end
    if os == 'scheduled' and redis.call('ZREM', qprefix .. oh, oo .. ':' .. key) == 1 then
      if redis.call('HINCRBY', KEYS[5], oh, -1) <= 0 then redis.call('HDEL', KEYS[5], oh) end
    end
    if of ~= nf then
      value = ns .. '\031' .. nh .. '\031' .. no .. '\031' .. of .. '\031' .. string.sub(value, rest)
    end
  end
  redis.call('HSET', KEYS[2], key, value)
  redis.call('HINCRBY', KEYS[4], ns, 1)
  if ns == 'scheduled' and redis.call('ZADD', qprefix .. nh, 0, no .. ':' .. key) == 1 then
    redis.call('HINCRBY', KEYS[5], nh, 1)
  end
end
for i = 1, #robots, 2 do
  local origin, value = robots[i], robots[i + 1]
  local old = redis.call('HGET', KEYS[6], origin)
  if old then
    local of = string.match(old, '^([^\031]*)\031')
    local nf, rest = string.match(value, '^([^\031]*)\031()')
    if of ~= nf then value = of .. '\031' .. string.sub(value, rest) end
  end
  redis.call('HSET', KEYS[6], origin, value)
end
return {1}
"""

# One call for a whole flush on a single Redis server (not a Cluster: the keys of many domains, built here from
# the namespace rather than declared, live in many slots). KEYS: 1 instance marker. ARGV: 1 writer, 2 epoch,
# 3 namespace, 4 the instance marker the writer opened with, 5 the batches' strings end to end, 6 JSON array of five
# numbers per domain: held, named, lines, rows, robots records, 7 JSON array of the strings' lengths in bytes.
# Per domain the strings are: domain, jmax, imax, the lines, key and packed row per row, origin and packed record
# per robots record (no JSON string escaping in Python nor decoding of every row and line here). `held` is 1 when
# the writer set the domain's fence before (a missing fence then means lost data) and `named` is 1 when the
# domain's writers set already names the writer (no SADD).
# Answers {0, marker} when the marker is not the writer's (nothing written); {2, [domain, ...]} when fences the
# writer held are gone (nothing written); else {1, [domain, owner, epoch, ...]}: the refused domains (their
# batches not applied; every other domain's was). Per domain it applies what WRITE_LUA does, with one HMGET and
# one HSET per few thousand rows, one ZREM / ZADD per host and the counters summed before they are written.
# Cost: the script's own work (tables and strings, beside the commands) was most of Redis's time per leased and
# completed URL, where each domain of a lease or a completion flush holds one row. So the first pass only reads each
# domain's name and fence and notes where its strings start (no table per string); the second cuts a domain's
# strings out of the blob as it writes them, and a domain with a single row takes a path with no tables at all:
# HGET, HSET, at most one ZREM / ZADD and one HINCRBY per counter field that changes. Those are the commands the
# general path sends for one row (counter fields of one hash may be bumped in another order, which leaves the same
# hash), so the data is the same byte for byte: tests/test_store_redis.py compares every key's DUMP with what the
# previous version of this script wrote. Scores are the string '0' (a Lua number is formatted anew per call).
WRITE_ALL_LUA: Final = r"""
local writer, epoch, ns = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local call, sub, match = redis.call, string.sub, string.match
local marker = call('GET', KEYS[1])
if marker ~= ARGV[4] then return {0, marker} end
local blob, counts, lengths = ARGV[5], cjson.decode(ARGV[6]), cjson.decode(ARGV[7])
-- pass 1: each domain's name, where its other strings start, and its fence
local names, spos, sat = {}, {}, {}
local refused, vanished, plan = {}, {}, {}
local pos, at, nb = 1, 0, 0
for i = 1, #counts, 5 do
  nb = nb + 1
  at = at + 1
  local stop = pos + lengths[at]
  local name = sub(blob, pos, stop - 1)
  local d = ns .. ':{d:' .. name .. '}:'
  names[nb], spos[nb], sat[nb] = d, stop, at
  pos = stop
  for _ = 1, 2 + counts[i + 2] + 2 * counts[i + 3] + 2 * counts[i + 4] do
    at = at + 1
    pos = pos + lengths[at]
  end
  local fkey = d .. 'fence'
  local fence = call('HMGET', fkey, 'owner', 'epoch')
  if fence[2] then
    local fenced = tonumber(fence[2])
    if fenced > epoch or (fenced == epoch and fence[1] ~= writer) then
      refused[#refused + 1] = name
      refused[#refused + 1] = fence[1] or ''
      refused[#refused + 1] = fence[2]
    else
      plan[nb] = epoch > fenced and fkey or ''
    end
  else
    if counts[i] == 1 then vanished[#vanished + 1] = name end
    plan[nb] = fkey
  end
end
if #vanished > 0 then return {2, vanished} end
local jsuffix = 'j:' .. writer
local function nxt()
  at = at + 1
  local stop = pos + lengths[at]
  local s = sub(blob, pos, stop - 1)
  pos = stop
  return s
end
local function take(n)
  local out = {}
  for i = 1, n do out[i] = nxt() end
  return out
end
local pat = '^([^\031]*)\031([^\031]*)\031([^\031]*)\031([^\031]*)\031()'
local function chunked(cmd, key, list)
  local total = 0
  for s = 1, #list, 4000 do
    total = total + call(cmd, key, unpack(list, s, math.min(s + 3999, #list)))
  end
  return total
end
local function hmget(key, fields)
  local out = {}
  for s = 1, #fields, 4000 do
    local r = call('HMGET', key, unpack(fields, s, math.min(s + 3999, #fields)))
    for _, v in ipairs(r) do out[#out + 1] = v end
  end
  return out
end
local function counters(key, deltas)
  for f, n in pairs(deltas) do
    if n ~= 0 and call('HINCRBY', key, f, n) <= 0 then call('HDEL', key, f) end
  end
end
local function bump(key, f, n)
  if call('HINCRBY', key, f, n) <= 0 then call('HDEL', key, f) end
end
for k = 1, nb do
  local fkey = plan[k]
  if fkey then
    local c = 5 * (k - 1)
    local named, nl, nr, nro = counts[c + 2], counts[c + 3], counts[c + 4], counts[c + 5]
    pos, at = spos[k], sat[k]
    local jmax, imax = nxt(), nxt()
    if fkey ~= '' then call('HSET', fkey, 'owner', writer, 'epoch', ARGV[2]) end
    local d = names[k]
    if nl > 0 then
      if named ~= 1 then call('SADD', d .. 'writers', writer) end
      if nl == 1 then
        call('ZADD', d .. jsuffix, '0', nxt())
      else
        local scored = {}
        for n = 1, nl do
          scored[2 * n - 1] = '0'
          scored[2 * n] = nxt()
        end
        chunked('ZADD', d .. jsuffix, scored)
      end
    end
    if jmax ~= '' or imax ~= '' then
      local cur = call('HMGET', d .. 'meta', 'jmax', 'imax')
      if jmax ~= '' and (not cur[1] or jmax > cur[1]) then
        if imax ~= '' and (not cur[2] or imax > cur[2]) then
          call('HSET', d .. 'meta', 'jmax', jmax, 'imax', imax)
        else
          call('HSET', d .. 'meta', 'jmax', jmax)
        end
      elseif imax ~= '' and (not cur[2] or imax > cur[2]) then
        call('HSET', d .. 'meta', 'imax', imax)
      end
    end
    if nr == 1 then
      local key, value = nxt(), nxt()
      local items = d .. 'items'
      local old = call('HGET', items, key)
      local ns_, nh, no, nf, rest = match(value, pat)
      local os, oh, oo, of
      if old then
        os, oh, oo, of = match(old, pat)
        if of ~= nf then value = ns_ .. '\031' .. nh .. '\031' .. no .. '\031' .. of .. '\031' .. sub(value, rest) end
      end
      call('HSET', items, key, value)
      local down, up = 0, 0
      if os == 'scheduled' then down = call('ZREM', d .. 'q:' .. oh, oo .. ':' .. key) end
      if ns_ == 'scheduled' then up = call('ZADD', d .. 'q:' .. nh, '0', no .. ':' .. key) end
      if os ~= ns_ then
        if os then bump(d .. 'states', os, -1) end
        bump(d .. 'states', ns_, 1)
      end
      if down ~= 0 or up ~= 0 then
        if oh == nh then
          if up ~= down then bump(d .. 'sched', nh, up - down) end
        else
          if down ~= 0 then bump(d .. 'sched', oh, -down) end
          if up ~= 0 then bump(d .. 'sched', nh, up) end
        end
      end
    elseif nr > 0 then
      local rows = take(2 * nr)
      local keys = {}
      for n = 1, nr do keys[n] = rows[2 * n - 1] end
      local olds = hmget(d .. 'items', keys)
      local states, sched, rem, add = {}, {}, {}, {}
      for n, key in ipairs(keys) do
        local value = rows[2 * n]
        local ns_, nh, no, nf, rest = match(value, pat)
        local old = olds[n]
        if old then
          local os, oh, oo, of = match(old, pat)
          states[os] = (states[os] or 0) - 1
          if os == 'scheduled' then
            local q = rem[oh]
            if not q then q = {}; rem[oh] = q end
            q[#q + 1] = oo .. ':' .. key
          end
          if of ~= nf then
            value = ns_ .. '\031' .. nh .. '\031' .. no .. '\031' .. of .. '\031' .. sub(value, rest)
            rows[2 * n] = value
          end
        end
        states[ns_] = (states[ns_] or 0) + 1
        if ns_ == 'scheduled' then
          local q = add[nh]
          if not q then q = {}; add[nh] = q end
          q[#q + 1] = '0'
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
    if nro > 0 then
      local robots = take(2 * nro)
      local origins = {}
      for n = 1, nro do origins[n] = robots[2 * n - 1] end
      local olds = hmget(d .. 'robots', origins)
      for n, old in ipairs(olds) do
        if old then
          local value = robots[2 * n]
          local of = match(old, '^([^\031]*)\031')
          local nf, rest = match(value, '^([^\031]*)\031()')
          if of ~= nf then robots[2 * n] = of .. '\031' .. sub(value, rest) end
        end
      end
      chunked('HSET', d .. 'robots', robots)
    end
  end
end
return {1, refused}
"""

# KEYS: 1 fence. ARGV: 1 owner, 2 epoch. Sets the fence unless it is newer; answers the previous one.
CLAIM_LUA: Final = r"""
local fence = redis.call('HMGET', KEYS[1], 'owner', 'epoch')
if fence[2] and tonumber(fence[2]) > tonumber(ARGV[2]) then
  return {0, fence[1] or '', fence[2]}
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', ARGV[2])
return {1, fence[1] or '', fence[2] or '-1'}
"""

# KEYS: 1 backlog, 2 items. ARGV: 1 ZRANGEBYLEX min, 2 limit. One round trip for a page of rows.
BACKLOG_LUA: Final = r"""
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], '+', 'LIMIT', 0, ARGV[2])
local keys, rows = {}, {}
for n, m in ipairs(members) do keys[n] = string.sub(m, 43) end
for s = 1, #keys, 4000 do
  local chunk = redis.call('HMGET', KEYS[2], unpack(keys, s, math.min(s + 3999, #keys)))
  for _, r in ipairs(chunk) do rows[#rows + 1] = r end
end
return {keys, rows}
"""

# KEYS: 1 fence, 2 items, 3 states. ARGV: 1 writer, 2 epoch, 3 JSON array of keys. Fenced as a write; deletes
# the rows of the keys (retention of gone pages) and counts them out of their states. A scheduled row (queued in
# a backlog this script does not touch) is left alone. Answers {1, deleted} or {0, owner, epoch}.
PRUNE_LUA: Final = r"""
local writer, epoch = ARGV[1], tonumber(ARGV[2])
local fence = redis.call('HMGET', KEYS[1], 'owner', 'epoch')
if fence[2] then
  local fenced = tonumber(fence[2])
  if fenced > epoch or (fenced == epoch and fence[1] ~= writer) then
    return {0, fence[1] or '', fence[2]}
  end
end
local deleted = 0
for _, key in ipairs(cjson.decode(ARGV[3])) do
  local old = redis.call('HGET', KEYS[2], key)
  if old then
    local state = string.match(old, '^([^\031]*)\031')
    if state ~= 'scheduled' then
      if redis.call('HINCRBY', KEYS[3], state, -1) <= 0 then redis.call('HDEL', KEYS[3], state) end
      redis.call('HDEL', KEYS[2], key)
      deleted = deleted + 1
    end
  end
end
return {1, deleted}
"""

SCRIPTS: Final[dict[str, str]] = {
    "write": WRITE_LUA,
    "write_all": WRITE_ALL_LUA,
    "claim": CLAIM_LUA,
    "backlog": BACKLOG_LUA,
    "prune": PRUNE_LUA,
}


class Scripts:
    """The scripts on one client (a Redis or a RedisCluster): `eval` one call, `run_pipelined` many at once."""

    def __init__(self, client: Any) -> None:
        self._r = client
        self.shas: dict[str, str] = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in SCRIPTS.items()}
        self.load()

    def load(self) -> None:
        """Load the scripts (on every primary of a Cluster) and check the server agrees on their digests."""
        for name, src in SCRIPTS.items():
            sha = text(self._r.script_load(src))
            if sha != self.shas[name]:
                raise RuntimeError(f"redis answered digest {sha} for script {name}, expected {self.shas[name]}")

    def eval(self, name: str, keys: list[str], args: list[object]) -> Any:
        """EVALSHA with one reload on NOSCRIPT."""
        try:
            return self._r.evalsha(self.shas[name], len(keys), *keys, *args)
        except NoScriptError:
            self.load()
            return self._r.evalsha(self.shas[name], len(keys), *keys, *args)

    def run_pipelined(self, name: str, calls: dict[str, Call]) -> dict[str, Any]:
        """Send calls of script `name` in one non-transactional pipeline; reload and resend those that met NOSCRIPT.

        `calls` maps a label to (KEYS, ARGV); the answer maps each label to its reply or the exception it met.
        """
        return self.run_checked(name, calls)[0]

    def run_checked(
        self, name: str, calls: dict[str, Call], before: Sequence[tuple[str, ...]] = ()
    ) -> tuple[dict[str, Any], list[Any]]:
        """run_pipelined, with plain commands `before` the calls in the same pipeline (read first, same round
        trip); their answers (or the exceptions they met) come second, in order."""
        results: dict[str, Any] = {}
        found: list[Any] = []
        todo = list(calls)
        for attempt in range(2):
            pipe = self._r.pipeline(transaction=False)
            if not attempt:
                for command in before:
                    pipe.execute_command(*command)
            for label in todo:
                keys, args = calls[label]
                pipe.execute_command("EVALSHA", self.shas[name], len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
            if not attempt:
                found, answers = answers[: len(before)], answers[len(before) :]
            results.update(zip(todo, answers, strict=True))
            todo = [label for label in todo if isinstance(results[label], NoScriptError)]
            if not todo or attempt:
                break
            self.load()
        return results, found
