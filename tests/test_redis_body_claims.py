"""The cluster's body index on one Redis server (RedisBodyIndex's batch claim script), against a brute-force oracle
and against the script of the previous version. Real redis-server; the Cluster's pipelined claims are in
test_store_redis.py."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import orjson
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontier_node.core.ports import BodyClaim, Claim
from frontier_node.store.redis.bodies import RedisBodyIndex
from frontier_node.store.redis.codec import text
from tests.store_helpers import prime

_MASK = (1 << 64) - 1
_PREVIOUS = Path(__file__).parent / "data" / "redis_claim_all_89d7bd7.lua"


def primed_answers(index: RedisBodyIndex, claims: list[Claim]) -> list[BodyClaim]:
    """Register `claims` as a CompleteBatch slice does, then answer each claim from the registration."""
    prime(index, claims)
    try:
        return [index.claim(*c) for c in claims]
    finally:
        index.use_primed({})


def previous_answers(client: redis.Redis, index: RedisBodyIndex, claims: list[Claim]) -> list[BodyClaim]:
    """What the previous version's script registers and answers for `claims`, called as that version called it: the
    members of the 4 bands sent back, judged here."""
    script = client.register_script(_PREVIOUS.read_text())
    plans = [index._plan(*c) for c in claims]
    todo = [p for p in plans if p is not None]
    args = [a for p in todo for a in (p.digest_key, p.key, p.member, *p.bands)]
    found = iter(orjson.loads(script(args=[orjson.dumps(args)])) if todo else [])
    out = []
    for plan in plans:
        if plan is None:
            out.append(BodyClaim(None, False))
            continue
        first, seen = next(found)
        out.append(index._answer(([first or None] if plan.digest_key else []) + [seen], plan))
    return out


def dumps(client: redis.Redis, ns: str) -> dict[str, bytes]:
    names = sorted(text(k).removeprefix(ns) for k in client.scan_iter(match=f"{ns}:*"))
    return {n: client.dump(ns + n) or b"" for n in names}


def test_claims_register_and_answer_as_the_previous_version_did(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    """The current script leaves every key as the previous one did and gives the same answers, on claims that take
    every branch: first wins, a key's own body again, near in one half of the simhash or across both (the 32-bit
    halves' top bits included), too far by one bit, no digest, no simhash, a digest that is not shared."""
    base = 0x8000_0001_8000_0001
    claims: list[Claim] = [
        ("sha256:aa", base, "https://a.org/1"),
        ("sha256:aa", 0x1234_5678_9ABC_DEF0, "https://b.org/1"),  # a.org/1's exact body
        ("sha256:aa", base, "https://a.org/1"),  # a.org/1 again: not its own duplicate nor near itself
        ("sha256:bb", base ^ (1 << 63) ^ (1 << 31) ^ 1, "https://c.org/1"),  # 3 bits, both halves' top bits: near
        ("sha256:cc", base ^ 0b1111, "https://d.org/1"),  # 4 bits in one band: not near (max_distance 3)
        ("", base ^ (1 << 40), "https://e.org/1"),  # no digest: bands only, near
        ("sha256:dd", 0, "https://f.org/1"),  # no simhash: digest only
        ("sha{1}", 0, "https://g.org/1"),  # a digest with braces is not shared, and no simhash: nothing
        ("sha256:ee", 2**64 + 7, "https://h.org/1"),  # beyond 64 bits: masked
        ("sha256:ee", 7, "https://h.org/" + "x" * 600),  # a key cut at 512 characters: h.org/1's body, near it
    ]
    answers, stored = {}, {}
    for version in ("previous", "current"):
        ns = f"{redis_namespace}-{version}"
        index = RedisBodyIndex(redis_client, ns)
        answers[version] = (
            previous_answers(redis_client, index, claims[:4]) + previous_answers(redis_client, index, claims[4:])
            if version == "previous"
            else primed_answers(index, claims[:4]) + primed_answers(index, claims[4:])
        )
        stored[version] = dumps(redis_client, ns)
    assert answers["current"] == answers["previous"]
    first = [a.first for a in answers["current"]]
    assert first == [None, "https://a.org/1", None, None, None, None, None, None, None, "https://h.org/1"]
    near = [a.near for a in answers["current"]]
    assert near == [False, False, False, True, False, True, False, False, False, True]  # the last: h.org/1's simhash
    assert stored["current"] == stored["previous"] and len(stored["current"]) == 5 + 15  # digests, band values


def _near_oracle(earlier: list[tuple[int, str]], simhash: int, key: str, max_distance: int) -> bool:
    """Near as the index defines it, by brute force: a body registered before under another key that shares one of
    the 4 16-bit bands with `simhash` and differs from it in at most max_distance bits."""
    own = hashlib.blake2b(key.encode(), digest_size=4).digest()
    for other, other_key in earlier:
        if hashlib.blake2b(other_key.encode(), digest_size=4).digest() == own:
            continue
        shares = any((other >> s) & 0xFFFF == (simhash >> s) & 0xFFFF for s in (0, 16, 32, 48))
        if shares and (other ^ simhash).bit_count() <= max_distance:
            return True
    return False


_BASES = (0x0123_4567_89AB_CDEF, 0xFFFF_FFFF_0000_0000, 0x8000_8000_8000_8000)
_claim = st.tuples(
    st.sampled_from(["sha256:a", "sha256:b", "", "x{y}"]),
    st.sampled_from(_BASES),
    st.lists(st.integers(0, 63), max_size=6),  # bits flipped in the base simhash
    st.booleans(),  # no simhash at all
    st.sampled_from(["https://a.org/", "https://b.org/", "https://c.org/x"]),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(_claim, min_size=1, max_size=8), min_size=1, max_size=3),
       max_distance=st.sampled_from([-1, 0, 3, 7]))  # fmt: skip
def test_primed_claims_answer_as_a_brute_force_oracle(
    redis_client: redis.Redis, redis_namespace: str, batches: list[list[tuple[str, int, list[int], bool, str]]],
    max_distance: int,
) -> None:  # fmt: skip
    """Batches of claims registered by the script answer, claim by claim, what a brute-force pass over every body
    registered before says: the first key of the same digest (not the claim's own), and near or not."""
    index = RedisBodyIndex(redis_client, f"{redis_namespace}-{uuid.uuid4().hex[:8]}", max_distance=max_distance)
    firsts: dict[str, str] = {}
    earlier: list[tuple[int, str]] = []
    for batch in batches:
        claims: list[Claim] = []
        expected: list[BodyClaim] = []
        for digest, base, flips, no_simhash, key in batch:
            simhash = 0
            if not no_simhash:
                simhash = base
                for bit in flips:
                    simhash ^= 1 << bit
            claims.append((digest, simhash, key))
            shared = "{" not in digest and digest != ""
            first = firsts.setdefault(digest, key) if shared else None
            bands = simhash != 0 and max_distance >= 0
            expected.append(
                BodyClaim(first if first != key else None, bands and _near_oracle(earlier, simhash, key, max_distance))
            )
            if bands:
                earlier.append((simhash, key))
        assert primed_answers(index, claims) == expected
