"""Bodies fetched anywhere in a cluster (core.ports.BodyIndex on Redis): a mirror is recognised whichever node
fetched its twin.

Layout (each key its own hash tag, so a Redis Cluster spreads them over its shards):

    ns:{b:<digest>}                 string  the fetch key first fetched with this exact body (first wins: Lua)
    ns:{s:<band>:<16-bit value>}    set     members "<simhash hex>:<key hash hex>" of bodies with that band value

Cost per fetched 2xx page: 1 EVAL (GET-or-SET of the digest) plus, when the page has a simhash, 4 SMEMBERS and
4 SADD of its bands, in one round trip for a page or, primed, for a whole CompleteBatch slice; about 120 bytes
sent and, in Redis, one string (the key, at most 512 characters) and four 25-byte set members per distinct body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from frontier_node.core.ports import BodyClaim
from frontier_node.store.redis.codec import check_tag_free, text

_FIRST_WINS: Final = """
local first = redis.call('GET', KEYS[1])
if first then return first end
redis.call('SET', KEYS[1], ARGV[1])
return false
"""
_MASK: Final = (1 << 64) - 1
_KEY_LIMIT: Final = 512


class RedisBodyIndex:
    """The cluster-wide body index: exact digests first-wins, simhash bands for near duplicates."""

    def __init__(self, client: Any, namespace: str = "hostring", max_distance: int = 3) -> None:
        check_tag_free("namespace", namespace)
        self._r = client
        self._ns = namespace
        self.max_distance = max_distance
        self._primed: dict[tuple[str, int, str], list[BodyClaim]] = {}

    def digest_key(self, digest: str) -> str:
        return f"{self._ns}:{{b:{digest}}}"

    def band_key(self, band: int, value: int) -> str:
        return f"{self._ns}:{{s:{band}:{value:04x}}}"

    def prime(self, claims: Sequence[tuple[str, int, str]]) -> None:
        """Register a batch of bodies (digest, simhash, key) in one round trip, in order, keeping the answers
        for the `claim` calls that follow (the core claims one at a time). The pipeline holds the commands the
        claims would send one by one, in the same order: every key's commands keep their order, so the answers are
        those of claiming one after the other. Answers not asked for are dropped at the next prime."""
        self._primed = {}
        pipe = self._r.pipeline(transaction=False)
        queued = [(c, self._queue(pipe, *c)) for c in claims]
        if not any(parts for _, parts in queued):
            return
        answers = pipe.execute()
        at = 0
        for (digest, simhash, key), parts in queued:
            if parts is None:
                continue
            taken, at = answers[at : at + parts[0]], at + parts[0]
            answer = self._answer(taken, parts[1], parts[2], parts[3], parts[4], key)
            self._primed.setdefault((digest, simhash, key), []).append(answer)

    def claim(self, digest: str, simhash: int, key: str) -> BodyClaim:
        """Register `key`'s body; the key first fetched with the same digest (not `key` itself) and whether a
        body within max_distance bits of `simhash` was registered under another key."""
        primed = self._primed.get((digest, simhash, key))
        if primed:
            return primed.pop(0)
        pipe = self._r.pipeline(transaction=False)
        parts = self._queue(pipe, digest, simhash, key)
        if parts is None:
            return BodyClaim(None, False)
        return self._answer(pipe.execute(), *parts[1:], key)

    def _queue(self, pipe: Any, digest: str, simhash: int, key: str) -> tuple[int, bool, bool, int, str] | None:
        """Queue one claim's commands; (how many, digest used, bands used, simhash, own tag), None for none."""
        # A digest with braces would break the hash tag: such a digest (never one of hostring's) is not shared.
        digest = digest if digest and "{" not in digest and "}" not in digest else ""
        simhash &= _MASK
        own = hashlib.blake2b(key.encode(), digest_size=4).hexdigest()
        use_bands = bool(simhash) and self.max_distance >= 0
        if not digest and not use_bands:
            return None
        if digest:
            pipe.eval(_FIRST_WINS, 1, self.digest_key(digest), key[:_KEY_LIMIT])
        bands = [(simhash >> (16 * band)) & 0xFFFF for band in range(4)]
        member = f"{simhash:016x}:{own}"
        if use_bands:
            for band, value in enumerate(bands):
                pipe.smembers(self.band_key(band, value))
            for band, value in enumerate(bands):
                pipe.sadd(self.band_key(band, value), member)
        return int(bool(digest)) + 8 * use_bands, bool(digest), use_bands, simhash, own

    def _answer(self, answers: list[Any], digest: bool, use_bands: bool, simhash: int, own: str, key: str) -> BodyClaim:
        """The BodyClaim of one claim's answers (as _queue queued them)."""
        answers = list(answers)
        first: str | None = None
        if digest:
            found = answers.pop(0)
            first = text(found) if found else None
            if first == key[:_KEY_LIMIT]:
                first = None
        near = False
        if use_bands:
            for bucket in answers[:4]:
                for raw in bucket:
                    other, _, who = text(raw).partition(":")
                    if who != own and (int(other, 16) ^ simhash).bit_count() <= self.max_distance:
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
