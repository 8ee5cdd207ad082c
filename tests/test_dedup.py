"""Seen-set and body index against plain Python sets and brute force."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_node.core.dedup import BodyIndex, SeenSet, key_hash


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
        index.add(f"k{i}", "", h)
    found = index.near(probe)
    brute = [h for h in stored if (h ^ probe).bit_count() <= 3]
    assert (found is not None) == bool(brute)


def test_exact_digest_names_the_first_key() -> None:
    index = BodyIndex()
    index.add("a", "sha256:1", 0)
    index.add("b", "sha256:1", 0)
    assert index.seen_digest("sha256:1") == "a"
    assert index.seen_digest("sha256:2") is None
    near = 0b1011 << 40
    index.add("c", "", near)
    assert index.near(near ^ 0b111) == "c"
    assert index.near(near ^ 0b1111) is None
