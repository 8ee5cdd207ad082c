"""Bodies fetched anywhere in a cluster (core.ports.BodyIndex on Redis): a mirror is recognised whichever node
fetched its twin.

Layout (each key its own hash tag, so a Redis Cluster spreads them over its shards):

    ns:{b:<digest>}                 string  the fetch key first fetched with this exact body (first wins: Lua)
    ns:{s:<band>:<16-bit value>}    set     members "<simhash hex>:<key hash hex>" of bodies with that band value

Cost per fetched 2xx page: a GET-or-SET of the digest plus, when the page has a simhash, the members of its 4
bands and 4 SADD, in one round trip for a page or, primed, for a whole CompleteBatch slice (on one server one
script call that judges the near check itself: one JSON argument, 1 SUNION for the bands, one character a claim
and the first keys found in the answer); about 120 bytes sent and, in Redis, one string (the key, at most 512
characters) and four 25-byte set members per distinct body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Final, NamedTuple

import orjson
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from frontier_node.core.ports import BodyClaim, Claim
from frontier_node.store.redis.codec import check_tag_free, text
from frontier_node.store.redis.line import Line, Writer

Primed = dict[Claim, list[BodyClaim]]
"""The answers of registered claims, by claim, for the `claim` calls that follow."""

_FIRST_WINS: Final = """
local first = redis.call('GET', KEYS[1])
if first then return first end
redis.call('SET', KEYS[1], ARGV[1])
return false
"""
# One call for a batch of claims on a single server (not a Cluster: the keys are in many slots, built by the
# caller, not declared). ARGV: 1 max_distance, 2 a JSON array of groups of 7 (`_Plan`): digest key ("" none), fetch
# key as stored, band member "<simhash hex>:<own tag>" ("" none), the 4 band keys. Per claim, in order, what one
# claim's pipeline does (`_queue`): the digest's GET-or-SET, then the members of the 4 bands (one SUNION: the near
# check needs each member once, not which band held it) and SADD of the member to each. The near check runs here,
# on those members (they are not sent back: their number grows with the index, about one per 65,536 bodies a band),
# and stops at the first near one. Answers {nears, firsts}: one character a claim ("1" near, "0" not) and a flat
# array of claim number (from 1) and first key, for the claims whose digest was first fetched under another key.
# `bit` (LuaBitOp, in every Redis since 2.8) XORs the simhashes' 32-bit halves; `ones` counts the bits that differ,
# giving up past max_distance. On Redis 7.0 and later one SET NX GET does the GET-or-SET (see claim_all_script): a
# command fewer per claim.
_CLAIM_ALL: Final = """
local maxd = tonumber(ARGV[1])
local args = cjson.decode(ARGV[2])
local call, sub, tonum, bxor, band = redis.call, string.sub, tonumber, bit.bxor, bit.band
local function ones(x, n)
  while x ~= 0 and n <= maxd do
    x = band(x, x - 1)
    n = n + 1
  end
  return n
end
local nears, firsts = {}, {}
for i = 1, #args, 7 do
  local n = (i + 6) / 7
  local key, member = args[i + 1], args[i + 2]
  if args[i] ~= '' then
    local first = call('GET', args[i])
    if not first then
      call('SET', args[i], key)
    end
    if first and first ~= key then
      firsts[#firsts + 1] = n
      firsts[#firsts + 1] = first
    end
  end
  local near = '0'
  if member ~= '' then
    local seen = call('SUNION', args[i + 3], args[i + 4], args[i + 5], args[i + 6])
    if #seen > 0 then
      local own, hi, lo = sub(member, 18), tonum(sub(member, 1, 8), 16), tonum(sub(member, 9, 16), 16)
      for _, m in ipairs(seen) do
        local mhi, mlo = tonum(sub(m, 1, 8), 16), tonum(sub(m, 9, 16), 16)
        if mhi and mlo and sub(m, 18) ~= own and ones(bxor(mlo, lo), ones(bxor(mhi, hi), 0)) <= maxd then
          near = '1'
          break
        end
      end
    end
    for b = 3, 6 do call('SADD', args[i + b], member) end
  end
  nears[n] = near
end
return {table.concat(nears), firsts}
"""
_GET_OR_SET: Final = """    local first = call('GET', args[i])
    if not first then
      call('SET', args[i], key)
    end
"""
_SET_NX_GET: Final = """    local first = call('SET', args[i], key, 'NX', 'GET')
"""
if _GET_OR_SET not in _CLAIM_ALL:
    raise ImportError("frontier_node.store.redis.bodies: the claim script's GET-or-SET changed; update _GET_OR_SET")
_CLAIM_ALL_SET_NX_GET: Final = _CLAIM_ALL.replace(_GET_OR_SET, _SET_NX_GET)
_MASK: Final = (1 << 64) - 1
_KEY_LIMIT: Final = 512


def server_version(client: Any) -> tuple[int, ...]:
    """The Redis server's version as numbers; (0,), treated as the oldest, when INFO does not say or is not allowed
    (an ACL user without INFO still opens the index, with the script every version runs)."""
    try:
        found = client.info("server").get("redis_version", "")
        return tuple(int(part) for part in str(found).split("."))
    except (ResponseError, ValueError):
        return (0,)


def claim_all_script(version: tuple[int, ...]) -> str:
    """The batch claim script for a server of `version`: SET NX GET from 7.0 on (NX with GET is refused before),
    else GET then SET. Both register and answer alike (tests/test_store_redis.py runs both)."""
    return _CLAIM_ALL_SET_NX_GET if version >= (7, 0) else _CLAIM_ALL


class _Plan(NamedTuple):
    """What one claim touches: the digest's key ("" none), the fetch key as stored, the band member ("" none) and
    the 4 band keys, with the simhash and the key's own tag for the near check."""

    digest_key: str
    key: str
    member: str
    bands: list[str]
    simhash: int
    own: str


class RedisBodyIndex:
    """The cluster-wide body index: exact digests first-wins, simhash bands for near duplicates."""

    def __init__(self, client: Any, namespace: str = "hostring", max_distance: int = 3) -> None:
        check_tag_free("namespace", namespace)
        self._r = client
        self._ns = namespace
        self.max_distance = max_distance
        self._primed: Primed = {}
        self._sender: Writer | None = None  # prime_later's thread on a Cluster, started at its first call
        self._line: Line | None = None  # prime_later's line on a single server, opened at its first call
        self._band_prefixes = [f"{namespace}:{{s:{band}:" for band in range(4)]  # band_key's, before the value
        single = not isinstance(client, RedisCluster)
        self._claim_all = client.register_script(claim_all_script(server_version(client))) if single else None

    def _pipeline(self) -> Any:
        return self._r.pipeline(transaction=False)

    def digest_key(self, digest: str) -> str:
        return f"{self._ns}:{{b:{digest}}}"

    def band_key(self, band: int, value: int) -> str:
        return f"{self._band_prefixes[band]}{value:04x}}}"

    def prime_later(self, claims: Sequence[Claim]) -> Future[Primed]:
        """Register a batch of bodies (digest, simhash, key) in one round trip, in order, without waiting for it: the
        Future answers what `use_primed` then hands to the `claim` calls that follow (the core claims one at a time).
        The core thread goes on meanwhile: a registration was a round trip it sat out, behind the flush Redis was
        applying. On a single server one script call does what the claims would do one after the other, sent on the
        index's line (line.py: by the caller when no registration is out, its answer read on the line's thread); on
        a Cluster one pipeline holds the commands they would send, in the same order (every key's commands keep
        their order, so the answers are the same), run on the index's own thread."""
        script = self._claim_all
        if script is None:
            if self._sender is None:
                self._sender = Writer("redis-claims")
            return self._sender.submit(lambda: self._register(claims))
        todo = self._todo(claims)
        if not todo:
            nothing: Future[Primed] = Future()
            nothing.set_result({})
            return nothing
        args = self._claim_args(todo)
        pipe = self._pipeline()
        pipe.execute_command("EVALSHA", script.sha, 0, *args)
        if self._line is None:
            self._line = Line(self._r, "redis-claims", halts=False)

        def primed(answers: list[Any]) -> Primed:
            found = answers[0]
            if isinstance(found, NoScriptError):  # a restarted server: the script loads and runs again
                found = script(args=args)
            elif isinstance(found, BaseException):
                raise found
            return self._by_claim(todo, found)

        return self._line.submit(pipe, primed)

    def use_primed(self, primed: Primed) -> None:
        """Answer the `claim` calls that follow from `primed` (a `prime_later`'s answer; {}: from Redis, one by one:
        answers not asked for must not answer a later claim)."""
        self._primed = primed

    def close(self) -> None:
        """Stop the thread of `prime_later`, if it started."""
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if self._line is not None:
            self._line.close()
            self._line = None

    def _todo(self, claims: Sequence[Claim]) -> list[tuple[Claim, _Plan]]:
        """The claims that register anything, each with its plan."""
        return [(c, plan) for c in claims if (plan := self._plan(*c)) is not None]

    def _claim_args(self, todo: list[tuple[Claim, _Plan]]) -> list[object]:
        """The claim script's ARGV for `todo` (see _CLAIM_ALL)."""
        args = [a for _, plan in todo for a in (plan.digest_key, plan.key, plan.member, *plan.bands)]
        return [self.max_distance, orjson.dumps(args)]

    def _register(self, claims: Sequence[Claim]) -> Primed:
        """Register `claims` in one round trip, in order: their answers by claim."""
        todo = self._todo(claims)
        if not todo:
            return {}
        if self._claim_all is None:
            return self._register_pipelined(todo)
        args = self._claim_args(todo)
        return self._by_claim(todo, self._claim_all(args=args))

    def _by_claim(self, todo: list[tuple[Claim, _Plan]], answer: Any) -> Primed:
        """The claim script's answer to `todo`, by claim."""
        primed: Primed = {}
        nears, firsts = answer
        first_of = {int(firsts[i]): text(firsts[i + 1]) for i in range(0, len(firsts), 2)}
        for n, ((claim, _), near) in enumerate(zip(todo, text(nears), strict=True), 1):
            primed.setdefault(claim, []).append(BodyClaim(first_of.get(n), near == "1"))
        return primed

    def _register_pipelined(self, todo: list[tuple[Claim, _Plan]]) -> Primed:
        """`_register` on a Cluster, of the claims that have a plan: one pipeline of the commands they would send one
        by one, in order (every key's commands keep their order, so the answers are the same)."""
        primed: Primed = {}
        pipe = self._pipeline()
        for _, plan in todo:
            self._queue(pipe, plan)
        answers, at = pipe.execute(), 0
        for claim, plan in todo:
            n = bool(plan.digest_key) + 8 * bool(plan.member)
            primed.setdefault(claim, []).append(self._answer(answers[at : at + n], plan))
            at += n
        return primed

    def claim(self, digest: str, simhash: int, key: str) -> BodyClaim:
        """Register `key`'s body; the key first fetched with the same digest (not `key` itself) and whether a
        body within max_distance bits of `simhash` was registered under another key. One round trip when not
        primed: the claim script on a single server, a pipeline of its commands on a Cluster."""
        claim = (digest, simhash, key)
        primed = self._primed.get(claim)
        if primed:
            return primed.pop(0)
        return self._register([claim]).get(claim, [BodyClaim(None, False)])[0]

    def _plan(self, digest: str, simhash: int, key: str) -> _Plan | None:
        """The keys and member one claim touches; None when it has neither a shareable digest nor bands."""
        # A digest with braces would break the hash tag: such a digest (never one of hostring's) is not shared.
        digest = digest if digest and "{" not in digest and "}" not in digest else ""
        simhash &= _MASK
        use_bands = bool(simhash) and self.max_distance >= 0
        if not digest and not use_bands:
            return None
        own = hashlib.blake2b(key.encode(), digest_size=4).hexdigest()
        if use_bands:
            # band_key(band, (simhash >> 16 * band) & 0xFFFF) for bands 0..3, cut from one hex text of the simhash
            # (a claim's keys were a fair share of a completion's cost on the node)
            hexed, p = f"{simhash:016x}", self._band_prefixes
            member = f"{hexed}:{own}"
            bands = [f"{p[0]}{hexed[12:]}}}", f"{p[1]}{hexed[8:12]}}}", f"{p[2]}{hexed[4:8]}}}", f"{p[3]}{hexed[:4]}}}"]
        else:
            member, bands = "", ["", "", "", ""]
        return _Plan(
            self.digest_key(digest) if digest else "", key[:_KEY_LIMIT], member, bands, simhash, own,
        )  # fmt: skip

    def _queue(self, pipe: Any, plan: _Plan) -> None:
        """One claim's commands: the digest's GET-or-SET, the bands' SMEMBERS, then their SADD."""
        if plan.digest_key:
            pipe.execute_command("EVAL", _FIRST_WINS, 1, plan.digest_key, plan.key)
        if plan.member:
            for band in plan.bands:
                pipe.smembers(band)
            for band in plan.bands:
                pipe.sadd(band, plan.member)

    def _answer(self, answers: list[Any], plan: _Plan) -> BodyClaim:
        """The BodyClaim of one claim's answers: the digest's first key (when asked), then band member lists."""
        answers = list(answers)
        first: str | None = None
        if plan.digest_key:
            found = answers.pop(0)
            first = text(found) if found else None
            if first == plan.key:
                first = None
        near = False
        if plan.member:
            for bucket in answers[:4]:
                for raw in bucket:
                    other, _, who = text(raw).partition(":")
                    if who != plan.own and (int(other, 16) ^ plan.simhash).bit_count() <= self.max_distance:
                        near = True
                        break
                if near:
                    break
        return BodyClaim(first, near)

    def mirror_of(self, digest: str, key: str) -> str | None:
        """The key first fetched anywhere in the cluster with this digest, unless it is `key` (one GET)."""
        if not digest or "{" in digest or "}" in digest:
            return None
        found = self._r.get(self.digest_key(digest))
        first = text(found) if found else None
        return None if first is None or first == key[:_KEY_LIMIT] else first

    def remember(self, digest: str, simhash: int, key: str) -> None:
        """Nothing to do: the shared index already holds every body a node of the cluster registered."""
