"""Seen-set and body index against plain Python sets and brute force."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_node.core.dedup import BodyIndex, FingerprintMap, SeenSet, body_name, key_hash


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 2**64 - 1), max_size=3000), st.lists(st.integers(1, 2**64 - 1), max_size=300))
def test_seen_set_is_an_exact_set(added: list[int], probes: list[int]) -> None:
    seen, oracle = SeenSet(capacity=16), set()
    for h in added:
        assert seen.add(h) == (h not in oracle)
        oracle.add(h)
    assert len(seen) == len(oracle)
    for h in added + probes:
        assert (h in seen) == (h in oracle)


def test_seen_set_stays_between_10_and_16_bytes_per_key_as_it_grows() -> None:
    seen = SeenSet(capacity=16)
    rng = random.Random(7)
    worst = 0.0
    for n in range(1, 200_001):
        seen.add(rng.getrandbits(64) | 1)
        if n >= 1000 and n % 997 == 0:
            worst = max(worst, seen.nbytes / len(seen))
    assert 0 < worst < 16


def test_key_hash_is_stable_and_never_zero() -> None:
    assert key_hash("http://a.example/") == key_hash("http://a.example/")
    assert key_hash("http://a.example/") != key_hash("http://b.example/")
    assert all(key_hash(f"http://h{i}.example/") != 0 for i in range(1000))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 2**64 - 1), min_size=1, max_size=60), st.integers(1, 2**64 - 1))
def test_near_duplicates_match_brute_force(stored: list[int], probe: int) -> None:
    index = BodyIndex(max_distance=3)
    for i, h in enumerate(stored):
        index.remember("", h, f"k{i}")
    found = index.near(probe)
    brute = [h for h in stored if (h ^ probe).bit_count() <= 3]
    assert (found is not None) == bool(brute)


def test_exact_digest_names_the_first_key() -> None:
    index = BodyIndex()
    index.remember("sha256:1", 0, "a")
    index.remember("sha256:1", 0, "b")
    assert index.seen_digest("sha256:1") == body_name(key_hash("a"))
    assert index.seen_digest("sha256:2") is None
    near = 0b1011 << 40
    index.remember("", near, "c")
    assert index.near(near ^ 0b111) == body_name(key_hash("c"))
    assert index.near(near ^ 0b1111) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=3000))
def test_fingerprint_map_is_a_first_wins_dict_as_it_grows(pairs: list[tuple[int, int]]) -> None:
    fmap, oracle = FingerprintMap(capacity=4), {}
    for h, v in pairs:
        assert fmap.setdefault(h, v) == oracle.setdefault(h, v)
    assert len(fmap) == len(oracle)
    for h, _ in pairs:
        assert fmap.get(h) == oracle[h]
    assert fmap.get(0xDEAD_BEEF) == oracle.get(0xDEAD_BEEF)


def test_fingerprint_map_stays_between_20_and_31_bytes_per_entry_as_it_grows() -> None:
    fmap = FingerprintMap(capacity=16)
    rng = random.Random(3)
    worst = 0.0
    for n in range(1, 100_001):
        fmap.setdefault(rng.getrandbits(64) | 1, n)
        if n >= 1000 and n % 997 == 0:
            worst = max(worst, fmap.nbytes / len(fmap))
    assert 20 < worst < 31


_SIMHASHES = st.sampled_from([0, 0b1011 << 40, (0b1011 << 40) ^ 0b11, (0b1011 << 40) ^ 0b1111, 2**64 - 1, 12345])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["", "d1", "d2", "d3"]), _SIMHASHES), max_size=60))
def test_claims_match_a_brute_force_oracle(claims: list[tuple[int, str, int]]) -> None:
    """claim() against a list of every body claimed so far: first by digest, near by any other key's simhash."""
    index = BodyIndex(max_distance=3)
    past: list[tuple[str, str, int]] = []
    for k, digest, simhash in claims:
        key = f"http://a.example/{k}"
        got = index.claim(digest, simhash, key)
        firsts = [owner for owner, d, _ in past if digest and d == digest]
        first = firsts[0] if firsts else key
        assert got.first == (None if first == key else body_name(key_hash(first)))
        near = any(owner != key and s and simhash and (s ^ simhash).bit_count() <= 3 for owner, _, s in past)
        assert got.near == near
        assert index.mirror_of(digest, key) == got.first if digest else index.mirror_of(digest, key) is None
        past.append((key, digest, simhash))


def test_body_index_keeps_about_60_bytes_per_body() -> None:
    index = BodyIndex()
    rng = random.Random(5)
    n = 200_000
    for i in range(n):
        index.claim(f"sha256:{rng.getrandbits(256):064x}", rng.getrandbits(64) | 1, f"http://h{i % 100}.example/{i}")
    assert len(index) == n
    assert index.nbytes / n < 80
